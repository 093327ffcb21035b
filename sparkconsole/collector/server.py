"""The collector's Unix socket: every viewer attached to it gets the current state, then each change (wire.py).

    server = CollectorServer(core, socket_path(cluster), info={"pid": …, "since": …, "role": "record"})
    await server.start(); ...; await server.stop()

Only the process holding the cluster's writer lock serves it (a socket file left by a SIGKILLed collector is
removed first). What it holds for viewers is bounded: at most MAX_VIEWERS at once (one more is told so in a `bye`
and closed), and a viewer that reads too slowly to keep up (more than MAX_BEHIND bytes waiting for it past its
first snapshot) is sent nothing more but a `bye` saying why, closed, and cut off BYE_WAIT_S later if it has not
read that far: it attaches again and starts from the current state.
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
MAX_BEHIND = 1 << 20          # bytes queued for one viewer past its snapshot before it is dropped (32 nodes: ~15 s)
MAX_VIEWERS = 64              # viewers at once (a console, status, exporter, a browser tab each)
BYE_WAIT_S = 5.0              # a dropped viewer has this long to read up to its `bye` before it is cut off


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
        self._clients: dict[asyncio.StreamWriter, int] = {}     # viewer -> bytes it may have waiting
        self.dropped = 0                                       # viewers dropped for falling behind
        self.refused = 0                                       # viewers refused past MAX_VIEWERS
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
            self._clients.pop(writer, None)
            return
        writer.write(data)
        behind = writer.transport.get_write_buffer_size()
        if behind > self._clients.get(writer, 0):
            self.dropped += 1
            log.warning("collector: a viewer fell %d bytes behind; dropped", behind)
            self._bye(writer, f"this viewer fell {behind >> 10} KiB behind the collector (it reads too slowly): "
                              "dropped; it attaches again from the current state")

    def _bye(self, writer: asyncio.StreamWriter, why: str) -> None:
        """Nothing more for this viewer but a `bye` saying why, after what it has not read yet; then closed, and
        cut off (what waits for it freed) if it has not read that far within BYE_WAIT_S."""
        self._clients.pop(writer, None)
        writer.write(encode("bye", reason=why))
        writer.close()
        asyncio.get_running_loop().call_later(BYE_WAIT_S, _cut, writer)

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
        if len(self._clients) >= MAX_VIEWERS:
            self.refused += 1
            log.warning("collector: %d viewers attached already; one more refused", MAX_VIEWERS)
            self._bye(writer, f"the collector serves {MAX_VIEWERS} viewers already: this one watches on its own")
            return
        snapshot = self.snapshot()
        for data in snapshot:
            writer.write(data)
        self._clients[writer] = sum(map(len, snapshot)) + MAX_BEHIND
        try:
            while await reader.read(4096):     # viewers send nothing; this waits for them to leave
                pass
        except (ConnectionError, OSError):
            pass
        finally:
            self._clients.pop(writer, None)
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


def _cut(writer: asyncio.StreamWriter) -> None:
    """A dropped viewer that did not read up to its `bye` in time: what still waits for it is let go."""
    if writer.transport.get_write_buffer_size():
        writer.transport.abort()
