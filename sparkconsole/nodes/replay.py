"""Replays a recorded agent session (JSON lines: hello, then ticks) as a node, with no process and no SSH.

For snapshot tests and demos that must be deterministic: the monitor reads the recording through the same
Transport/LineStream path as a live node.

    mon = ClusterMonitor(cluster, transport_factory=replay_factory({"spark1": "tests/fixtures/agent-h100-load.jsonl"},
                                                                   speed=0))   # 0: as fast as read
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Mapping

from ..config import NodeConfig, SshPolicy
from .transport import CommandResult, LineStream, Transport, TransportError


def load_recording(path: str | Path) -> list[str]:
    return [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


class ReplayTransport(Transport):
    """`stream()` yields the recording's lines, paced by their own timestamps / speed; `run()` is refused."""

    python = "replay"

    def __init__(self, node: NodeConfig, lines: Sequence[str], *, speed: float = 1.0, loop: bool = False,
                 retime: bool = True) -> None:
        self.node = node
        self.lines = list(lines)
        self.speed = speed
        self.loop = loop
        self.retime = retime      # stamp ticks with the replay's own clock, so staleness reads as live
        self._open = False

    @property
    def connected(self) -> bool:
        return self._open

    async def connect(self) -> None:
        self._open = True

    async def run(self, argv, *, input: bytes | None = None, timeout: float | None = 30) -> CommandResult:
        raise TransportError(f"{self.node.name}: a replayed node runs no commands")

    def stream(self, argv, *, input: bytes | None = None) -> LineStream:
        state = {"i": 0, "prev": None, "done": False, "seq": 0}

        async def read() -> bytes:
            while True:
                if state["done"] or not self.lines:
                    return b""
                if state["i"] >= len(self.lines):
                    if not self.loop:
                        state["done"] = True
                        return b""
                    state["i"], state["prev"] = 0, None
                line = self.lines[state["i"]]
                state["i"] += 1
                try:
                    d = json.loads(line)
                except ValueError:
                    return (line + "\n").encode()         # bad lines are replayed as they were recorded
                if not isinstance(d, dict):
                    return (line + "\n").encode()
                if d.get("type") == "hello" and state["seq"]:
                    continue                              # a looped recording says hello once
                t = d.get("time")
                if self.speed and isinstance(t, (int, float)) and state["prev"] is not None:
                    await asyncio.sleep(max(0.0, (t - state["prev"]) / self.speed))
                else:
                    await asyncio.sleep(0)               # speed 0 still lets the event loop breathe
                if isinstance(t, (int, float)):
                    state["prev"] = t
                if d.get("type") == "tick":
                    d["seq"] = state["seq"]
                    state["seq"] += 1
                    if self.retime:
                        d["time"] = time.time()
                elif d.get("type") == "hello" and self.retime:
                    d["time"] = time.time()
                return (json.dumps(d, separators=(",", ":")) + "\n").encode()

        async def closer() -> None:
            state["done"] = True

        return LineStream(read, closer, lambda: 0 if state["done"] else None)

    async def close(self) -> None:
        self._open = False

    def describe(self) -> str:
        return f"{self.node.name} (replay)"


def replay_factory(recordings: Mapping[str, str | Path] | str | Path, **kw) -> Callable[[NodeConfig, SshPolicy], Transport]:
    """A ClusterMonitor transport_factory: each node replays its recording (one path: every node the same)."""
    cache: dict[str, list[str]] = {}

    def lines_for(path: str | Path) -> list[str]:
        key = str(path)
        if key not in cache:
            cache[key] = load_recording(path)
        return cache[key]

    def factory(node: NodeConfig, policy: SshPolicy, **_: object) -> Transport:
        path = recordings.get(node.name) if isinstance(recordings, Mapping) else recordings
        if path is None:
            raise TransportError(f"{node.name}: no recording to replay")
        return ReplayTransport(node, lines_for(path), **kw)

    return factory
