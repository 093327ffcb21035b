"""The console app: draws what the headless core (collector/core.py) publishes, and binds the keys to actions.

After the first frame the app builds its monitor (attached to the cluster's collector when one runs and the app
was asked to attach: collector/attach.py; else its own ClusterMonitor) and the core over it, which feeds the
alerts, the guard, the recorder and the notifier and follows the endpoints; the app stops both when it quits:
remote agents end and connections close. Node updates only mark a panel dirty; a timer redraws dirty panels a
few times a second, so a burst of ticks costs one frame. Alerts arrive as the core raises them, not on a redraw.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from textual import events
from textual.app import App
from textual.binding import Binding

from ..config import ClusterConfig
from ..nodes.launches import gates_closed, launch_groups
from .facade import ConsoleFacade
from .heap import HeapKeeper
from .node_actions import NodeActions
from .palette import ConsoleCommands
from .screens.dashboard import DashboardScreen
from .screens.help import HelpScreen
from .scrub import Scrub
from .startup import ConsoleStart

if TYPE_CHECKING:        # imported for real off the event loop, once the first frame is up (tui/startup.py)
    from textual.notifications import SeverityLevel

    from ..alerts import AlertEngine
    from ..collector.core import Collector
    from ..nodes.monitor import ClusterMonitor
    from ..serving.endpoint import ServingMonitor
    from .screens.bench import BenchScreen
    from .screens.logs import LogsScreen
    from .screens.recipes import RecipesScreen

REDRAW_HZ = 4.0
TOAST_SHORT = 48        # a toast's words on a small terminal (the rest: the Events pane)
AGE_REFRESH_S = 1.0     # a node that stopped ticking still gets redrawn: its age and STALE / DOWN move on
# Read-only (`sparkconsole serve --read-only`, which starts this app in a child process and says so here): every
# node-changing action (restart, stop, launch, guard fixes) is hidden, and refused should one be reached anyway.
READ_ONLY_ENV = "SPARKCONSOLE_READ_ONLY"


class SparkConsoleApp(ConsoleStart, NodeActions, Scrub, App):
    CSS_PATH = "app.tcss"
    TITLE = "sparkconsole"
    COMMANDS = App.COMMANDS | {ConsoleCommands}
    BINDINGS = [
        Binding("1", "show('dashboard')", "Dashboard"),
        Binding("2", "show('recipes')", "Recipes"),
        Binding("3", "show('bench')", "Bench"),
        Binding("4", "show('logs')", "Logs"),
        Binding("e", "events", "Events"),
        Binding("question_mark", "help", "Help"),
        Binding("colon", "command_palette", "Commands", show=False),   # not priority: ':' still types in inputs
        Binding("ctrl+p", "command_palette", "Commands", show=False, priority=True),
        Binding("q", "quit", "Quit"),
        Binding("left_square_bracket", "scrub(-5)", "Back 5 min", show=False),
        Binding("right_square_bracket", "scrub(5)", "Forward 5 min", show=False),
    ]
    # The dashboard is the screen the app starts on, as a minimal app's default screen: started as a mode of its own,
    # Textual re-parses every stylesheet and restyles the whole app twice first (~40 ms of the first frame).
    DEFAULT_MODE = "dashboard"

    def __init__(self, cluster: ClusterConfig, *, monitor: ClusterMonitor | None = None,
                 serving: ServingMonitor | None = None,
                 monitor_factory: Callable[[ClusterConfig], ClusterMonitor] | None = None,
                 read_only: bool | None = None, serving_factory: Callable[[ClusterConfig], ServingMonitor] | None = None,
                 replay_at: float | None = None, record: bool = False, notice: str | None = None,
                 attach: bool = False, recording: str | None = None) -> None:
        """monitor: a ClusterMonitor to draw (started and stopped by the app); or monitor_factory(cluster),
        called once the first frame is up (the SSH stack's import costs more than the first frame).
        serving_factory(cluster): likewise for the ServingMonitor of the cluster's endpoints.
        attach: with neither, attach to the cluster's collector when one runs (then the collector records, guards
        and notifies; alone, this console does, and hands those duties back when a collector runs: the header says).
        notice: one line shown at start (where the cluster came from, clusterfile.py).
        recording: the recorder file: the one a replay (`replay_at`, console --at) plays, whose endpoint polls are
        shown too; or, with `record`, the one this console records into (the demo's, kept in the state dir)."""
        super().__init__()
        self.cluster = cluster
        self.monitor = monitor
        self._monitor_factory = monitor_factory
        self._serving_factory = serving_factory
        self._serving = serving
        self.attach = attach
        self.core: Collector | None = None
        self.simulated = cluster.simulated       # labelled SIMULATED on every screen
        self.read_only = os.environ.get(READ_ONLY_ENV) == "1" if read_only is None else read_only
        self.replay_at = replay_at          # flight-recorder replay (console --at): labelled REPLAY with its time
        self.record = record and replay_at is None
        self.notice = notice
        self._recording = recording
        self._init_scrub()                  # [ / ]: tui/scrub.py
        self.sub_title = self._title()
        self.dashboard = DashboardScreen()
        self._recipes_screen: RecipesScreen | None = None
        self._logs_screen: LogsScreen | None = None
        self._bench_screen: BenchScreen | None = None
        for mode, make in (("recipes", lambda: self.recipes_screen), ("bench", lambda: self.bench_screen),
                           ("logs", lambda: self.logs_screen)):
            self.add_mode(mode, make)   # one instance per mode: the app feeds it
        self._dirty: set[str] = set()
        self._order = {n.name: i for i, n in enumerate(cluster.nodes)}
        self._dirty_eps: set[str] = set()
        self._closed_shown: frozenset[str] = frozenset()
        self._closed_noted: frozenset[str] = frozenset()   # the CLOSED reasons already in the events pane
        self._launches_shown: tuple = ()    # the launches last drawn: the recipes screen is told of changes
        self._alerts_due: list = []         # alerts the core raised or cleared since the last frame
        # (node, container) -> its stage while a restart from this console runs (the launch bar shows it)
        self.restart_stages: dict[tuple[str, str], str] = {}
        self._shown: set[str] = set()      # nodes whose first reading has been drawn
        self._unsubscribe: list[Callable[[], None]] = []
        self._last_age_refresh = 0.0
        self._stopped = False
        self._monitors_begun = False
        self._monitors_up = False           # _start_monitors done (or failed)
        self._heap_started = False
        self.first_frame_at: float | None = None
        self.heap = HeapKeeper()
        self.facade = ConsoleFacade(self)   # what the screens and widgets reach the console through (tui/facade.py)

    def _title(self, t: float | None = None) -> str:
        replay = f"REPLAY {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t or self.replay_at))} · " \
            if self.replay_at is not None else ""
        duties = self.core.duties.line() if self.core is not None else ""     # whose: collector/duties.py
        return replay + ("SIMULATED · " if self.simulated else "") + ("READ-ONLY · " if self.read_only else "") \
            + self.cluster.source + (f" · {duties}" if duties else "")

    @property
    def alerts(self) -> AlertEngine | None:
        """The core's alert engine (None until the core is up, after the first frame)."""
        return self.core.alerts if self.core is not None else None

    @property
    def serving(self):
        return self.core.serving if self.core is not None else self._serving

    @property
    def recorder(self):
        return self.core.recorder if self.core is not None else None

    @property
    def notifier(self):
        return self.core.notifier if self.core is not None else None

    def _say(self, text: str, sev: str = "info") -> None:
        if not self._drawing() or self._not_yet(self._say, text, sev):
            return
        self.dashboard.events.note(text, {"bad": "red", "warn": "yellow"}.get(sev, "cyan"))
        if sev == "bad" or (sev == "warn" and not self._small()):
            self.notify(self._toast_text(text), severity="error" if sev == "bad" else "warning", timeout=10)

    def _small(self) -> bool:
        from .screens.dashboard import NARROW_COLS, SHORT_ROWS
        return self.size.height < SHORT_ROWS or self.size.width < NARROW_COLS

    def _toast_text(self, text: str) -> str:
        """A toast on a small terminal says the gist and where the rest is: whole, three of them covered a node's
        panel at 80×24 (its guards under them). The Events pane (`e`) keeps every word."""
        from .fmt import clip_words
        if not self._small():
            return text
        return clip_words(text, TOAST_SHORT) + (" (e: Events)" if len(text) > TOAST_SHORT else "")

    def _say_notes(self, mon) -> None:
        """A replay's notes (recorder/replay.py: the unreadable parts of a damaged recorder file), said on screen."""
        if self._not_yet(self._say_notes, mon):
            return
        for note in getattr(mon, "notes", ()):
            self.dashboard.events.note(note, "yellow")
            self.notify(note, severity="warning", timeout=15)

    def _show_postmortem(self, pm: dict) -> None:
        if self._not_yet(self._show_postmortem, pm):
            return
        panel = self.dashboard.panels.get(pm["node"])
        if panel is not None and self._drawing():
            panel.show_postmortem(pm)

    @property
    def recipes_screen(self) -> RecipesScreen:
        # Built on first use, like the others but the dashboard: the first frame does not wait for them.
        if self._recipes_screen is None:
            from .screens.recipes import RecipesScreen
            self._recipes_screen = RecipesScreen()
        return self._recipes_screen

    @property
    def logs_screen(self) -> LogsScreen:
        if self._logs_screen is None:
            from .screens.logs import LogsScreen
            self._logs_screen = LogsScreen()
        return self._logs_screen

    @property
    def bench_screen(self) -> BenchScreen:
        # Built on first use: its charts pull in plotext, which the first frame does not need.
        if self._bench_screen is None:
            from .screens.bench import BenchScreen
            self._bench_screen = BenchScreen()
        return self._bench_screen

    # --- lifecycle -------------------------------------------------------------------------------------------
    async def on_mount(self) -> None:
        self.add_mode("dashboard", lambda: self.dashboard)   # already started: only `1` switching back needs it
        if self.read_only:
            self.notify("restart, stop, launch and guard fixes are hidden", title="read-only console", timeout=15)
        if self.notice:
            self.notify(self.notice, timeout=10)
        self.set_interval(1 / REDRAW_HZ, self._redraw)
        self.call_after_refresh(self._first_frame)
        if self.monitors_before_first_frame:
            self._begin_monitors()
        if os.environ.get("TEXTUAL_DRIVER", "").endswith("WebDriver"):
            import threading
            threading.Thread(target=self._watch_parent, args=(os.getppid(),), daemon=True).start()

    def get_default_screen(self) -> DashboardScreen:
        return self.dashboard

    async def stop_monitors(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self._end_scrub()
        for unsub in self._unsubscribe:
            unsub()
        self._unsubscribe.clear()
        if self.core is not None:
            await self.core.stop(settle=False)     # the recorder file closed (checkpointed) on every clean exit
        else:
            if self._serving is not None:
                await self._serving.stop()
            if self.monitor is not None:
                await self.monitor.stop()

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
        if self.core is not None:
            return self.core.guards(nm)
        from ..collector.core import guards_of
        return guards_of(nm)

    def node_facts(self):
        """What preflight learns from the live nodes: guard results, host memory, unified memory."""
        from ..launch.lint import Facts
        guards, mem, unified, ticks = {}, {}, {}, {}
        for name, nm in (self.monitor.nodes.items() if self.monitor else ()):
            if nm.last is None:
                continue
            ticks[name] = nm.last          # what runs there: the memory budget counts it (placement/budget.py)
            guards[name] = self.guards_for(nm)
            if nm.last.mem is not None:
                mem[name] = nm.last.mem
            if nm.last.gpus:
                unified[name] = nm.last.gpus[0].unified
        return Facts(guards=guards, mem=mem, unified=unified, ticks=ticks,
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
        if not self._drawing() or self.first_frame_at is None:     # the first frame draws what came before it
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
            self._show_replayed_endpoints(max(shown, default=self.replay_at))
        # Drawing only for panels in view (the rest on scroll or resume).
        drawn = self.dashboard.drawn() if dirty else ()
        # In the cluster file's order, not the set's (which hash seeds shuffle): events and toasts read the same
        # way on every run.
        for name in sorted(dirty, key=lambda n: self._order.get(n, len(self._order))):
            nm = self.node_monitor(name)
            panel = self.dashboard.panels.get(name)
            if nm is None or panel is None:
                continue
            if panel in drawn:
                panel.show(nm, self.guards_for(nm), now, self.cluster.thresholds, drawn=drawn)
        if dirty:
            self._show_launches()
        due, self._alerts_due = self._alerts_due, []
        self._take_alerts(due)
        eps, self._dirty_eps = self._dirty_eps, set()
        if eps and self._closed_urls() != self._closed_shown:
            self._show_launches()
        if self.replay_at is not None:
            eps = set()                         # a recorded moment: the panels show its polls, not the live ones
        for name in sorted(eps):
            em = self.serving.endpoints.get(name) if self.serving else None
            snap = em.latest if em else None
            ep_panel = self.dashboard.endpoint_panels.get(name)
            if snap is None or ep_panel is None:
                continue
            loading = self.alerts is not None and f"endpoint:{name}:loading" in self.alerts.active
            ep_panel.show(snap, now, loading=loading)

    def _closed_urls(self) -> frozenset[str]:
        """The endpoints whose last poll says their drain gate is closed."""
        if self.serving is None:
            return frozenset()
        return frozenset(em.latest.url for em in self.serving.endpoints.values()
                         if em.latest is not None and em.latest.drain_closed)

    def _show_launches(self) -> None:
        """The launches sparkconsole started, each as one line across its nodes (labels on their containers); a
        launch with a server closed by its drain gate is CLOSED, with the command that opens it."""
        from ..launch.drain_gate import reopen_command  # stdlib only: no launch layer on the console's path
        self._closed_shown = self._closed_urls()
        groups = gates_closed(launch_groups(self.node_monitor(n.name) for n in self.cluster.nodes
                                            if self.node_monitor(n.name)), self._closed_shown, reopen_command)
        # The whole line once in the events pane (the launch bar may cut it short), when the launch turns CLOSED:
        # its server's poll may say closed before the launch reads SERVING, so the URL's change is not the moment.
        closed = {f"{g.recipe} × {g.topology}: {g.reason}" for g in groups if g.verdict == "CLOSED"}
        for line in sorted(closed - self._closed_noted):
            self.dashboard.events.note(line, "yellow")
        self._closed_noted = frozenset(closed)
        self.dashboard.launches.show(groups, self.restart_stages)
        shown = tuple(g.line() for g in groups)         # its members and their states too: one node reports later
        if shown != self._launches_shown:
            self._launches_shown = shown
            if self._recipes_screen is not None:
                self._recipes_screen.launches_changed()

    def _followed(self, change: tuple) -> None:
        """The core polls where the launches serve now (a recipe's own port, a router): panels appear, move and go
        with them."""
        if self._drawing() and not self._not_yet(self._followed, change):
            self.run_worker(self._show_followed(*change), name="follow-endpoints", exit_on_error=False)

    async def _show_followed(self, wanted, added, moved, removed) -> None:
        await self.dashboard.follow_endpoints({ep.name: ep for ep in wanted}, added, moved, removed)
        configured = {ep.name: ep.url for ep in self.cluster.endpoints}
        for name in moved:
            em = self.serving.endpoints.get(name) if self.serving is not None else None
            if em is None:
                continue
            url = em.config.url
            why = "the cluster file's endpoint" if configured.get(name) == url else "where the launch serves"
            self.dashboard.events.note(f"{name}: polling {url}, {why}", "cyan")

    def _alert_changed(self, alert) -> None:
        # raised, recorded and notified by the core on the tick; shown with the next frame
        if self._drawing():
            self._alerts_due.append(alert)

    def _take_alerts(self, alerts) -> None:
        # The engine returns changes only (raised, severity changed, cleared): each one is news.
        for a in alerts or ():
            self.dashboard.events.add(a)
            if a.active and (a.severity == "bad" or not self._small()):
                # a small terminal toasts only what is BAD: the rest is in the Events pane (`e`), the panels say it
                sev: SeverityLevel = "error" if a.severity == "bad" else "warning" if a.severity == "warn" \
                    else "information"
                # The toast's title names the source already: its text need not say it again.
                self.notify(self._toast_text(a.body), title=a.source, severity=sev,
                            timeout=8 if a.severity == "bad" else 5)
                if a.severity == "bad":
                    self.bell()

    # --- actions ---------------------------------------------------------------------------------------------
    async def action_show(self, mode: str) -> None:
        if self.current_mode != mode:
            await self.switch_mode(mode)

    async def action_events(self) -> None:
        """e: the Events pane (alerts, restart progress, collector messages) over the whole dashboard, whatever the
        terminal's size; e or escape brings the nodes back. From another screen: the dashboard's Events."""
        if self.current_mode != "dashboard":
            await self.switch_mode("dashboard")
            self.dashboard.show_events(True)
            return
        self.dashboard.show_events(not self.dashboard.events_only)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            if not self.is_screen_installed("help"):
                self.install_screen(HelpScreen(), "help")     # composed once; later opens only repaint
            self.push_screen("help")

    def open_logs(self, node_name: str) -> None:
        self.logs_screen.follow(node_name)
        self.run_worker(self.action_show("logs"))

    # --- the command palette ------------------------------------------------------------------------------
    def palette_commands(self) -> list:
        """Every action, by its key's words (tui/palette.py)."""
        from .palette import console_commands
        return console_commands(self)

    def get_system_commands(self, screen):
        """Textual's own palette entries but Quit and Keys: the console's Quit and Help stand for them, once each."""
        for cmd in super().get_system_commands(screen):
            if cmd.title not in ("Quit", "Keys"):
                yield cmd
