"""A viewer's endpoints (built by AttachedMonitor.serving_for): while its monitor is attached to the collector,
the collector's polls of the same endpoints, published as if they were its own; on its own, polled as ever.

Apart from collector/attach.py so that a viewer whose cluster has no endpoint to show (yet) does not import the
HTTP stack under serving/endpoint.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..config import ClusterConfig, EndpointConfig
from ..serving.endpoint import ServingMonitor
from .seams import Json
from .wire import snapshot_from

if TYPE_CHECKING:
    from .attach import AttachedMonitor


class AttachedServing(ServingMonitor):
    """A viewer's endpoints: while its monitor is attached, no poll of its own, the collector's polls published as
    if they were; on its own, polled as ever."""

    def __init__(self, config: ClusterConfig, monitor: AttachedMonitor, *, interval: float = 1.0) -> None:
        super().__init__(config, interval)
        self.monitor = monitor
        monitor._servings.append(self)

    async def start(self) -> None:
        if self.monitor.attached:
            self._started = True
            return
        await super().start()

    async def follow(self, wanted: Iterable[EndpointConfig]) -> tuple[list[str], list[str], list[str]]:
        started = self._started
        self._started = started and not self.monitor.attached     # attached: new endpoints are not polled here
        try:
            added, moved, removed = await super().follow(wanted)
        finally:
            self._started = started
        for name in (*added, *moved):          # the collector may have sent their polls before we followed
            if (d := self.monitor.endpoint_msgs.get(name)) is not None:
                self.feed(d)
        return added, moved, removed

    def feed(self, d: Json) -> None:
        em = self.endpoints.get(str(d.get("name")))
        if em is None or em.config.url != d.get("url") or self.monitor._local:
            return
        try:
            snap = snapshot_from(d["snap"])
        except (TypeError, ValueError):
            return
        if em.latest is None or snap.time > em.latest.time:
            em._publish(snap)

    async def set_local(self, local: bool) -> None:
        if not self._started:
            return
        for em in list(self.endpoints.values()):
            await (em.start() if local else em.stop())
