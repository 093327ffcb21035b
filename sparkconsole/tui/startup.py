"""The console's start: its first frame first, then its monitors, the core over them and the heap keeper.

A mixin of SparkConsoleApp (tui/app.py): it uses the app's cluster, monitor, dashboard and the callbacks the app
draws with. The first full frame is the dashboard composed with its focused panel's keys on the key bar; only
then are the monitor's layers imported (in a thread), the monitor built (collector/roles.monitor_for: attached to
the cluster's collector when one runs, else its own) and the core started over it, unless the layers were imported before the app was made
(`monitors_before_first_frame`: a browser tab's console started ahead of its tab, webface/warm.py). The heap
keeper (tui/heap.py) takes over once both the frame and the monitors are up. A browser tab's console also ends with
the server that started it (`_watch_parent`).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .fmt import one_line
from .heap import TICK_S

if TYPE_CHECKING:
    from textual.app import App

    from ..alerts import AlertEngine
    from ..collector.core import Collector
    from ..config import ClusterConfig
    from .heap import HeapKeeper
    from .screens.dashboard import DashboardScreen

    _App = App[None]
else:
    _App = object

FIRST_FRAME_REFRESHES = 20
PARENTLESS_EXIT_S = 10.0      # a tab's console whose server is gone ends within this, cleanly or not


def _import_layers(serving: bool, attach: bool = False) -> None:
    """Runs in a thread: the modules the monitors need, imported while the event loop keeps drawing."""
    import importlib
    importlib.import_module("sparkconsole.collector.attach" if attach else "sparkconsole.nodes.monitor")
    importlib.import_module("sparkconsole.collector.core")
    if serving:
        importlib.import_module("sparkconsole.serving.endpoint")


class ConsoleStart(_App):
    if TYPE_CHECKING:       # what SparkConsoleApp (tui/app.py) gives its start
        cluster: ClusterConfig
        monitor: Any
        core: Collector | None
        attach: bool
        record: bool
        replay_at: float | None
        simulated: bool
        _recording: str | None
        dashboard: DashboardScreen
        heap: HeapKeeper
        first_frame_at: float | None
        _serving: Any
        _monitor_factory: Callable[[ClusterConfig], Any] | None
        _serving_factory: Callable[[ClusterConfig], Any] | None
        _unsubscribe: list[Callable[[], None]]
        _stopped: bool
        _monitors_begun: bool
        _monitors_up: bool
        _heap_started: bool

        @property
        def serving(self) -> Any: ...

        @property
        def alerts(self) -> AlertEngine | None: ...

        def _title(self, t: float | None = None) -> str: ...

        def mark_all_dirty(self) -> None: ...

        def _redraw(self) -> None: ...

        def _say(self, text: str, sev: str = "info") -> None: ...

        def _say_notes(self, mon: Any) -> None: ...

        def _show_postmortem(self, pm: dict[str, Any]) -> None: ...

        def _node_changed(self, nm: Any) -> None: ...

        def _endpoint_changed(self, em: Any) -> None: ...

        def _alert_changed(self, alert: Any) -> None: ...

        def _followed(self, change: tuple[Any, ...]) -> None: ...

    # Set where the monitor's layers were imported before the app was made (a browser tab's console started ahead
    # of its tab, webface/warm.py): nothing is left to import that would hold the first frame back, so the monitors
    # start (attach to the collector, read its current state) while Textual lays the first frame out, and the
    # readings are drawn as soon as it is up.
    monitors_before_first_frame = False

    def _not_yet(self, fn: Callable[..., object], *args: object) -> bool:
        """True while the first frame is not up (monitors_before_first_frame), fn(*args) then tried again after the
        next refresh: nothing is said or shown before the dashboard is."""
        if self.first_frame_at is not None:
            return False
        self.call_after_refresh(fn, *args)
        return True

    def _watch_parent(self, parent: int) -> None:
        """A browser tab's console (webface/) ends with the server that started it: the web driver does not
        end the app when its input closes, so a SIGKILLed server would leave it running, agents and all."""
        while os.getppid() == parent:
            time.sleep(1.0)
        # The exit stops its monitors; a console that had fallen back on its own connections when the collector
        # went with the server may still be opening them, on a loaded machine for long. It ends regardless.
        hard = threading.Timer(PARENTLESS_EXIT_S, os._exit, args=(0,))
        hard.daemon = True
        hard.start()
        self.call_from_thread(self.exit)

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
        # importing holds the interpreter too: none of it before the first frame is on the screen (unless the layers
        # were imported ahead: monitors_before_first_frame, and what they read meanwhile is drawn now).
        if self._monitors_begun:
            self.mark_all_dirty()
            self._redraw()
            self._start_heap()
        self._begin_monitors()

    def _begin_monitors(self) -> None:
        if not self._monitors_begun:
            self._monitors_begun = True
            self.run_worker(self._start_monitors(), name="start-monitors", exit_on_error=False)

    async def _start_monitors(self) -> None:
        try:
            await asyncio.to_thread(_import_layers, bool(self.cluster.endpoints and self.serving is None),
                                    self.attach and self.monitor is None and self._monitor_factory is None)
            if self._stopped:
                return
            if self.monitor is None:
                if self._monitor_factory is not None:
                    self.monitor = self._monitor_factory(self.cluster)
                else:
                    from ..collector.roles import monitor_for
                    self.monitor = monitor_for(self.cluster, attach=self.attach)
            from ..collector.seams import Attaching
            if isinstance(self.monitor, Attaching):       # attached, alone, lost: one line each
                self._unsubscribe.append(self.monitor.subscribe_status(self._say))
            self._unsubscribe.append(self.monitor.subscribe(self._node_changed))
            self._say_notes(self.monitor)
            await self._start_core().start()
        except Exception as exc:    # a UserError (host key, auth) is one line; show it, keep the console up
            self._monitor_failed(exc)
        finally:
            self._monitors_up = True
            self._start_heap()

    def _monitor_failed(self, exc: Exception) -> None:
        if self._not_yet(self._monitor_failed, exc):
            return
        self.notify(one_line(exc, 300), title="monitor", severity="error", timeout=30)
        self.dashboard.events.note(f"monitor: {exc}", "red")

    def _start_heap(self) -> None:
        # Everything start-up made (modules, screens, connections) lives as long as the console: out of the
        # collector's view before the first key can wait on it; later passes run when no key waits (heap.py).
        # Not before the first frame is up, whichever comes last.
        if self._stopped or not self._monitors_up or self.first_frame_at is None or self._heap_started:
            return
        self._heap_started = True
        self.heap.start()
        self.set_interval(TICK_S, self.heap.tick)

    def _start_core(self) -> Collector:
        """The core over the monitor: flight recorder, exhaustion warning + guard, notifications, post-mortems,
        endpoint following (all below the TUI). Its duties (recording, the guard's action, notifications) are the
        collector's while one runs, and this console's while it is alone (collector/duties.py); the header says
        whose they are."""
        from ..collector.core import Collector
        from ..collector.roles import console_role
        role = console_role(record=self.record, replay=self.replay_at is not None)
        self.core = core = Collector(self.cluster, role, self.monitor, serving=self._serving,
                                     serving_factory=self._serving_factory, say=self._say, bell=self.bell)
        if self.record:      # its file's faults are said here; a disk problem does not take the console down
            # the demo's: its own file in the state dir, kept (recorder/feed.py new_demo_recording)
            core.records_to(self._recording, on_postmortem=self._postmortem_found)
        self._unsubscribe.append(core.alerts.subscribe(self._alert_changed))
        self._unsubscribe.append(core.subscribe_endpoints(self._endpoint_changed))
        self._unsubscribe.append(core.subscribe_follow(self._followed))
        self._unsubscribe.append(core.duties.subscribe(self._duties_changed))
        return core

    def _postmortem_found(self, pm: dict[str, Any]) -> None:
        from ..recorder.postmortem import one_line as verdict_line
        # the demo's post-mortems are read with --demo: its recording is not the cluster file's
        whole = f"sparkconsole postmortem {pm['node']}" + (" --demo" if self.simulated else "")
        self._say(f"{verdict_line(pm)} · the whole of it: {whole}", "bad")
        self._show_postmortem(pm)

    def _duties_changed(self) -> None:
        self.sub_title = self._title()
