"""A viewer's ClusterMonitor: attached to the cluster's collector when one runs, watching on its own otherwise.

    mon = AttachedMonitor(cluster)                # same .nodes (NodeMonitors), .subscribe, .start, .stop
    mon.subscribe_status(lambda text, severity: ...)   # one line each time it attaches, loses or falls back
    mon.subscribe_attached(lambda attached: ...)       # each time it attaches or loses its collector
    await mon.start()                             # attached (mon.attached) or on its own, said in one line

Attached, the node monitors run no agent: they are fed the agent lines the collector took (collector/wire.py),
parsed by the same NodeMonitor.handle_line, with their STALE / DOWN from the collector and the same staleness
timer as ever (no tick for 3 intervals: STALE). Their transports are made on first use (attached, the SSH stack
is not even imported until then): actions (restart, stop, launch, guard fixes) are the viewer's own, over its own
connection.

Endpoints likewise (attach_serving.AttachedServing, built by `serving_for`): attached, the viewer follows the
same launches to the same endpoints and shows the collector's polls of them; on its own, it polls them itself.

A viewer that loses its collector says so, marks every LIVE node STALE at once (what it shows is no longer
live), and starts its own agents; it tries the socket again every RETRY_S and, when a collector answers, stops
its agents and attaches again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import ClusterConfig, NodeConfig, SshPolicy
from ..nodes.connect import make_transport
from ..nodes.monitor import ClusterMonitor
from ..nodes.samples import NodeState
from ..nodes.transport import Transport
from ..subscribers import Subscribers
from .lock import describe_holder, socket_path
from .seams import Json
from .wire import MAX_LINE, SILENT_S, ShortPath, decode

if TYPE_CHECKING:
    from .attach_serving import AttachedServing

log = logging.getLogger(__name__)

TransportFactory = Callable[[NodeConfig, SshPolicy], Transport]

RETRY_S = 2.0              # how often a viewer on its own looks for a collector again
SNAPSHOT_TIMEOUT_S = 10.0  # a collector that answers sends its current state within this


class AttachedMonitor(ClusterMonitor):
    def __init__(self, config: ClusterConfig, *, socket: Path | None = None,
                 transport_factory: TransportFactory = make_transport,
                 history: int = 600, retry_s: float = RETRY_S) -> None:
        super().__init__(config, transport_factory=lambda node, ssh: _LazyTransport(transport_factory, node, ssh),
                         history=history)
        if socket is None:
            try:
                socket = socket_path(config)
            except OSError:              # no state dir to be had (read-only home): no collector to find either
                socket = None
        self.socket = Path(socket) if socket is not None else None
        self.retry_s = retry_s
        self.attached = False
        self.collector: Json | None = None          # the collector's own line while attached (pid, since, …)
        self.collector_alerts: dict[str, Json] = {}  # its active alerts
        self.status_line = ""
        self.attaches = 0
        self._status_subs: Subscribers[tuple[str, str]] = Subscribers("attach status")
        self._attached_subs: Subscribers[bool] = Subscribers("attached")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._local = False
        self._servings: list[AttachedServing] = []
        self.endpoint_msgs: dict[str, Json] = {}     # each endpoint's last poll from the collector

    def serving_for(self, cluster: ClusterConfig) -> AttachedServing:
        """The ServingMonitor a viewer's core builds (collector/core.py's serving_factory): only once the cluster
        has an endpoint to show, so a viewer without one never imports the HTTP stack (httpx, prometheus_client)."""
        from .attach_serving import AttachedServing
        return AttachedServing(cluster, self)

    def subscribe_status(self, cb: Callable[[str, str], None]) -> Callable[[], None]:
        return self._status_subs.add(lambda item: cb(*item))

    def subscribe_attached(self, cb: Callable[[bool], None]) -> Callable[[], None]:
        """cb(True) once it has attached (the collector's current state read), cb(False) once it has lost it."""
        return self._attached_subs.add(cb)

    def _say(self, text: str, severity: str = "info") -> None:
        self.status_line = text
        self._status_subs.notify((text, severity))

    # --- lifecycle --------------------------------------------------------------------------------------------
    async def probe(self) -> bool:
        """Whether a collector answers on the socket (kept connected: start() attaches over this connection).
        A front end asks before start() to know what to wire (a console records only on its own)."""
        return self._writer is not None or await self._connect()

    async def start(self) -> None:
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch(), name="monitor:stale")
        if await self._attach():
            self._say(f"attached to the cluster's collector, {self._who()}: its agents, one per node")
        else:
            self._say(f"no collector runs for {self.config.source}: watching the nodes on its own "
                      "(`sparkconsole record` is the collector every viewer attaches to)")
            self._go_local()
        self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="monitor:attach")

    async def stop(self) -> None:
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._close()
        await super().stop()

    def _who(self) -> str:
        return describe_holder(self.collector or {})

    # --- attaching -----------------------------------------------------------------------------------------
    async def _connect(self) -> bool:
        if self.socket is None or not self.socket.exists():
            return False
        try:
            with ShortPath(self.socket) as where:
                self._reader, self._writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(where, limit=MAX_LINE), 5)
        except (TimeoutError, OSError):
            return False
        return True

    async def _attach(self) -> bool:
        """Connect (unless probe() did); once the collector has said who it is, stop our own agents and read its
        current state up to `ready`. (A stopped collector's socket still accepts: only its first line counts.)"""
        if self._writer is None and not await self._connect():
            return False
        was_local = False
        try:
            async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):
                d = await self._next()
                if d is None or d["type"] != "collector":
                    raise ConnectionError("closed before it said who it is")
                was_local, self._local = self._local, False
                if was_local:
                    await asyncio.gather(*(nm.stop() for nm in self.nodes.values()), return_exceptions=True)
                self.collector_alerts.clear()
                while d["type"] != "ready":
                    self._apply(d)
                    d = await self._next()
                    if d is None:
                        raise ConnectionError("closed before its state was sent")
        except (TimeoutError, OSError, ValueError) as exc:
            log.info("collector at %s: %s", self.socket, exc)
            self._close()
            if was_local:
                self._go_local()          # it went away while sending its state: on our own again
            return False
        self.attached = True
        self.attaches += 1
        self._servings_local(False)
        self._attached_subs.notify(True)
        return True

    async def _next(self) -> Json | None:
        """The next message; None at the end of the stream."""
        while self._reader is not None:
            line = await self._reader.readline()
            if not line:
                return None
            d = decode(line)
            if d is not None:
                return d
        return None

    def _close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()

    def _apply(self, d: Json) -> None:
        kind = d["type"]
        if kind == "collector":
            self.collector = d
            return
        if kind == "endpoint" and isinstance(d.get("snap"), dict):
            self.endpoint_msgs[str(d.get("name"))] = d
            for serving in self._servings:
                serving.feed(d)
            return
        if kind == "alert":
            if d.get("active"):
                self.collector_alerts[str(d.get("key"))] = d
            else:
                self.collector_alerts.pop(str(d.get("key")), None)
            return
        nm = self.nodes.get(str(d.get("node")))
        if nm is None:
            return
        if kind in ("hello", "tick") and isinstance(d.get("line"), str):
            if kind == "tick" and nm.last is not None and isinstance(d.get("time"), (int, float)) \
                    and d["time"] <= nm.last.time:
                return        # older than what we have (our own agent's ticks before we attached again)
            rx = d.get("rx")
            nm.handle_line(d["line"], rx if isinstance(rx, (int, float)) else time.time())
        elif kind == "node":
            try:
                state = NodeState(d.get("state"))
            except ValueError:
                return
            for key in ("bad_lines", "reboots"):
                if isinstance(d.get(key), int):
                    setattr(nm, key, d[key])
            if state != NodeState.LIVE:      # LIVE is what ticks make; a state they cannot show comes from here
                nm._set_state(state, d.get("error") if isinstance(d.get("error"), str) else None)
                if isinstance(d.get("since"), (int, float)):
                    nm.since = d["since"]

    # --- following the collector, or watching on our own ---------------------------------------------------
    def _servings_local(self, local: bool) -> None:
        for serving in self._servings:
            asyncio.get_running_loop().create_task(serving.set_local(local))

    def _go_local(self) -> None:
        self._local = True
        self._servings_local(True)
        for nm in self.nodes.values():
            if nm.transport is not None:
                nm.start()

    def _lost(self, why: str) -> None:
        self.attached = False
        self._close()
        for nm in self.nodes.values():
            if nm.state == NodeState.LIVE:
                nm._set_state(NodeState.STALE, "the collector is gone")
        self._say(f"lost the collector ({self._who()}: {why}): the nodes are STALE until this viewer's own agents "
                  "read them; it attaches again when a collector runs", "warn")
        self._go_local()
        self._attached_subs.notify(False)

    async def _run(self) -> None:
        while True:
            if self.attached:
                try:
                    while (d := await asyncio.wait_for(self._next(), SILENT_S)) is not None:
                        self._apply(d)
                    why = "it closed its socket"
                except TimeoutError:
                    why = f"not a word from it in {SILENT_S:g} s"
                except (OSError, ValueError) as exc:
                    why = " ".join(str(exc).split())[:120] or type(exc).__name__
                self._lost(why)
            await asyncio.sleep(self.retry_s)
            with contextlib.suppress(Exception):
                if await self._attach():
                    self._say(f"attached again to the cluster's collector, {self._who()}; this viewer's own "
                              "agents stopped")


class _LazyTransport:
    """A node's transport, made on its first use."""

    def __init__(self, factory: TransportFactory, node: NodeConfig, ssh: SshPolicy) -> None:
        self._args = (factory, node, ssh)
        self._real: Transport | None = None

    def _get(self) -> Transport:
        if self._real is None:
            factory, node, ssh = self._args
            self._real = factory(node, ssh)
        return self._real

    @property
    def connected(self) -> bool:
        return self._real is not None and self._real.connected

    async def close(self) -> None:
        if self._real is not None:
            await self._real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)
