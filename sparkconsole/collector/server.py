"""The collector's Unix socket: every viewer attached to it gets the current state, then each change (wire.py).

    server = CollectorServer(core, socket_path(cluster), info={"pid": …, "since": …, "role": "record"})
    await server.start(); ...; await server.stop()

Only the process holding the cluster's writer lock serves it (a socket file left by a SIGKILLed collector is
removed first). A viewer that reads too slowly to keep up is dropped rather than held in memory: it attaches
again and starts from the current state.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .seams import Core, Json
from .wire import BEAT_S, ShortPath, encode

if TYPE_CHECKING:
    from ..alerts import Alert
    from ..nodes.monitor import AgentLine, NodeMonitor
    from ..serving.endpoint import EndpointMonitor

log = logging.getLogger(__name__)

SNAPSHOT_TICKS = 120          # ticks per node a new viewer gets (a minute at 2 Hz: its graphs start filled)
MAX_BUFFERED = 8 << 20        # bytes queued for one viewer before it is dropped


class _NodeWire:
    def __init__(self) -> None:
        self.hello: tuple[float, str] | None = None
        self.ticks: collections.deque[tuple[float, float, str]] = collections.deque(maxlen=SNAPSHOT_TICKS)
        self.containers: list[Any] | None = None        # the agent's containers list, as it last sent one
        self.state: tuple[Any, ...] | None = None


class CollectorServer:
    def __init__(self, core: Core, path: Path, info: Json) -> None:
        self.core = core
        self.path = Path(path)
        self.info = info
        self.nodes: dict[str, _NodeWire] = {name: _NodeWire() for name in core.monitor.nodes}
        self.endpoints: dict[str, bytes] = {}       # name -> its last poll, as sent
        self._clients: set[asyncio.StreamWriter] = set()
        self._server: asyncio.AbstractServer | None = None
        self._beat: asyncio.Task[None] | None = None
        self._unsub: list[Callable[[], None]] = []

    # --- what the monitors say ------------------------------------------------------------------------------
    def _on_line(self, item: AgentLine) -> None:
        nm, d, rx, line = item
        w = self.nodes.get(nm.name)
        if w is None:
            return
        if d.get("type") == "hello":
            w.hello = (rx, line)
            self._send(encode("hello", node=nm.name, rx=rx, line=line))
            return
        if isinstance(d.get("containers"), list):
            w.containers = d["containers"]
        assert nm.last is not None           # a tick line is passed on once it is the node's last tick
        t = nm.last.time
        w.ticks.append((rx, t, line))
        self._send(encode("tick", node=nm.name, rx=rx, time=t, line=line))

    def _node_msg(self, nm: NodeMonitor) -> bytes:
        return encode("node", node=nm.name, state=nm.state.value, since=nm.since, error=nm.last_error,
                      bad_lines=nm.bad_lines, reboots=nm.reboots)

    def _on_node(self, nm: NodeMonitor) -> None:
        w = self.nodes.get(nm.name)
        state = (nm.state, nm.since, nm.last_error)
        if w is None or state == w.state:
            return
        w.state = state
        self._send(self._node_msg(nm))

    def _on_endpoint(self, em: EndpointMonitor) -> None:
        snap = em.latest
        if snap is None:
            return
        data = encode("endpoint", name=snap.name, url=em.config.url, node=em.config.node, snap=asdict(snap))
        self.endpoints[snap.name] = data
        self._send(data)

    def _on_alert(self, alert: Alert) -> None:
        self._send(encode("alert", **asdict(alert)))

    # --- viewers ---------------------------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        for writer in list(self._clients):
            self._write(writer, data)

    def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        if writer.is_closing():
            self._clients.discard(writer)
            return
        writer.write(data)
        if writer.transport.get_write_buffer_size() > MAX_BUFFERED:
            log.warning("collector: a viewer fell %d bytes behind; dropped", MAX_BUFFERED)
            self._clients.discard(writer)
            writer.transport.abort()

    def snapshot(self) -> list[bytes]:
        out = [encode("collector", **self.info)]
        for name, nm in self.core.monitor.nodes.items():
            w = self.nodes[name]
            if w.hello is not None:
                out.append(encode("hello", node=name, rx=w.hello[0], line=w.hello[1]))
            ticks = list(w.ticks)
            for i, (rx, t, line) in enumerate(ticks):
                if i == len(ticks) - 1 and w.containers is not None and '"containers"' not in line:
                    d = json.loads(line)          # the last tick carries the containers the node has now
                    d["containers"] = w.containers
                    line = json.dumps(d, separators=(",", ":"))
                out.append(encode("tick", node=name, rx=rx, time=t, line=line))
            out.append(self._node_msg(nm))
        out += list(self.endpoints.values())
        out += [encode("alert", **asdict(a)) for a in self.core.alerts.active.values()]
        out.append(encode("ready"))
        return out

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for data in self.snapshot():
            writer.write(data)
        self._clients.add(writer)
        try:
            while await reader.read(4096):     # viewers send nothing; this waits for them to leave
                pass
        except (ConnectionError, OSError):
            pass
        finally:
            self._clients.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def start(self) -> None:
        mon = self.core.monitor
        for nm in mon.nodes.values():
            self._unsub.append(nm.subscribe_lines(self._on_line))
        self._unsub.append(mon.subscribe(self._on_node))
        self._unsub.append(self.core.alerts.subscribe(self._on_alert))
        self._unsub.append(self.core.subscribe_endpoints(self._on_endpoint))
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.path.parent, 0o700)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()                 # left by a collector that was killed: we hold the lock now
        with ShortPath(self.path) as where:
            self._server = await asyncio.start_unix_server(self._client, path=where, limit=1 << 16)
        os.chmod(self.path, 0o600)
        self._beat = asyncio.get_running_loop().create_task(self._beats(), name="collector:beat")

    async def _beats(self) -> None:
        beat = encode("beat")
        while True:
            await asyncio.sleep(BEAT_S)
            self._send(beat)

    async def stop(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
            self._beat = None
        for unsub in self._unsub:
            unsub()
        self._unsub.clear()
        if self._server is not None:
            self._server.close()
            for writer in list(self._clients):
                writer.close()
            self._clients.clear()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
