"""The one place the watching is wired: monitors → alert engine → forecast and guard → recorder → notifier, and
the endpoints followed to where the launches serve. `sparkconsole record` (the collector), the console, the
exporter and the demo each build one and only draw, print or serve what it publishes.

    core = Collector(cluster, monitor=mon, say=print_line)    # monitor: a ClusterMonitor, or one attached to a
    core.open_recorder()                                      # collector (collector/attach.py); None: built here
    core.subscribe_endpoints(cb); core.subscribe_follow(cb)   # alerts: core.alerts.subscribe(cb)
    await core.start(); ...; await core.stop()

The alert engine is fed on every node tick and every endpoint poll (never on a redraw), so alert timing is the
same in every front end. A viewer attached to a collector builds one too, with `acting=False`: its alerts are
computed from the same ticks, but the guard's `docker stop`, the notifications and the recording stay the
collector's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..alerts import AlertEngine
from ..config import ClusterConfig
from ..nodes.guard import GuardResult, evaluate_guards
from ..nodes.launches import launch_groups, served_endpoints
from ..subscribers import Subscribers

if TYPE_CHECKING:
    from ..notify.notifier import Notifier
    from ..protect import Guardian
    from ..recorder.feed import Recorder
    from .lock import WriterLock

log = logging.getLogger(__name__)

Say = Callable[[str, str], None]      # say(text, severity): severity info | warn | bad


def guards_of(nm: Any) -> list[GuardResult]:
    """The OOM guards of a node from its last tick."""
    t = nm.last
    if t is None:
        return []
    return evaluate_guards(t.guards, t.mem, nm.containers, nm.config.container)


class Collector:
    """monitor: a ClusterMonitor (or anything with .nodes, .subscribe, .start, .stop), built from the cluster when
    None. serving: a ServingMonitor, built for the cluster's endpoints when None (with_serving), or once a launch
    serves somewhere (follow; serve_launches=False: only where the cluster file has endpoints). acting: False for a viewer (no guard action, no notification). replay: a recorded
    past (the guard says what it would have done; nothing is followed)."""

    def __init__(self, cluster: ClusterConfig, *, monitor: Any = None, serving: Any = None,
                 alerts: AlertEngine | None = None,
                 say: Say | None = None, acting: bool = True, replay: bool = False, follow: bool = True,
                 with_serving: bool = True, serving_factory: Callable[[ClusterConfig], Any] | None = None,
                 history: int = 600,
                 bell: Callable[[], None] | None = None, serve_launches: bool = True) -> None:
        self.cluster = cluster
        if monitor is None:
            from ..nodes.monitor import ClusterMonitor
            monitor = ClusterMonitor(cluster, history=history)
        self._serving_factory = serving_factory
        if serving is None and with_serving and cluster.endpoints:
            serving = self._make_serving(cluster)
        self.monitor = monitor
        self.serving = serving
        self.alerts = alerts or AlertEngine(cluster.thresholds)
        self.say: Say = say or (lambda text, severity: None)
        self.acting = acting
        self.replay = replay
        self.follow = follow and not replay
        self.with_serving = with_serving
        self.serve_launches = serve_launches
        self.bell = bell
        self.recorder: Recorder | None = None
        self.writer_lock: WriterLock | None = None
        self.notifier: Notifier | None = None
        self.guardian: Guardian | None = None
        self._unsub: list[Callable[[], None]] = []
        self._guards: dict[str, tuple[object, object, list[GuardResult]]] = {}   # name -> (tick, containers, results)
        self._launch_key: tuple[tuple[int, object], ...] = ()
        self.launches: list[Any] = []                  # the launch groups seen on the last change of any node
        self._wanted: tuple[Any, ...] = tuple(cluster.endpoints)
        self._follow_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._endpoint_subs: Subscribers[Any] = Subscribers("collector endpoints")
        self._follow_subs: Subscribers[tuple[Any, ...]] = Subscribers("collector follow")
        self._started = False
        self._stopped = False
        self._closed = False

    def _make_serving(self, cluster: ClusterConfig) -> Any:
        if self._serving_factory is not None:
            return self._serving_factory(cluster)
        from ..serving.endpoint import ServingMonitor
        return ServingMonitor(cluster)

    # --- the recorder (the only writer of the cluster's file: collector/lock.py) ------------------------------
    def open_recorder(self, path: str | Path | None = None, *, role: str = "record", on_loop: bool = True,
                      on_postmortem: Callable[[dict[str, Any]], None] | None = None) -> Recorder | None:
        """Takes the cluster's writer lock (a UserError naming the running collector when another holds it), then
        opens the recorder file; None when the cluster file turns the recorder off."""
        from ..recorder.feed import Recorder
        from .lock import WriterLock
        if not self.cluster.recorder.enabled:
            return None
        lock = WriterLock.acquire(self.cluster, role)
        if lock.error:
            log.warning("recorder writer lock not taken (%s): recording without it", lock.error)
        try:
            rec = Recorder.open(self.cluster, path, on_status=self.say, on_loop=on_loop)
        except BaseException:
            lock.release()
            raise
        self.writer_lock = lock
        self.recorder = rec
        if rec is not None:
            rec.on_postmortem = on_postmortem
        return rec

    # --- what the front ends subscribe to ---------------------------------------------------------------------
    def subscribe_endpoints(self, cb: Callable[[Any], None]) -> Callable[[], None]:
        """cb(endpoint_monitor) after every endpoint poll, whichever ServingMonitor polls it now."""
        return self._endpoint_subs.add(cb)

    def subscribe_follow(self, cb: Callable[[tuple[Any, ...]], None]) -> Callable[[], None]:
        """cb((wanted, added, moved, removed)) after the endpoints polled changed to follow the launches."""
        return self._follow_subs.add(cb)

    def guards(self, nm: Any) -> list[GuardResult]:
        """guards_of(nm), computed once per tick (the alert feed, the panels and every scrape read the same)."""
        cached = self._guards.get(nm.name)
        if cached is not None and cached[0] is nm.last and cached[1] is nm.containers:
            return cached[2]
        results = guards_of(nm)
        self._guards[nm.name] = (nm.last, nm.containers, results)
        return results

    def endpoint_node(self, name: str) -> str | None:
        em = self.serving.endpoints.get(name) if self.serving is not None else None
        return em.config.node if em is not None else None

    def endpoint_power(self, name: str) -> float | None:
        node = self.endpoint_node(name)
        nm = self.monitor.nodes.get(node) if node else None
        if nm is None or nm.last is None or not nm.last.gpus:
            return None
        power: float | None = nm.last.gpus[0].power_w
        return power

    def endpoint_snapshots(self) -> list[Any]:
        if self.serving is None:
            return []
        return [em.latest for em in self.serving.endpoints.values() if em.latest is not None]

    # --- the feed: every tick and every poll ----------------------------------------------------------------
    def _node_changed(self, nm: Any) -> None:
        if self._stopped:
            return
        self.alerts.observe_node(nm, self.guards(nm))
        nodes = list(self.monitor.nodes.values())
        key = tuple((id(n.containers), n.state) for n in nodes)
        if key == self._launch_key:
            return
        self._launch_key = key
        self.launches = launch_groups(nodes)
        self.alerts.observe_launches(self.launches)
        if not self.follow:
            return
        # poll where the launches serve (a recipe's own port, a router)
        wanted = served_endpoints(self.launches, self.cluster.endpoints)
        if wanted != self._wanted:
            self._wanted = wanted
            self._spawn(self._follow())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow(self) -> None:
        async with self._follow_lock:
            if self._stopped:
                return
            if self.serving is None:
                if not (self.with_serving and self.serve_launches):
                    return
                self.serving = self._make_serving(replace(self.cluster, endpoints=()))
                self._unsub.append(self.serving.subscribe(self._endpoint_changed))
                await self.serving.start()
            wanted = self._wanted
            added, moved, removed = await self.serving.follow(wanted)
            if added or moved or removed:
                self._follow_subs.notify((wanted, added, moved, removed))

    def _endpoint_changed(self, em: Any) -> None:
        snap = getattr(em, "latest", None)
        if snap is not None and not self._stopped:
            self.alerts.observe_endpoint(snap, self.endpoint_power(snap.name))
        self._endpoint_subs.notify(em)

    # --- lifecycle --------------------------------------------------------------------------------------------
    def _wire(self) -> None:
        from ..protect import Guardian
        rec = self.recorder
        if rec is not None:
            rec.attach(self.monitor)
            rec.attach_alerts(self.alerts)
            if self.serving is not None:
                rec.attach_serving(self.serving)
        self.guardian = guardian = Guardian(self.cluster, self.alerts, recorder=rec, say=self.say, replay=self.replay)
        if not self.acting:
            guardian.threshold_s = 0       # the collector this viewer is attached to acts, once
        self._unsub.append(self.monitor.subscribe(guardian.on_node))
        self._unsub.append(self.monitor.subscribe(self._node_changed))
        if self.acting and not self.replay:
            from ..notify.notifier import Notifier
            self.notifier = notifier = Notifier(self.cluster.notify, bell=self.bell or (lambda: None),
                                                cluster=self.cluster.source)

            def send(alert: Any) -> None:
                notifier.submit(alert)        # False when filtered or rate-limited: nothing to do then
            self._unsub.append(self.alerts.subscribe(send))
        if self.serving is not None:
            self._unsub.append(self.serving.subscribe(self._endpoint_changed))

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._wire()
        for nm in self.monitor.nodes.values():      # what a monitor already holds is judged now, not at its next tick
            if nm.last is not None:
                self._node_changed(nm)
        await self.monitor.start()
        if self.serving is not None:
            await self.serving.start()

    async def stop(self, *, flush_s: float = 0.0, settle: bool = True) -> None:
        """Stops the monitors; waits for the guard's stops and the post-mortems under way (settle; a console
        quitting does not wait for them); closes (checkpoints) the recorder file and sends what the notifier still
        holds for up to flush_s seconds."""
        if self._stopped:
            return
        self._stopped = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.serving is not None:
            await self.serving.stop()
        await self.monitor.stop()
        for unsub in self._unsub:
            unsub()
        self._unsub.clear()
        if settle and self.guardian is not None:
            await self.guardian.wait_actions()
        if settle and self.recorder is not None:
            await self.recorder.wait_postmortems()
        self.close(flush_s=flush_s)

    def close(self, *, flush_s: float = 0.0) -> None:
        """What stop() ends last: the recorder file closed (checkpointed), the writer lock let go, the notifier's
        queue sent for up to flush_s seconds. Once only."""
        if self._closed:
            return
        self._closed = True
        if self.recorder is not None:
            self.recorder.close()
        if self.writer_lock is not None:
            self.writer_lock.release()
            self.writer_lock = None
        if self.notifier is not None:
            if flush_s > 0:
                self.notifier.flush(flush_s)
            self.notifier.close()
