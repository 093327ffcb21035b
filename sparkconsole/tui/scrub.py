"""Scrubbing through the flight recorder: `[` / `]` show the dashboard as it was 5 minutes further back / forward
(an hour at most), labelled REPLAY; back at 0 it is live again. A replay's endpoint panels show the polls recorded
at that moment, not the live ones.

A mixin of SparkConsoleApp: it swaps the app's monitor for a replaying one and back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .fmt import one_line

if TYPE_CHECKING:
    from textual.app import App

    from ..collector.core import Collector
    from ..config import ClusterConfig
    from ..recorder.replay import EndpointReplay
    from .screens.dashboard import DashboardScreen

    _App = App[None]
else:
    _App = object


class Scrub(_App):
    SCRUB_MAX_MIN = 60

    if TYPE_CHECKING:       # what SparkConsoleApp (tui/app.py) gives the scrubbing
        cluster: ClusterConfig
        monitor: Any
        core: Collector | None
        replay_at: float | None
        dashboard: DashboardScreen
        _recording: str | None
        _dirty_eps: set[str]

        @property
        def recorder(self) -> Any: ...
        def _node_changed(self, nm: Any) -> None: ...
        def _say_notes(self, mon: Any) -> None: ...
        def _title(self, t: float | None = None) -> str: ...
        def mark_all_dirty(self) -> None: ...

    def _init_scrub(self) -> None:
        self._live_monitor: Any = None      # while scrubbing back: the live monitor, still watching
        self._scrub_back = 0                # minutes
        self._scrub_unsub: Callable[[], None] | None = None
        self._ep_replay: EndpointReplay | None = None      # while a recorded moment plays

    async def action_scrub(self, minutes: int) -> None:
        """[ / ]: the dashboard as it was 5 minutes further back / forward (an hour at most), from the flight
        recorder, labelled REPLAY; back at 0 it is live again. The live monitor, the recorder and the guard keep
        running underneath; alerts are not fed from the replay, and a replayed node refuses commands."""
        path = await self._recorder_file()
        if path is None:
            self.notify("no flight recorder in this console: nothing to scrub back through", severity="warning")
            return
        back = max(0, min(self.SCRUB_MAX_MIN, self._scrub_back - minutes))
        if back == self._scrub_back:
            return
        from ..recorder.replay import replay_monitor_factory
        at = time.time() - back * 60
        mon = None
        if back:
            try:
                mon = replay_monitor_factory(path, at)(self.cluster)
            except Exception as exc:   # nothing recorded then: say so, stay where we are
                self.notify(one_line(exc, 200), severity="warning")
                return
        await self._end_scrub()
        self._scrub_back = back
        if mon is not None:
            from ..recorder.replay import EndpointReplay
            self._live_monitor = self.monitor
            self._scrub_unsub = mon.subscribe(self._node_changed)
            self.monitor, self.replay_at = mon, at
            # the endpoint panels go back with the nodes: the recorded polls of that moment, not the live ones
            self._ep_replay = await asyncio.to_thread(EndpointReplay, path, at)
            self._say_notes(mon)
            await mon.start()
        self.sub_title = self._title()
        self.screen.refresh_bindings()      # node-changing keys hide on a past moment and come back live
        self.mark_all_dirty()

    async def _recorder_file(self):
        """The recorder file to scrub back through: this console's (flushed first), or the collector's it is
        attached to."""
        if self.recorder is not None:
            await asyncio.to_thread(self.recorder.store.flush)
            return self.recorder.store.path
        live = self.core.monitor if self.core is not None else None
        collector = getattr(live, "collector", None) or {}
        return collector.get("recorder") if getattr(live, "attached", False) else None

    async def _end_scrub(self) -> None:
        if self._live_monitor is None:
            return
        replayed, self.monitor, self._live_monitor = self.monitor, self._live_monitor, None
        if self._scrub_unsub is not None:
            self._scrub_unsub()
        self.replay_at = None
        self._ep_replay = None
        self._dirty_eps.update(self.dashboard.endpoint_panels)     # live again: the last live polls
        await replayed.stop()

    def _show_replayed_endpoints(self, t: float) -> None:
        """The endpoint panels at the replayed time t: each endpoint's recorded poll then (console --at reads its
        file's polls once, on the first frame that needs them)."""
        if self._ep_replay is None:
            if not self._recording:
                return
            from ..recorder.replay import EndpointReplay
            try:
                self._ep_replay = EndpointReplay(self._recording, self.replay_at or t)
            except Exception as exc:        # an unreadable file: the nodes still replay; say why the panels do not
                self._recording = None
                self.notify(f"recorded endpoint polls unreadable: {one_line(exc, 160)}",
                            severity="warning")
                return
        snaps = self._ep_replay.at(t)
        for name, panel in self.dashboard.endpoint_panels.items():
            snap = snaps.get(name)
            if snap is not None:
                panel.show(snap, t, replayed=True)
            else:
                panel.show_unrecorded(t)
