"""The one place the watching is wired: monitors → alert engine → forecast and guard → recorder → notifier, and
the endpoints followed to where the launches serve. `sparkconsole record` (the collector), the console, the
exporter and the demo each build one and only draw, print or serve what it publishes.

    core = Collector(cluster, RECORD, monitor_for(cluster, attach=False), say=print_line)   # roles: roles.py
    core.records_to(path, on_postmortem=cb)                   # where the recording goes while it holds the duties
    core.subscribe_endpoints(cb); core.subscribe_follow(cb)   # alerts: core.alerts.subscribe(cb)
    await core.start(); ...; await core.stop()

The alert engine is fed on every node tick and every endpoint poll (never on a redraw), so alert timing is the
same in every front end. The duties (recording, the guard's `docker stop`, notifications) are held by one process
at a time (collector/duties.py): a console attached to a collector computes the same alerts from the same ticks
but leaves them to the collector, and takes them over while the collector is gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..alerts import AlertEngine, LoadWatch
from ..config import ClusterConfig
from ..nodes.guard import GuardResult, evaluate_guards
from ..nodes.launches import LaunchGroup, launch_groups, member_at, served_endpoints
from ..nodes.view import seconds_since
from ..subscribers import Subscribers
from .duties import Duties
from .roles import Role
from .seams import ClusterWatch, EndpointsWatch, Json, ServingFactory

if TYPE_CHECKING:
    from ..config import EndpointConfig
    from ..nodes.monitor import NodeMonitor
    from ..notify.notifier import Notifier
    from ..protect import Guardian
    from ..recorder.feed import Recorder
    from ..serving.endpoint import EndpointMonitor, EndpointSnapshot

log = logging.getLogger(__name__)

Say = Callable[[str, str], None]      # say(text, severity): severity info | warn | bad
Follow = tuple[tuple["EndpointConfig", ...], list[str], list[str], list[str]]   # (wanted, added, moved, removed)


def guards_of(nm: NodeMonitor) -> list[GuardResult]:
    """The OOM guards of a node from its last tick."""
    t = nm.last
    if t is None:
        return []
    return evaluate_guards(t.guards, t.mem, nm.containers, nm.config.container)


def _now() -> float:
    return time.time()      # looked up per call: a test that sets time.time sees its alerts at its own time


class Collector:
    """role: what this front end is (roles.py: the duties it may hold, how it watches the endpoints). monitor: a
    ClusterMonitor or one that acts as it (roles.monitor_for chooses). serving: a ServingMonitor, built for the
    cluster's endpoints when None (serving_factory, else the monitor's `serving_for`, else a ServingMonitor), or
    once a launch serves somewhere."""

    def __init__(self, cluster: ClusterConfig, role: Role, monitor: ClusterWatch, *,
                 serving: EndpointsWatch | None = None, serving_factory: ServingFactory | None = None,
                 say: Say | None = None, bell: Callable[[], None] | None = None) -> None:
        self.cluster = cluster
        self.role = role
        self.monitor = monitor
        self._serving_factory = serving_factory or getattr(monitor, "serving_for", None)
        if serving is None and role.serving and cluster.endpoints:
            serving = self._make_serving(cluster)
        self.serving = serving
        self.alerts = AlertEngine(cluster.thresholds, clock=_now)
        self._loads = LoadWatch()
        self.say: Say = say or (lambda text, severity: None)
        self.bell = bell
        self.guardian: Guardian | None = None
        self.duties = Duties(self)
        self._unsub: list[Callable[[], None]] = []
        self._guards: dict[str, tuple[object, object, list[GuardResult]]] = {}   # name -> (tick, containers, results)
        self._launch_key: tuple[tuple[int, object], ...] = ()
        self.launches: list[LaunchGroup] = []          # the launch groups seen on the last change of any node
        self._wanted: tuple[EndpointConfig, ...] = tuple(cluster.endpoints)
        self._follow_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._endpoint_subs: Subscribers[EndpointMonitor] = Subscribers("collector endpoints")
        self._follow_subs: Subscribers[Follow] = Subscribers("collector follow")
        self._started = False
        self._stopped = False
        self._closed = False

    def _make_serving(self, cluster: ClusterConfig) -> EndpointsWatch:
        if self._serving_factory is not None:
            return self._serving_factory(cluster)
        from ..serving.endpoint import ServingMonitor
        return ServingMonitor(cluster)

    # --- what the duties hold (collector/duties.py) -----------------------------------------------------------
    def records_to(self, path: str | Path | None = None, *, on_loop: bool = True,
                   on_postmortem: Callable[[Json], None] | None = None) -> None:
        """Where this core records while it holds the duties (default: the collector's file it took them over from,
        else the cluster's file in the state dir); on_loop: the recorder's fault lines said on the event loop
        (False: in its writer thread, for a thread-safe say); on_postmortem(pm) after each incident."""
        self.duties.path, self.duties.on_loop, self.duties.on_postmortem = path, on_loop, on_postmortem

    @property
    def recorder(self) -> Recorder | None:
        return self.duties.recorder

    @property
    def notifier(self) -> Notifier | None:
        return self.duties.notifier

    # --- what the front ends subscribe to ---------------------------------------------------------------------
    def subscribe_endpoints(self, cb: Callable[[EndpointMonitor], None]) -> Callable[[], None]:
        """cb(endpoint_monitor) after every endpoint poll, whichever ServingMonitor polls it now."""
        return self._endpoint_subs.add(cb)

    def subscribe_follow(self, cb: Callable[[Follow], None]) -> Callable[[], None]:
        """cb((wanted, added, moved, removed)) after the endpoints polled changed to follow the launches."""
        return self._follow_subs.add(cb)

    def guards(self, nm: NodeMonitor) -> list[GuardResult]:
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
        return nm.last.gpus[0].power_w

    def endpoint_loading(self, snap: EndpointSnapshot) -> tuple[float | None, bool]:
        """How long the container serving at the endpoint has been loading its model, and whether its refusals
        are too new to judge (alerts.LoadWatch)."""
        started, age, listed_rx = self._serving_start(snap)
        unsure = self._loads.unsure(snap.name, snap.healthy, snap.time, listed_rx)
        return self._loads.loading_s(snap.name, snap.healthy, started, age), unsure

    def _serving_start(self, snap: EndpointSnapshot) -> tuple[str | None, float | None, float | None]:
        """The StartedAt of the running container that serves at the endpoint (the launch member there, else the
        node's configured vLLM container for the node's own endpoint), its age on its node's clock, and when its
        node's container list came; Nones where it is not known."""
        m = member_at(self.launches, snap.url)
        em = self.serving.endpoints.get(snap.name) if self.serving is not None else None
        node = m.node if m is not None else (em.config.node if em is not None and em.config.kind == "vllm" else None)
        nm = self.monitor.nodes.get(node) if node else None
        if nm is None or nm.last is None:
            return None, None, None
        name = m.container if m is not None else next((n.container for n in self.cluster.nodes if n.name == node), None)
        c = next((c for c in nm.containers if c.name == name and c.state == "running"), None)
        age = seconds_since(c.started_at, nm.last.time) if c is not None else None
        started = c.started_at if c is not None and age is not None else None
        return started, age if started else None, getattr(nm, "containers_rx", None)

    def endpoint_snapshots(self) -> list[EndpointSnapshot]:
        if self.serving is None:
            return []
        return [em.latest for em in self.serving.endpoints.values() if em.latest is not None]

    # --- the feed: every tick and every poll ----------------------------------------------------------------
    def _node_changed(self, nm: NodeMonitor) -> None:
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
        if not self.role.follows:
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
                if not (self.role.serving and self.role.launch_endpoints):
                    return
                self.serving = self._make_serving(replace(self.cluster, endpoints=()))
                self._unsub.append(self.serving.subscribe(self._endpoint_changed))
                self.duties.serving_started(self.serving)
                await self.serving.start()
            wanted = self._wanted
            added, moved, removed = await self.serving.follow(wanted)
            if added or moved or removed:
                self._follow_subs.notify((wanted, added, moved, removed))

    def _endpoint_changed(self, em: EndpointMonitor) -> None:
        snap = em.latest
        if snap is not None and not self._stopped:
            loading_s, unsure = self.endpoint_loading(snap)
            self.alerts.observe_endpoint(snap, self.endpoint_power(snap.name), loading_s, unsure)
        self._endpoint_subs.notify(em)

    # --- lifecycle --------------------------------------------------------------------------------------------
    def _wire(self) -> None:
        from ..protect import Guardian
        # Everyone forecasts and warns; the guard's action is the duty holder's (duties.py sets its threshold).
        self.guardian = guardian = Guardian(self.cluster, self.alerts, say=self.say, replay=self.role.replay)
        guardian.threshold_s = 0
        self._unsub.append(self.monitor.subscribe(guardian.on_node))
        self._unsub.append(self.monitor.subscribe(self._node_changed))
        if self.serving is not None:
            self._unsub.append(self.serving.subscribe(self._endpoint_changed))

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._wire()
        # A console that may attach learns from its monitor's start whether a collector holds the duties; any other
        # role takes them first, so what the monitor already holds is recorded and notified as it is judged.
        attaching = self.duties.attaching()
        if not attaching:
            await self.duties.start()
        for nm in self.monitor.nodes.values():      # what a monitor already holds is judged now, not at its next tick
            if nm.last is not None:
                self._node_changed(nm)
        await self.monitor.start()
        if attaching:
            await self.duties.start()
        if self.serving is not None:
            await self.serving.start()

    async def stop(self, *, flush_s: float = 0.0, settle: bool = True) -> None:
        """Stops the monitors; waits for the guard's stops and the post-mortems under way (settle; a console
        quitting does not wait for them); closes (checkpoints) the recorder file and sends what the notifier still
        holds for up to flush_s seconds."""
        if self._stopped:
            return
        self._stopped = True
        await self.duties.stop_pursuing()
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
        self.duties.close(flush_s=flush_s)
