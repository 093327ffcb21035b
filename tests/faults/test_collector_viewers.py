"""Viewers of the collector's socket that cost it memory (issue 40): a viewer that stops reading, and more viewers
than the collector serves. The collector's core and socket run in this process over a replayed node sending ticks
fast; the viewers are raw Unix sockets, so a test decides when (and whether) they read.

Before: a viewer that read nothing grew the collector's buffer for it to 8 MiB before it was cut off without a
word, and any number of viewers could attach. Now: the collector keeps at most MAX_BEHIND bytes past a viewer's
snapshot, then sends it a `bye` saying why and closes it (cut off BYE_WAIT_S later if it has not read that far);
one viewer past MAX_VIEWERS gets a `bye` at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import pytest

from sparkconsole.collector import server as collector_server
from sparkconsole.collector.wire import ShortPath

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def collector(tmp_path, monkeypatch):
    """A collector serving its socket over a node replayed at 100 ticks a second."""
    from sparkconsole.collector.core import Collector
    from sparkconsole.collector.lock import socket_path
    from sparkconsole.collector.roles import RECORD, Duty
    from sparkconsole.config import ClusterConfig, NodeConfig
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.nodes.replay import replay_factory

    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    replay = replay_factory(str(ROOT / "tests/fixtures/agent-h100-load.jsonl"), interval=0.01)
    cluster = ClusterConfig(nodes=(NodeConfig(name="spark1", address="127.0.0.1"),), endpoints=(),
                            source=str(tmp_path / "c.yaml"))
    core = Collector(cluster, RECORD.without(Duty.RECORD), ClusterMonitor(cluster, transport_factory=replay))
    server = collector_server.CollectorServer(core, socket_path(cluster), info={"pid": os.getpid(), "role": "record"})
    await server.start()
    await core.start()
    try:
        yield server
    finally:
        await server.stop()
        await core.stop()


def viewer(path: Path) -> socket.socket:
    """A viewer that reads only when the test says: a small receive buffer, so the backlog stays on the collector's side."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    with ShortPath(path) as where:
        s.connect(where)
    s.setblocking(False)
    return s


async def read_all(s: socket.socket, timeout: float = 30) -> list[dict]:
    """Every message until the collector closes the socket."""
    loop = asyncio.get_running_loop()
    buf = b""
    while True:
        chunk = await asyncio.wait_for(loop.sock_recv(s, 1 << 16), timeout)
        if not chunk:
            break
        buf += chunk
    return [json.loads(line) for line in buf.splitlines() if line.strip()]


async def until(pred, timeout: float, what: str) -> None:
    for _ in range(int(timeout / 0.05)):
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.mark.fault("a viewer of the collector's socket that stops reading")
async def test_a_viewer_that_falls_behind_is_told_and_dropped_within_its_bound(collector, monkeypatch):
    monkeypatch.setattr(collector_server, "MAX_BEHIND", 64 << 10)
    server = collector
    await until(lambda: server.core.monitor.nodes["spark1"].last is not None, 20, "the first tick")
    slow = viewer(server.path)
    fast = viewer(server.path)
    loop = asyncio.get_running_loop()
    got_fast = b""
    most = 0
    try:
        await until(lambda: len(server._clients) == 2, 30, "both viewers attached")
        allowance = max(server._clients.values())
        for _ in range(600):                            # the fast one reads all along; the slow one never
            if server.dropped:
                break
            with_slow = [w for w in server._clients if w.transport.get_write_buffer_size() > 0]
            most = max([most, *(w.transport.get_write_buffer_size() for w in with_slow)])
            try:
                got_fast += await asyncio.wait_for(loop.sock_recv(fast, 1 << 16), 0.05)
            except TimeoutError:
                pass
        assert server.dropped == 1 and len(server._clients) == 1, (server.dropped, len(server._clients))
        assert most <= allowance + (16 << 10), (most, allowance)      # never more than its bound and a message
        messages = await read_all(slow)                                # it reads now, within BYE_WAIT_S
        assert messages[-1]["type"] == "bye" and "fell" in messages[-1]["reason"] \
            and "behind" in messages[-1]["reason"], messages[-1]
        assert all(m["type"] != "bye" for m in messages[:-1])
        # the viewer that kept up is still served
        more = len(got_fast)
        got_fast += await asyncio.wait_for(loop.sock_recv(fast, 1 << 16), 10)
        assert len(got_fast) > more
    finally:
        slow.close()
        fast.close()


@pytest.mark.fault("more viewers than the collector serves")
async def test_a_viewer_past_the_limit_is_told_and_the_others_are_served(collector, monkeypatch):
    monkeypatch.setattr(collector_server, "MAX_VIEWERS", 3)
    server = collector
    await until(lambda: server.core.monitor.nodes["spark1"].last is not None, 20, "the first tick")
    first = [viewer(server.path) for _ in range(3)]
    try:
        await until(lambda: len(server._clients) == 3, 30, "three viewers attached")
        extra = viewer(server.path)
        messages = await read_all(extra, timeout=10)
        assert [m["type"] for m in messages] == ["bye"] and "3 viewers already" in messages[0]["reason"], messages
        assert server.refused == 1 and len(server._clients) == 3
        extra.close()
        first.pop().close()                                   # one leaves: the next one is served
        await until(lambda: len(server._clients) == 2, 30, "the one that left gone")
        again = viewer(server.path)
        first.append(again)
        loop = asyncio.get_running_loop()
        head = await asyncio.wait_for(loop.sock_recv(again, 4096), 10)
        assert json.loads(head.splitlines()[0])["type"] == "collector"
    finally:
        for s in first:
            s.close()
