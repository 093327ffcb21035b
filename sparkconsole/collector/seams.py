"""What the core needs of what it is given: small Protocols where a monitor, a serving monitor or the core itself
is passed in. The real ones are nodes/monitor.py's ClusterMonitor (collector/attach.py's AttachedMonitor, a replay),
serving/endpoint.py's ServingMonitor (attach_serving.py's AttachedServing, the demo's StagedServing) and
collector/core.py's Collector; tests and benchmarks hand in their own, which need only this much.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..alerts import AlertEngine
    from ..config import ClusterConfig, EndpointConfig
    from ..nodes.monitor import NodeMonitor
    from ..serving.endpoint import EndpointMonitor

Json = dict[str, Any]          # one decoded JSON object (a wire message, the collector's own line, a lock's holder)


class ClusterWatch(Protocol):
    """Every node of the cluster, watched: a ClusterMonitor or one that acts as it."""

    @property
    def nodes(self) -> Mapping[str, NodeMonitor]: ...
    def subscribe(self, cb: Callable[[NodeMonitor], None]) -> Callable[[], None]: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


@runtime_checkable
class Attaching(Protocol):
    """A ClusterWatch that attaches to the cluster's collector (collector/attach.py): whether it is attached now,
    the collector's own line and active alerts while it was, a call each time that changes, and one line each time
    it attaches, loses its collector or falls back on its own agents."""

    attached: bool
    collector: Json | None
    collector_alerts: dict[str, Json]
    def subscribe_attached(self, cb: Callable[[bool], None]) -> Callable[[], None]: ...
    def subscribe_status(self, cb: Callable[[str, str], None]) -> Callable[[], None]: ...


class EndpointsWatch(Protocol):
    """The endpoints polled: a ServingMonitor or one that acts as it."""

    @property
    def endpoints(self) -> Mapping[str, EndpointMonitor]: ...
    def subscribe(self, cb: Callable[[EndpointMonitor], None]) -> Callable[[], None]: ...
    async def follow(self, wanted: Iterable[EndpointConfig]) -> tuple[list[str], list[str], list[str]]: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


ServingFactory = Callable[["ClusterConfig"], EndpointsWatch]


class Core(Protocol):
    """What the collector's socket (collector/server.py) and the exporter read of the core."""

    @property
    def monitor(self) -> ClusterWatch: ...
    @property
    def alerts(self) -> AlertEngine: ...
    def subscribe_endpoints(self, cb: Callable[[EndpointMonitor], None]) -> Callable[[], None]: ...
