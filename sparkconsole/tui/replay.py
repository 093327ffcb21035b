"""A Transport that replays recorded agent JSON lines, for tests, screenshots and the console benchmark.

The node-side agent is not run: the agent stream yields the recording's hello line, then its tick lines
re-stamped with the console's clock (so staleness works), paced at the recorded interval (or a given one).
`docker logs` streams play a recorded log. Every `run()` is kept in `.commands`, so tests can check the exact
command a confirmation sent; replies come from `replies` (first matching substring wins), else rc 0.

Recordings are agent JSON lines exactly as the agent printed them on a real node (tests/fixtures/agent-*.jsonl).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..config import NodeConfig, SshPolicy
from ..nodes.transport import CommandResult, LineStream, Transport, TransportError
from .recording import read_recording, split_recording  # noqa: F401  (re-exported for tests and scripts)


def _text(argv: Sequence[str] | str) -> str:
    return argv if isinstance(argv, str) else shlex.join(argv)


class _Feed:
    """Bytes for a real LineStream, produced by a task; ending the task ends the stream like a remote exit."""

    def __init__(self, produce) -> None:
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.rc: int | None = None
        self.task = asyncio.get_running_loop().create_task(self._run(produce))
        self.stream = LineStream(self._queue.get, self.close, lambda: self.rc)

    async def _run(self, produce) -> None:
        try:
            await produce(self)
            self.rc = 0
        except asyncio.CancelledError:
            self.rc = 143
            raise
        finally:
            self._queue.put_nowait(b"")

    def put(self, line: str) -> None:
        self._queue.put_nowait(line.encode() + b"\n")

    async def close(self) -> None:
        if not self.task.done():
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass


class ReplayTransport(Transport):
    """Plays `lines` (a hello line then ticks) as the agent's output.

    interval: seconds between ticks (default: the hello's interval_s, else 0.5).
    loop: start again at the first tick when the recording ends (seq keeps counting).
    stop_after: emit this many ticks, then keep the stream open and silent (the node goes STALE).
    drop_after: emit this many ticks, then end the stream as a lost connection would (the node goes DOWN);
        later connects fail with TransportError.
    """

    def __init__(self, node: NodeConfig, lines: Sequence[str], *, interval: float | None = None, loop: bool = True,
                 logs: Sequence[str] = (), replies: dict[str, CommandResult] | None = None,
                 stop_after: int | None = None, drop_after: int | None = None) -> None:
        self.node = node
        self.hello, self.ticks = split_recording(lines)
        self.interval = interval if interval is not None else float(self.hello.get("interval_s") or 0.5)
        self.loop = loop
        self.logs = list(logs)
        self.replies = dict(replies or {})
        self.stop_after = stop_after
        self.drop_after = drop_after
        self.commands: list[str] = []
        self.emitted = 0
        self._connected = False
        self._dropped = False
        self._streams: list[_Feed] = []

    @property
    def connected(self) -> bool:
        return self._connected

    async def connect(self) -> None:
        if self._dropped:
            raise TransportError(f"{self.node.name}: connection refused (replay ended)")
        self._connected = True

    async def run(self, argv: Sequence[str] | str, *, input: bytes | None = None,
                  timeout: float | None = 30) -> CommandResult:
        if not self._connected:
            raise TransportError(f"{self.node.name}: not connected")
        text = _text(argv)
        self.commands.append(text)
        for needle, result in self.replies.items():
            if needle in text:
                return result
        return CommandResult(0, "", "")

    def stream(self, argv: Sequence[str] | str, *, input: bytes | None = None) -> LineStream:
        text = _text(argv)
        self.commands.append(text if len(text) < 300 else text[:300] + "…")
        produce = self._logs if "docker" in text and " logs" in text else self._agent
        feed = _Feed(produce)
        self._streams.append(feed)
        return feed.stream

    async def _logs(self, s: _Feed) -> None:
        for line in self.logs:
            s.put(line)
        await asyncio.Event().wait()        # -f: follow until closed

    async def _agent(self, s: _Feed) -> None:
        if self.hello:
            s.put(json.dumps({**self.hello, "time": time.time()}))
        if not self.ticks:
            await asyncio.Event().wait()
        i = 0
        while True:
            if self.drop_after is not None and self.emitted >= self.drop_after:
                self._connected = False
                self._dropped = True
                return
            if self.stop_after is not None and self.emitted >= self.stop_after:
                await asyncio.Event().wait()
            if i >= len(self.ticks):
                if not self.loop:
                    await asyncio.Event().wait()
                i = 0
            self.emitted += 1
            s.put(json.dumps({**self.ticks[i], "seq": self.emitted, "time": time.time()}))
            i += 1
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        for s in self._streams:
            await s.close()
        self._streams.clear()
        self._connected = False


def replay_factory(recordings: dict[str, Sequence[str]] | Callable[[NodeConfig], Sequence[str]], **kwargs
                   ) -> Callable[..., ReplayTransport]:
    """A `transport_factory` for ClusterMonitor: each node plays its recording (by name, or from a function).

    The transports made are kept in `factory.made` (name -> transport) so tests can inspect commands.
    kwargs go to every ReplayTransport; `per_node={name: {...}}` overrides them for one node.
    """
    per_node: dict[str, dict] = kwargs.pop("per_node", {})
    made: dict[str, ReplayTransport] = {}

    def factory(node: NodeConfig, policy: SshPolicy | None = None, *, confirm_new_host=None) -> ReplayTransport:
        lines = recordings(node) if callable(recordings) else recordings[node.name]
        t = ReplayTransport(node, lines, **{**kwargs, **per_node.get(node.name, {})})
        made[node.name] = t
        return t

    factory.made = made  # type: ignore[attr-defined]
    return factory
