"""The console app: wires the monitors the layers below publish to the screens, and the keys to their actions.

The app starts the ClusterMonitor it is given (or builds one from the cluster) and the serving monitor for the
cluster's endpoints, and stops both when it quits: remote agents end and connections close. Node updates only
mark a panel dirty; a timer redraws dirty panels a few times a second, so a burst of ticks costs one frame.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from textual import events
from textual.app import App
from textual.binding import Binding

from ..config import ClusterConfig
from ..nodes.launches import launch_groups, served_endpoints
from .heap import TICK_S, HeapKeeper
from .node_actions import NodeActions
from .palette import ConsoleCommands
from .screens.dashboard import DashboardScreen
from .screens.help import HelpScreen

if TYPE_CHECKING:        # imported for real off the event loop, once the first frame is up (_import_layers)
    from ..alerts import AlertEngine
    from ..nodes.monitor import ClusterMonitor
    from ..serving.endpoint import ServingMonitor

REDRAW_HZ = 4.0
FIRST_FRAME_REFRESHES = 20
AGE_REFRESH_S = 1.0     # a node that stopped ticking still gets redrawn: its age and STALE / DOWN move on
# Read-only (`sparkconsole serve --read-only`, which starts this app in a child process and says so here): every
# node-changing action (restart, stop, launch, guard fixes) is hidden, and refused should one be reached anyway.
READ_ONLY_ENV = "SPARKCONSOLE_READ_ONLY"


def _import_layers(serving: bool) -> None:
    """Runs in a thread: the modules the monitors need, imported while the event loop keeps drawing."""
    import importlib
    importlib.import_module("sparkconsole.nodes.monitor")
    if serving:
        importlib.import_module("sparkconsole.serving.endpoint")


class SparkConsoleApp(NodeActions, App):
    CSS_PATH = "app.tcss"
    TITLE = "sparkconsole"
    COMMANDS = App.COMMANDS | {ConsoleCommands}
    BINDINGS = [
        Binding("1", "show('dashboard')", "Dashboard"),
        Binding("2", "show('recipes')", "Recipes"),
        Binding("3", "show('bench')", "Bench"),
        Binding("4", "show('logs')", "Logs"),
        Binding("question_mark", "help", "Help"),
        Binding("colon", "command_palette", "Commands", show=False),   # not priority: ':' still types in inputs
        Binding("ctrl+p", "command_palette", "Commands", show=False, priority=True),
        Binding("q", "quit", "Quit"),
        Binding("left_square_bracket", "scrub(-5)", "Back 5 min", show=False),
        Binding("right_square_bracket", "scrub(5)", "Forward 5 min", show=False),
    ]
    SCRUB_MAX_MIN = 60
    # The dashboard is the screen the app starts on, as a minimal app's default screen: started as a mode of its own,
    # Textual re-parses every stylesheet and restyles the whole app twice first (~40 ms of the first frame).
    DEFAULT_MODE = "dashboard"

    def __init__(self, cluster: ClusterConfig, *, monitor: ClusterMonitor | None = None, simulated: bool = False,
                 serving: ServingMonitor | None = None, alerts: AlertEngine | None = None,
                 monitor_factory: Callable[[ClusterConfig], ClusterMonitor] | None = None,
                 read_only: bool | None = None, serving_factory: Callable[[ClusterConfig], ServingMonitor] | None = None,
                 replay_at: float | None = None, record: bool = False, notice: str | None = None) -> None:
        """monitor: a ClusterMonitor to draw (started and stopped by the app); or monitor_factory(cluster),
        called once the first frame is up (the SSH stack's import costs more than the first frame).
        serving_factory(cluster): likewise for the ServingMonitor of the cluster's endpoints.
        notice: one line shown at start (where the cluster came from, clusterfile.py)."""
        super().__init__()
        self.cluster = cluster
        self.monitor = monitor
        self._monitor_factory = monitor_factory
        self._serving_factory = serving_factory
        self.serving = serving
        self.alerts = alerts
        self.simulated = simulated or cluster.simulated
        self.read_only = os.environ.get(READ_ONLY_ENV) == "1" if read_only is None else read_only
        self.replay_at = replay_at          # flight-recorder replay (console --at): labelled REPLAY with its time
        self.record = record and replay_at is None
        self.notice = notice
        self.recorder = None
        self.notifier = None
        self._live_monitor = None           # while scrubbing back ([ / ]): the live monitor, still watching
        self._scrub_back = 0                # minutes
        self._scrub_unsub = None
        self.sub_title = self._title()
        self.dashboard = DashboardScreen()
        self._recipes_screen = None
        self._logs_screen = None
        self._bench_screen = None
        for mode, make in (("recipes", lambda: self.recipes_screen), ("bench", lambda: self.bench_screen),
                           ("logs", lambda: self.logs_screen)):
            self.add_mode(mode, make)   # one instance per mode: the app feeds it
        self._dirty: set[str] = set()
        self._order = {n.name: i for i, n in enumerate(cluster.nodes)}
        self._dirty_eps: set[str] = set()
        self._launches_shown: tuple = ()    # the launches last drawn: the recipes screen is told of changes
        # (node, container) -> its stage while a restart from this console runs (the launch bar shows it)
        self.restart_stages: dict[tuple[str, str], str] = {}
        self._wanted_eps: tuple = ()        # the endpoints to poll: the cluster file's, moved where launches serve
        self._follow_lock = asyncio.Lock()
        self._shown: set[str] = set()      # nodes whose first reading has been drawn
        self._unsubscribe: list[Callable[[], None]] = []
        self._last_age_refresh = 0.0
        self._stopped = False
        self.first_frame_at: float | None = None
        self.heap = HeapKeeper()

    def _title(self, t: float | None = None) -> str:
        replay = f"REPLAY {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t or self.replay_at))} · " \
            if self.replay_at is not None else ""
        return replay + ("SIMULATED · " if self.simulated else "") + ("READ-ONLY · " if self.read_only else "") \
            + self.cluster.source

    def _start_guard(self) -> None:
        """Flight recorder, exhaustion warning + opt-in guard, notifications, post-mortems (all below the TUI)."""
        from ..notify.notifier import Notifier
        from ..protect import Guardian
        from ..recorder.feed import Recorder
        from ..recorder.postmortem import one_line
        colour = {"bad": "red", "warn": "yellow"}
        def say(text: str, sev: str = "info") -> None:
            if not self._drawing():
                return
            self.dashboard.events.note(text, colour.get(sev, "cyan"))
            if sev in ("warn", "bad"):
                self.notify(text, severity="error" if sev == "bad" else "warning", timeout=10)
        if self.record:
            try:
                self.recorder = Recorder.open(self.cluster, on_status=say)    # its file's faults, said here
            except Exception as exc:    # a disk problem must not take the console down: say it, run without
                self.notify(f"flight recorder off: {' '.join(str(exc).split())[:200]}", severity="warning")
        if self.recorder is not None:
            self.recorder.attach(self.monitor)
            self.recorder.attach_alerts(self.alerts)
            if self.serving is not None:
                self.recorder.attach_serving(self.serving)
            self.recorder.on_postmortem = lambda pm: (
                say(f"{one_line(pm)} · the whole of it: sparkconsole postmortem {pm['node']}", "bad"),
                self._show_postmortem(pm))
        guardian = Guardian(self.cluster, self.alerts, recorder=self.recorder, say=say,
                            replay=self.replay_at is not None)
        self._unsubscribe.append(self.monitor.subscribe(guardian.on_node))
        self.notifier = Notifier(self.cluster.notify, bell=self.bell, cluster=self.cluster.source)
        self._unsubscribe.append(self.alerts.subscribe(self.notifier.submit))

    def _say_notes(self, mon) -> None:
        """A replay's notes (recorder/replay.py: the unreadable parts of a damaged recorder file), said on screen."""
        for note in getattr(mon, "notes", ()):
            self.dashboard.events.note(note, "yellow")
            self.notify(note, severity="warning", timeout=15)

    def _show_postmortem(self, pm: dict) -> None:
        panel = self.dashboard.panels.get(pm["node"])
        if panel is not None and self._drawing():
            panel.show_postmortem(pm)

    async def action_scrub(self, minutes: int) -> None:
        """[ / ]: the dashboard as it was 5 minutes further back / forward (an hour at most), from the flight
        recorder, labelled REPLAY; back at 0 it is live again. The live monitor, the recorder and the guard keep
        running underneath; alerts are not fed from the replay, and a replayed node refuses commands."""
        if self.recorder is None:
            self.notify("no flight recorder in this console: nothing to scrub back through", severity="warning")
            return
        back = max(0, min(self.SCRUB_MAX_MIN, self._scrub_back - minutes))
        if back == self._scrub_back:
            return
        from ..recorder.replay import replay_monitor_factory
        at = time.time() - back * 60
        mon = None
        if back:
            await asyncio.to_thread(self.recorder.store.flush)
            try:
                mon = replay_monitor_factory(self.recorder.store.path, at)(self.cluster)
            except Exception as exc:   # nothing recorded then: say so, stay where we are
                self.notify(" ".join(str(exc).split())[:200], severity="warning")
                return
        await self._end_scrub()
        self._scrub_back = back
        if mon is not None:
            self._live_monitor = self.monitor
            self._scrub_unsub = mon.subscribe(self._node_changed)
            self.monitor, self.replay_at = mon, at
            self._say_notes(mon)
            await mon.start()
        self.sub_title = self._title()
        self.screen.refresh_bindings()      # node-changing keys hide on a past moment and come back live
        self.mark_all_dirty()

    async def _end_scrub(self) -> None:
        if self._live_monitor is None:
            return
        replayed, self.monitor, self._live_monitor = self.monitor, self._live_monitor, None
        if self._scrub_unsub is not None:
            self._scrub_unsub()
        self.replay_at = None
        await replayed.stop()

    @property
    def recipes_screen(self):
        # Built on first use, like the others but the dashboard: the first frame does not wait for them.
        if self._recipes_screen is None:
            from .screens.recipes import RecipesScreen
            self._recipes_screen = RecipesScreen()
        return self._recipes_screen

    @property
    def logs_screen(self):
        if self._logs_screen is None:
            from .screens.logs import LogsScreen
            self._logs_screen = LogsScreen()
        return self._logs_screen

    @property
    def bench_screen(self):
        # Built on first use: its charts pull in plotext, which the first frame does not need.
        if self._bench_screen is None:
            from .screens.bench import BenchScreen
            self._bench_screen = BenchScreen()
        return self._bench_screen

    # --- lifecycle -------------------------------------------------------------------------------------------
    async def on_mount(self) -> None:
        if self.alerts is None:
            from ..alerts import AlertEngine
            self.alerts = AlertEngine(self.cluster.thresholds)
        self.add_mode("dashboard", lambda: self.dashboard)   # already started: only `1` switching back needs it
        if self.read_only:
            self.notify("restart, stop, launch and guard fixes are hidden", title="read-only console", timeout=15)
        if self.notice:
            self.notify(self.notice, timeout=10)
        self.set_interval(1 / REDRAW_HZ, self._redraw)
        self.call_after_refresh(self._first_frame)

    def get_default_screen(self) -> DashboardScreen:
        return self.dashboard

    def _first_frame(self, refreshes: int = 0, complete_at: int | None = None) -> None:
        # The first full frame: the dashboard composed (behind the app's own mount), its focused panel's keys on the
        # key bar, then one refresh more to paint it; with nothing to focus it waits FIRST_FRAME_REFRESHES at most.
        if complete_at is None and self.dashboard.complete():
            complete_at = refreshes
        if (complete_at is None or refreshes == complete_at) and refreshes < FIRST_FRAME_REFRESHES:
            self.call_after_refresh(self._first_frame, refreshes + 1, complete_at)
            return
        self.first_frame_at = time.perf_counter()
        # Importing the monitor's layers, opening the recorder and connecting take longer than a frame, and a thread
        # importing holds the interpreter too: none of it before the first frame is on the screen.
        self.run_worker(self._start_monitors(), name="start-monitors", exit_on_error=False)

    async def _start_monitors(self) -> None:
        try:
            await asyncio.to_thread(_import_layers, bool(self.cluster.endpoints and self.serving is None))
            if self._stopped:
                return
            if self.monitor is None:
                if self._monitor_factory is not None:
                    self.monitor = self._monitor_factory(self.cluster)
                else:
                    from ..nodes.monitor import ClusterMonitor
                    self.monitor = ClusterMonitor(self.cluster)
            if self.serving is None and self.cluster.endpoints:
                from ..serving.endpoint import ServingMonitor
                self.serving = (self._serving_factory or ServingMonitor)(self.cluster)
            self._unsubscribe.append(self.monitor.subscribe(self._node_changed))
            self._say_notes(self.monitor)
            self._start_guard()
            if self.serving is not None:
                self._unsubscribe.append(self.serving.subscribe(self._endpoint_changed))
            await self.monitor.start()
            if self.serving is not None:
                await self.serving.start()
        except Exception as exc:    # a UserError (host key, auth) is one line; show it, keep the console up
            self.notify(" ".join(str(exc).split())[:300], title="monitor", severity="error", timeout=30)
            self.dashboard.events.note(f"monitor: {exc}", "red")
        finally:
            # Everything start-up made (modules, screens, connections) lives as long as the console: out of the
            # collector's view before the first key can wait on it; later passes run when no key waits (heap.py).
            if not self._stopped:
                self.heap.start()
                self.set_interval(TICK_S, self.heap.tick)

    async def stop_monitors(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self._end_scrub()
        for unsub in self._unsubscribe:
            unsub()
        self._unsubscribe.clear()
        if self.serving is not None:
            await self.serving.stop()
        if self.monitor is not None:
            await self.monitor.stop()
        if self.recorder is not None:
            self.recorder.close()
        if self.notifier is not None:
            self.notifier.close()

    async def action_quit(self) -> None:
        await self.stop_monitors()
        self.exit()

    async def on_unmount(self) -> None:
        await self.stop_monitors()
        self.heap.release()

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, (events.Key, events.MouseDown)):
            self.heap.touched()
        await super().on_event(event)

    # --- data in ---------------------------------------------------------------------------------------------
    def _node_changed(self, nm) -> None:
        self._dirty.add(nm.name)
        if nm.name not in self._shown and nm.last is not None:
            # A node's first reading is drawn now, not at the next redraw tick: the first temperature is what an
            # operator waits for at start. Later ones batch at REDRAW_HZ.
            self._shown.add(nm.name)
            self.call_later(self._redraw)

    def _endpoint_changed(self, em) -> None:
        snap = getattr(em, "latest", em)
        if snap is not None:
            self._dirty_eps.add(snap.name)

    def node_monitor(self, name: str):
        return self.monitor.nodes.get(name) if self.monitor is not None else None

    def guards_for(self, nm) -> list:
        last = nm.last
        if last is None:
            return []
        from ..nodes.guard import evaluate_guards
        return evaluate_guards(last.guards, last.mem, nm.containers, nm.config.container)

    def node_facts(self):
        """What preflight learns from the live nodes: guard results, host memory, unified memory."""
        from ..launch.lint import Facts
        guards, mem, unified = {}, {}, {}
        for name, nm in (self.monitor.nodes.items() if self.monitor else ()):
            if nm.last is None:
                continue
            guards[name] = self.guards_for(nm)
            if nm.last.mem is not None:
                mem[name] = nm.last.mem
            if nm.last.gpus:
                unified[name] = nm.last.gpus[0].unified
        return Facts(guards=guards, mem=mem, unified=unified,
                     headroom_floor_gib=self.cluster.thresholds.headroom_floor_gib)

    def thermal_note(self):
        """For bench sweeps: the hottest GPU and the noted clock-event reasons ('node:reason') across nodes now."""
        from ..bench.results import ThermalNote
        from ..nodes.thermal import cluster_reading
        r = cluster_reading(self.monitor.nodes.values()) if self.monitor else None
        return None if r is None else ThermalNote(r.max_temp_c, r.throttle_reasons)

    def mark_all_dirty(self) -> None:
        self._dirty.update(self.dashboard.panels)

    def _drawing(self) -> bool:
        """False once the app shuts down: Textual removes the screens' widgets before the app's own unmount stops
        the monitors, and a tick arriving in between must not look for a widget that is gone."""
        return self.is_running and not self._stopped

    def _redraw(self) -> None:
        if not self._drawing():
            return
        now = time.time()
        if now - self._last_age_refresh >= AGE_REFRESH_S:
            self._last_age_refresh = now
            self.mark_all_dirty()
        dirty, self._dirty = self._dirty, set()
        if self.replay_at is not None and self.monitor is not None:
            shown = [nm.last.time for nm in self.monitor.nodes.values() if nm.last is not None]
            if shown:
                self.sub_title = self._title(max(shown))
        # Alerts for every node that changed; drawing only for panels in view (the rest on scroll or resume).
        drawn = self.dashboard.drawn() if dirty else ()
        # In the cluster file's order, not the set's (which hash seeds shuffle): events and toasts read the same
        # way on every run.
        for name in sorted(dirty, key=lambda n: self._order.get(n, len(self._order))):
            nm = self.node_monitor(name)
            panel = self.dashboard.panels.get(name)
            if nm is None or panel is None:
                continue
            guards = self.guards_for(nm)
            if panel in drawn:
                panel.show(nm, guards, now, self.cluster.thresholds, drawn=drawn)
            if self.alerts is not None and self._live_monitor is None:   # never from a replay
                self._take_alerts(self.alerts.observe_node(nm, guards))
        if dirty:
            self._show_launches()
        eps, self._dirty_eps = self._dirty_eps, set()
        for name in sorted(eps):
            em = self.serving.endpoints.get(name) if self.serving else None
            snap = em.latest if em else None
            panel = self.dashboard.endpoint_panels.get(name)
            if snap is None or panel is None:
                continue
            panel.show(snap, now)
            if self.alerts is not None:
                self._take_alerts(self.alerts.observe_endpoint(snap, self._endpoint_power(name)))

    def _show_launches(self) -> None:
        """The launches sparkconsole started, each as one line across its nodes (labels on their containers)."""
        groups = launch_groups(self.node_monitor(n.name) for n in self.cluster.nodes if self.node_monitor(n.name))
        self.dashboard.launches.show(groups, self.restart_stages)
        shown = tuple(g.line() for g in groups)         # its members and their states too: one node reports later
        if shown != self._launches_shown:
            self._launches_shown = shown
            if self._recipes_screen is not None:
                self._recipes_screen.launches_changed()
        if self.alerts is not None:
            self._take_alerts(self.alerts.observe_launches(groups))
        wanted = served_endpoints(groups, self.cluster.endpoints)
        if wanted != (self._wanted_eps or self.cluster.endpoints) and self.replay_at is None \
                and self._live_monitor is None and not self._stopped:
            self._wanted_eps = wanted
            self.run_worker(self._follow_endpoints(), name="follow-endpoints", exit_on_error=False)

    async def _follow_endpoints(self) -> None:
        """Poll where the launches serve (a recipe's own port, a router): panels appear, move and go with them."""
        async with self._follow_lock:
            if self._stopped:
                return
            if self.serving is None:
                from dataclasses import replace
                from ..serving.endpoint import ServingMonitor
                self.serving = (self._serving_factory or ServingMonitor)(replace(self.cluster, endpoints=()))
                self._unsubscribe.append(self.serving.subscribe(self._endpoint_changed))
                await self.serving.start()
            wanted = self._wanted_eps
            added, moved, removed = await self.serving.follow(wanted)
            if added or moved or removed:
                await self.dashboard.follow_endpoints({ep.name: ep for ep in wanted}, added, moved, removed)
                configured = {ep.name: ep.url for ep in self.cluster.endpoints}
                for name in moved:
                    url = self.serving.endpoints[name].config.url
                    why = "the cluster file's endpoint" if configured.get(name) == url else "where the launch serves"
                    self.dashboard.events.note(f"{name}: polling {url}, {why}", "cyan")

    def _endpoint_power(self, name: str) -> float | None:
        em = self.serving.endpoints.get(name) if self.serving is not None else None
        ep = em.config if em is not None else None
        nm = self.node_monitor(ep.node) if ep and ep.node else None
        if nm is None or nm.last is None or not nm.last.gpus:
            return None
        return nm.last.gpus[0].power_w

    def _take_alerts(self, alerts) -> None:
        # The engine returns changes only (raised, severity changed, cleared): each one is news.
        for a in alerts or ():
            self.dashboard.events.add(a)
            if a.active:
                sev = {"bad": "error", "warn": "warning"}.get(a.severity, "information")
                # The toast's title names the source already: its text need not say it again.
                self.notify(a.message.removeprefix(a.source + " "), title=a.source, severity=sev,
                            timeout=8 if a.severity == "bad" else 5)
                if a.severity == "bad":
                    self.bell()

    # --- actions ---------------------------------------------------------------------------------------------
    async def action_show(self, mode: str) -> None:
        if self.current_mode != mode:
            await self.switch_mode(mode)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            if not self.is_screen_installed("help"):
                self.install_screen(HelpScreen(), "help")     # composed once; later opens only repaint
            self.push_screen("help")

    def open_logs(self, node_name: str) -> None:
        self.logs_screen.follow(node_name)
        self.run_worker(self.action_show("logs"))

    # --- the command palette's list --------------------------------------------------------------------------
    def palette_commands(self) -> list[tuple[str, Callable[[], object], str]]:
        cmds: list[tuple[str, Callable[[], object], str]] = [
            ("Show dashboard", lambda: self.action_show("dashboard"), "1"),
            ("Show recipes", lambda: self.action_show("recipes"), "2"),
            ("Show bench", lambda: self.action_show("bench"), "3"),
            ("Show logs", lambda: self.action_show("logs"), "4"),
            ("Help: keys", self.action_help, "?"),
            ("Quit", self.action_quit, "q: agents end, connections close"),
            ("Bench: start sweep", lambda: self.bench_screen.action_start(), "b on the bench screen"),
            ("Bench: stop sweep", lambda: self.bench_screen.action_stop(), "x on the bench screen"),
        ]
        cmds += [(f"Logs: {n.name}", lambda n=n.name: self.open_logs(n), f"docker logs -f {n.container}")
                 for n in self.cluster.nodes]
        if self.read_only:
            return cmds
        cmds += [("Running recipe: restart", self.recipes_screen.action_restart, "asks first"),
                 ("Running recipe: stop", self.recipes_screen.action_stop, "asks first")]
        for node in self.cluster.nodes:
            n = node.name
            cmds += [(f"Restart vLLM on {n}", lambda n=n: self.confirm_container(n, "restart"), "asks first"),
                     (f"Stop vLLM on {n}", lambda n=n: self.confirm_container(n, "stop"), "asks first")]
        for label, recipe in self.recipes_screen.recipe_choices():
            cmds.append((f"Recipe: {label}", lambda r=recipe: self.recipes_screen.choose(r), "show its plan; enter launches"))
        return cmds
