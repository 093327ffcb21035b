"""What the exporter reads from: the same ClusterMonitor and ServingMonitor the console builds, and an AlertEngine
fed as the console feeds it (every node tick and endpoint poll observed), so /metrics shows the alerts the console
would raise. Everything here is updated by the monitors' own tasks; a scrape only reads it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..alerts import AlertEngine
from ..config import ClusterConfig
from ..nodes.guard import GuardResult, evaluate_guards
from ..nodes.launches import launch_groups, served_endpoints


def guards_of(nm) -> list[GuardResult]:
    """The OOM guards of a node from its last tick (the console's guards_for, below the TUI)."""
    t = nm.last
    if t is None:
        return []
    return evaluate_guards(t.guards, t.mem, nm.containers, nm.config.container)


class Readings:
    """The monitors (built from the cluster unless given) and the alert engine over them.

    monitor: a ClusterMonitor (or anything with .nodes, .subscribe, .start, .stop); built with the project's
    transports when None. serving: a ServingMonitor, or None for one over the cluster's endpoints (when any)."""

    def __init__(self, cluster: ClusterConfig, *, monitor=None, serving=None, alerts: AlertEngine | None = None,
                 with_serving: bool = True) -> None:
        self.cluster = cluster
        if monitor is None:
            from ..nodes.monitor import ClusterMonitor
            monitor = ClusterMonitor(cluster, history=16)   # the exporter keeps no history: the last tick is enough
        if serving is None and with_serving and cluster.endpoints:
            from ..serving.endpoint import ServingMonitor
            serving = ServingMonitor(cluster, history=16)
        self.monitor = monitor
        self.serving = serving
        self.alerts = alerts or AlertEngine(cluster.thresholds)
        self._unsub: list[Callable[[], None]] = []
        self._guards: dict[str, tuple[object, tuple, list[GuardResult]]] = {}   # name -> (tick, containers, results)
        self._ep_node = {e.name: e.node for e in cluster.endpoints}
        self._wanted = tuple(cluster.endpoints)
        self._follow_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

    # --- feeding the alert engine, as the console does on each redraw -------------------------------------
    def guards(self, nm) -> list[GuardResult]:
        """guards_of(nm), computed once per tick (the alert feed and every scrape read the same results)."""
        cached = self._guards.get(nm.name)
        if cached is not None and cached[0] is nm.last and cached[1] is nm.containers:
            return cached[2]
        results = guards_of(nm)
        self._guards[nm.name] = (nm.last, nm.containers, results)
        return results

    def _node_changed(self, nm) -> None:
        self.alerts.observe_node(nm, self.guards(nm))
        if self.serving is None:
            return
        # the console's rule: poll where the launches serve (a recipe's own port, a router)
        wanted = served_endpoints(launch_groups(self.monitor.nodes.values()), self.cluster.endpoints)
        if wanted != self._wanted:
            self._wanted = wanted
            task = asyncio.get_running_loop().create_task(self._follow())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _follow(self) -> None:
        async with self._follow_lock:
            wanted = self._wanted
            await self.serving.follow(wanted)
            self._ep_node = {e.name: e.node for e in wanted}

    def _endpoint_changed(self, em) -> None:
        snap = getattr(em, "latest", None)
        if snap is not None:
            self.alerts.observe_endpoint(snap, self._endpoint_power(snap.name))

    def endpoint_node(self, name: str) -> str | None:
        return self._ep_node.get(name)

    def _endpoint_power(self, name: str) -> float | None:
        node = self._ep_node.get(name)
        nm = self.monitor.nodes.get(node) if node else None
        if nm is None or nm.last is None or not nm.last.gpus:
            return None
        return nm.last.gpus[0].power_w

    async def start(self) -> None:
        self._unsub.append(self.monitor.subscribe(self._node_changed))
        if self.serving is not None:
            self._unsub.append(self.serving.subscribe(self._endpoint_changed))
        await self.monitor.start()
        if self.serving is not None:
            await self.serving.start()

    async def stop(self) -> None:
        for unsub in self._unsub:
            unsub()
        self._unsub.clear()
        if self.serving is not None:
            await self.serving.stop()
        await self.monitor.stop()

    def endpoint_snapshots(self) -> list:
        if self.serving is None:
            return []
        return [em.latest for em in self.serving.endpoints.values() if em.latest is not None]
