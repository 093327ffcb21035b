"""A ServingMonitor for a simulated cluster that is still coming up: each endpoint is polled only once the
simulator has seen it answer /health, so a model that is loading reads "not polled yet" in the console instead
of DOWN (and raises no endpoint-down alert, no bell) for the seconds the demo takes to serve."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..config import ClusterConfig
from ..serving.endpoint import EndpointMonitor, ServingMonitor


class StagedServing(ServingMonitor):
    def __init__(self, config: ClusterConfig, ready: dict[str, asyncio.Event], **kw: Any) -> None:
        super().__init__(config, **kw)
        self._ready = ready
        self._waiters: list[asyncio.Task[None]] = []

    async def _start_endpoint(self, name: str, mon: EndpointMonitor) -> None:
        # Also for an endpoint followed later (a workload's, once its containers are listed): ServingMonitor.follow
        # starts it through here.
        event = self._ready.get(name)
        if event is None or event.is_set():
            await mon.start()
        else:
            self._waiters.append(asyncio.create_task(self._start_when_ready(event, mon), name=f"staged-{name}"))

    async def _start_when_ready(self, event: asyncio.Event, mon: EndpointMonitor) -> None:
        await event.wait()
        await mon.start()

    async def stop(self) -> None:
        for t in self._waiters:
            t.cancel()
        for t in self._waiters:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._waiters.clear()
        await super().stop()
