"""The key-sequence fuzzer's harness: the demo console (the simulator behind it) driven through Textual's Pilot
by sequences of keys drawn from every binding of every screen and modal, text typed into filters and inputs, and
terminal resizes; after each sequence, the console's invariants.

One console serves every sequence (its start-up, a simulated cluster's nodes and the app, costs more than a
hundred sequences): it runs on an event loop of its own, entered for each sequence with run_until_complete, and is
brought back to the dashboard at its start size between sequences.

Invariants checked after each sequence (`Fuzz.check`):
- the console still runs (no exit, no return code);
- no exception: none the app caught as fatal, none in a worker, none logged at ERROR;
- the focused widget, if any, is on the screen shown, displayed, and inside the terminal;
- no node-changing action ran without a confirmation. A confirmation answered yes is counted and its action is
  NOT run (a fuzzer pressing `y` would otherwise launch recipes and run guard fixes); every path that changes a
  node (the audit log, the recipe runner, a command run on a node) is watched, and any call of one is a failure;
- what the screen shows (issue 39): a recorded moment on screen ([ pressed) shows REPLAY and its time; and after
  the sequence, Escape (then 1 for the dashboard, where another screen keeps the keys) shows every node's panel
  on the terminal, its name on screen. Once per console, the palette finds every key's action by the words the
  key bar shows for it (`palette_check`).

`q`, ctrl+q and the palette's Quit are drawn too: the app's quit is replaced by a counter, so they are pressed
without ending the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import re
import tempfile
from dataclasses import dataclass, field

from hypothesis import strategies as st
from textual._wait import wait_for_idle as _idle
from textual.binding import Binding

QUIT_ACTIONS = {"quit"}
# Keys no binding of ours names but every screen answers: focus moves, lists, inputs.
FOCUS_KEYS = ("tab", "shift+tab", "up", "down", "enter", "escape")
WIDGET_KEYS = ("left", "right", "pageup", "pagedown", "home", "end", "backspace", "space", "ctrl+u")
# What an operator types into the node and recipe filters, the log search, the sweep's levels and the palette.
TEXTS = ("zzz", "tiny", "spark", "spark2", "gpt", "1,4", "0", "-1", "abc", "Show bench", "restart", "x,y")
SIZES = ((80, 24), (240, 70))
START_SIZE = (100, 30)
IDLE_CAP_S = 0.05


def binding_keys() -> tuple[list[str], list[str]]:
    """(the console's keys, the widgets' keys): every key bound on the app, its screens, modals and node panel,
    with focus moves, Enter and Escape; then every key Textual's own widgets bind (the inputs' editing keys, the
    lists', the log's, the palette's). A binding's comma-separated keys count apart."""
    from textual.command import CommandPalette
    from textual.widgets import Input, OptionList, RichLog

    from sparkconsole.tui.app import SparkConsoleApp
    from sparkconsole.tui.screens.bench import BenchScreen
    from sparkconsole.tui.screens.bench_setup import BenchSetupScreen
    from sparkconsole.tui.screens.confirm import ConfirmScreen
    from sparkconsole.tui.screens.dashboard import DashboardScreen
    from sparkconsole.tui.screens.help import HelpScreen
    from sparkconsole.tui.screens.logs import LogsScreen
    from sparkconsole.tui.screens.recipes import RecipesScreen
    from sparkconsole.tui.widgets.node_panel import NodePanel

    def keys_of(*classes) -> dict[str, None]:
        out: dict[str, None] = {}
        for cls in classes:
            for b in cls.BINDINGS:
                for k in (b.key if isinstance(b, Binding) else b[0]).split(","):
                    out[k.strip()] = None
        return out
    console = keys_of(SparkConsoleApp, DashboardScreen, NodePanel, RecipesScreen, BenchScreen, LogsScreen, HelpScreen,
                      ConfirmScreen, BenchSetupScreen)
    console.update(dict.fromkeys(FOCUS_KEYS))
    widgets = keys_of(CommandPalette, Input, OptionList, RichLog)
    widgets.update(dict.fromkeys(WIDGET_KEYS))
    return sorted(console), sorted(k for k in widgets if k not in console)


@dataclass(frozen=True)
class Step:
    kind: str          # key | text | filter (/ then the text) | resize
    value: object

    def __repr__(self) -> str:
        return f"{self.kind}:{self.value}" if self.kind != "resize" else f"resize:{self.value[0]}x{self.value[1]}"


def steps(keys: tuple[list[str], list[str]]) -> st.SearchStrategy[Step]:
    console, widgets = keys
    key = st.sampled_from(console).map(lambda k: Step("key", k))
    return st.one_of(   # the console's own keys three times as often as the widgets' editing keys
        key, key, key,
        st.sampled_from(FOCUS_KEYS).map(lambda k: Step("key", k)),
        st.sampled_from(widgets).map(lambda k: Step("key", k)),
        st.sampled_from(TEXTS).map(lambda t: Step("text", t)),
        st.sampled_from(TEXTS).map(lambda t: Step("filter", t)),       # / then the text: a filter or search
        st.tuples(st.integers(SIZES[0][0], SIZES[1][0]), st.integers(SIZES[0][1], SIZES[1][1])).map(
            lambda wh: Step("resize", wh)),
    )


def sequences(keys: tuple[list[str], list[str]], max_size: int = 12) -> st.SearchStrategy[list[Step]]:
    return st.lists(steps(keys), min_size=1, max_size=max_size)


class _Errors(logging.Handler):
    def __init__(self, sink: list) -> None:
        super().__init__(logging.ERROR)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(f"logged: {record.getMessage()[:300]}")


@dataclass
class Fuzz:
    """The demo console under the fuzzer, with its watches."""
    loop: asyncio.AbstractEventLoop
    app: object = None
    pilot: object = None
    sim: object = None
    errors: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)      # node-changing calls (each one a failure)
    confirmed: int = 0                                      # confirmations answered yes (their actions not run)
    quits: int = 0
    sequences: int = 0
    keys: int = 0
    _driver: asyncio.Task | None = None
    _queue: asyncio.Queue | None = None
    _ready: asyncio.Future | None = None
    _tasks: list = field(default_factory=list)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    # --- set-up ------------------------------------------------------------------------------------------------
    def start(self, topology: str = "none") -> Fuzz:
        self._stack.enter_context(self._patches())
        self._queue = asyncio.Queue()
        self._ready = self.loop.create_future()
        self._driver = self.loop.create_task(self._start(topology))
        self.run(asyncio.wait({self._driver, self._ready}, return_when=asyncio.FIRST_COMPLETED))
        if self._driver.done():
            self._driver.result()            # it failed to start: its error
        return self

    @contextlib.contextmanager
    def _patches(self):
        import pytest
        from textual.worker import Worker, WorkerState

        from sparkconsole import audit
        from sparkconsole.launch.runner import Runner
        from sparkconsole.tui.node_actions import NodeActions

        fuzz = self
        with pytest.MonkeyPatch.context() as mp:
            state = tempfile.mkdtemp(prefix="sparkconsole-fuzz-")
            mp.setenv("SPARKCONSOLE_STATE_DIR", os.path.join(state, "state"))
            mp.chdir(state)                       # the palette's screenshot and runs/ land here

            # Textual's "idle" is the process spending under 5% CPU for 20 ms, for up to a second: with the demo's
            # agents streaming that second is waited after nearly every key. Keys are still processed in full (the
            # pilot waits for every widget's message queue); only that wait is capped, and the check waits in full.
            import textual.app
            import textual.pilot
            mp.setattr(textual.app, "wait_for_idle", functools.partial(_idle, max_sleep=IDLE_CAP_S))
            mp.setattr(textual.pilot, "wait_for_idle", functools.partial(_idle, max_sleep=IDLE_CAP_S))

            original_run = Worker._run

            async def watched_run(worker, app):
                await original_run(worker, app)
                if worker.state == WorkerState.ERROR:
                    fuzz.errors.append(f"worker {worker.name!r}: {worker.error!r}")
            mp.setattr(Worker, "_run", watched_run)

            def change(what):
                def sink(*args, **kwargs):
                    fuzz.changes.append(f"{what}{args[1:3]!r}")
                    raise RuntimeError(f"fuzz: {what} reached without a confirmation")
                return sink
            mp.setattr(audit, "record", lambda *a, **k: fuzz.changes.append(f"audit.record{a!r}"))
            for name in ("launch", "stop", "restart"):
                mp.setattr(Runner, name, change(f"Runner.{name}"))
            mp.setattr(NodeActions, "run_on_node", change("run_on_node"))

            original_confirm = NodeActions.confirm

            def confirm(app, title, command, then, detail=""):
                def answered_yes():
                    fuzz.confirmed += 1

                    async def not_run() -> None:     # the confirmed action: counted, never run
                        return None
                    return not_run()
                return original_confirm(app, title, command, answered_yes, detail)
            mp.setattr(NodeActions, "confirm", confirm)
            handler = _Errors(self.errors)
            logging.getLogger().addHandler(handler)
            try:
                yield
            finally:
                logging.getLogger().removeHandler(handler)

    async def _start(self, topology: str) -> None:
        """Runs as one task for the whole fuzz (Textual keeps the app in that task's context variables): starts the
        demo console, then plays each sequence handed over on the queue."""
        from sparkconsole.commands import demo
        from sparkconsole.sim.cluster import SimCluster

        self.sim = SimCluster(serving=demo.demo_serving(topology),
                              load_speedup=demo.DEMO_LOAD_SPEEDUP)
        await self.sim.start_nodes()
        self.app = demo.console_app(self.sim, argparse.Namespace(load=0, duration=None), self._tasks)

        async def quit_counted() -> None:
            self.quits += 1
        self.app.action_quit = quit_counted
        async with self.app.run_test(size=START_SIZE) as pilot:
            self.pilot = pilot
            deadline = self.loop.time() + 60
            while not (self.app.dashboard.complete() and self.app.monitor is not None
                       and all(nm.last for nm in self.app.monitor.nodes.values())):
                assert self.loop.time() < deadline, "the demo console did not come up"
                await pilot.pause(0.05)
            if topology != "none":
                while not all(e.is_set() for e in self.sim.ready.values()):
                    assert self.loop.time() < deadline + 120, "the demo did not serve"
                    await pilot.pause(0.1)
            self._ready.set_result(None)
            while True:
                seq, done = await self._queue.get()
                if seq is None:
                    break
                try:
                    await self._play(seq)
                    done.set_result(None)
                except BaseException as exc:     # noqa: BLE001 — handed to the hypothesis side, which raises it
                    done.set_exception(exc)

    def stop(self) -> None:
        try:
            if self._driver is not None and not self._driver.done():
                self._queue.put_nowait((None, None))
                self.run(self._driver)
        finally:
            for t in self._tasks:
                t.cancel()
            self.run(asyncio.gather(*self._tasks, return_exceptions=True))
            if self.sim is not None:
                self.run(self.sim.stop())
            self._stack.close()

    # --- one sequence -----------------------------------------------------------------------------------------
    def play(self, seq: list[Step]) -> None:
        done = self.loop.create_future()
        self._queue.put_nowait((seq, done))
        self.run(asyncio.wait({done, self._driver}, return_when=asyncio.FIRST_COMPLETED))
        self.sequences += 1
        if not done.done():
            raise AssertionError(f"the console's task ended during {seq!r}: {self._driver!r}")
        done.result()

    async def _play(self, seq: list[Step]) -> None:
        await self._reset()
        before = (len(self.errors), len(self.changes))
        for step in seq:
            if step.kind == "key":
                await self.pilot.press(step.value)
                self.keys += 1
            elif step.kind in ("text", "filter"):
                keys = (["slash"] if step.kind == "filter" else []) + [" " if c == " " else c for c in step.value]
                await self.pilot.press(*("space" if k == " " else k for k in keys))
                self.keys += len(keys)
            else:
                await self.pilot.resize_terminal(*step.value)
            if not self.app.is_running:
                break
        await _idle(0, 0.5)
        self.check(seq, before)
        self.check_replay_time(seq)
        await self.back_to_the_nodes()
        self.check_nodes_visible(seq)

    async def _reset(self) -> None:
        """Back to the dashboard at the start size, no modal open, no filter, the first node focused: each sequence
        from one place."""
        app = self.app
        bench = app._bench_screen
        if bench is not None and bench.sweep_worker is not None and bench.sweep_worker.is_running:
            bench.sweep_worker.cancel()      # a sweep `b` + Enter started: load on the simulator, not a node change
        while len(app.screen_stack) > 1:
            app.pop_screen()
            await self.pilot.pause()
        if app.current_mode != "dashboard":
            await app.switch_mode("dashboard")
        if app._scrub_back:
            await app.action_scrub(app._scrub_back)          # live again
        if app.size != START_SIZE:
            await self.pilot.resize_terminal(*START_SIZE)
        app.dashboard.action_clear_filter()
        next(iter(app.dashboard.panels.values())).focus()      # the focus the console starts with
        await self.pilot.pause()

    def check_replay_time(self, seq: list[Step]) -> None:
        check_replay_time_of(self.app, f"after {seq!r}")

    async def back_to_the_nodes(self) -> None:
        await nodes_back(self.pilot, self.app)

    def check_nodes_visible(self, seq: list[Step]) -> None:
        problem = nodes_visible_problem(self.app)
        assert problem is None, f"after {seq!r} and Escape: {problem}"

    def palette_check(self) -> list[str]:
        return palette_misses(self.app)

    def check(self, seq: list[Step], before: tuple[int, int]) -> None:
        app = self.app
        where = f"after {seq!r}"
        assert app.is_running and app.return_code is None, f"the console exited ({app.return_code}) {where}"
        assert app._exception is None, f"{app._exception!r} {where}"
        assert len(self.errors) == before[0], f"{self.errors[before[0]:]} {where}"
        assert len(self.changes) == before[1], f"node changed without a confirmation: {self.changes[before[1]:]} {where}"
        doubled = [e for e in app.dashboard.events.history if SOURCE_TWICE.match(e)]
        assert not doubled, f"an event line names its source twice: {doubled[:2]} {where}"
        focused = app.focused
        if focused is not None:
            screen = app.screen
            assert focused.screen is screen, f"{focused!r} has the focus but is not on the screen shown {where}"
            assert all(w.display for w in focused.ancestors_with_self if hasattr(w, "display")), \
                f"{focused!r} has the focus but is hidden {where}"
            from textual.errors import NoWidget
            try:
                region = screen.find_widget(focused).region
            except NoWidget:
                raise AssertionError(f"{focused!r} has the focus but was not laid out on the screen {where}") from None
            assert region.area > 0 and region.overlaps(screen.region), \
                f"{focused!r} has the focus at {region}, outside the terminal {screen.region} {where}"


REPLAY_TIME = re.compile(r"REPLAY \d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
# An alert's line in the events pane, its source named again after itself ("router: router: 1 of 2 backends down")
SOURCE_TWICE = re.compile(r"^\d\d:\d\d:\d\d (?:INFO|WARN|BAD|CLEAR)\s+(.+?): (?:cleared: )?\1[: ]")
# Where the palette's entries stand for a binding (tui/palette.py, Command.action): owner of the binding → prefix.
OWNERS = {"SparkConsoleApp": "app", "DashboardScreen": "dashboard", "NodePanel": "node", "RecipesScreen": "recipes",
          "BenchScreen": "bench", "LogsScreen": "logs"}


def _screen_text(app) -> str:
    from tests.screen import screen_text
    return screen_text(app)


def check_replay_time_of(app, where: str) -> None:
    if app.replay_at is None or app.monitor is None or not any(nm.last for nm in app.monitor.nodes.values()):
        return
    text = _screen_text(app)
    if app.screen is app.dashboard or app.screen.id in ("recipes", "bench", "logs"):
        assert REPLAY_TIME.search(text), f"a recorded moment on screen without its time {where}:\n{text}"


def palette_misses(app) -> list[str]:
    """Every key on a key bar (a binding shown, of the app, its screens and the node panel) whose words the palette
    does not find for its action: [] when the palette is every action."""
    from textual.fuzzy import Matcher

    from sparkconsole.tui.app import SparkConsoleApp
    from sparkconsole.tui.screens.bench import BenchScreen
    from sparkconsole.tui.screens.dashboard import DashboardScreen
    from sparkconsole.tui.screens.logs import LogsScreen
    from sparkconsole.tui.screens.recipes import RecipesScreen
    from sparkconsole.tui.widgets.node_panel import NodePanel
    cmds = app.palette_commands()
    missed = []
    for cls in (SparkConsoleApp, DashboardScreen, NodePanel, RecipesScreen, BenchScreen, LogsScreen):
        for b in cls.BINDINGS:
            if not isinstance(b, Binding) or not b.show or b.action == "command_palette":
                continue
            action = f"{OWNERS[cls.__name__]}.{b.action.split('(', 1)[0]}"
            words = Matcher(b.description)
            if not any(c.action == action and b.description.lower() in c.title.lower() and words.match(c.title) > 0
                       for c in cmds):
                missed.append(f"{b.key} {b.description!r} ({action})")
    return missed


async def nodes_back(pilot, app) -> None:
    """Escape, as an operator presses it to get back: modals, filters and the Events pane close; from another
    screen, 1 goes to the dashboard (after Escape, so it is not typed into a filter); Escape once more there."""
    for _ in range(3):
        if len(app.screen_stack) == 1 and app.current_mode == "dashboard" and not app.dashboard.events_only:
            break
        await pilot.press("escape")
    if app.current_mode != "dashboard" and len(app.screen_stack) == 1:
        await pilot.press("1")
    await pilot.press("escape")
    await _idle(0, 0.5)


def nodes_visible_problem(app) -> str | None:
    """None when every node's panel is drawn on the dashboard with its name on screen; else what is wrong."""
    if app.screen is not app.dashboard:
        return f"not on the dashboard but {app.screen!r}"
    drawn = app.dashboard.drawn()
    text = _screen_text(app)
    for name, panel in app.dashboard.panels.items():
        if not panel.display or panel not in drawn:
            return f"{name}'s panel is not on the terminal"
        if name not in text:
            return f"{name} is not on screen"
    return None
