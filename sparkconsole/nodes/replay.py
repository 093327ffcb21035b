"""Replays a recorded agent session (JSON lines: hello, then ticks) as a node, with no process and no SSH.

For tests, screenshots, demos and the console benchmark that must be deterministic: the monitor reads the
recording through the same Transport/LineStream path as a live node.

    mon = ClusterMonitor(cluster, transport_factory=replay_factory({"spark1": "tests/fixtures/agent-h100-load.jsonl"},
                                                                   speed=0, loop=False))   # 0: as fast as read

Pacing is either by the recording's own timestamps (`speed=`: 1 real time, 10 ten times faster, 0 as fast as
read) or by a fixed `interval=` between ticks (the default: the hello's interval_s, else 0.5 s; it may be changed
while playing). Ticks are renumbered (seq from 0 in each stream) and re-stamped with the console's clock (so
staleness reads as live); the hello is said once per stream, even when looping; lines that are not JSON objects are
replayed verbatim, as a node would have sent them. `stop_after` / `drop_after` make the node go silent (STALE) or
lose its connection (DOWN) after that many ticks. `docker logs` streams play `logs`. Every `run()` and `stream()`
command is kept in `.commands`; `run()` answers from `replies` (first matching substring wins, else rc 0), or is
refused with `runs_commands=False`.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import NodeConfig, SshPolicy
from .recording import load_recording, read_recording, split_recording  # noqa: F401  (re-exported)
from .transport import CommandResult, LineStream, Transport, TransportError


def _text(argv: Sequence[str] | str) -> str:
    return argv if isinstance(argv, str) else shlex.join(argv)


class _Stream:
    """The state of one open stream: pulled line by line, ended by the recording, a drop, or close()."""

    def __init__(self) -> None:
        self.i = 0                    # next line of the recording
        self.prev: float | None = None  # the recorded time of the last line played (speed pacing)
        self.seq = 0                  # ticks played in this stream
        self.hello_said = False
        self.rc: int | None = None
        self.closed = asyncio.Event()

    def end(self, rc: int) -> bytes:
        if self.rc is None:
            self.rc = rc
        return b""

    async def silent(self) -> bytes:
        """Keep the stream open and say nothing until it is closed."""
        await self.closed.wait()
        return self.end(143)

    async def close(self) -> None:
        if self.rc is None:
            self.rc = 143
        self.closed.set()

    def stream(self, read: Callable[[], Awaitable[bytes]]) -> LineStream:
        async def guarded() -> bytes:
            if self.closed.is_set() or self.rc is not None:
                return b""
            return await read()
        return LineStream(guarded, self.close, lambda: self.rc)


class ReplayTransport(Transport):
    """Plays `lines` (a hello line then ticks) as the agent's output; see the module docstring.

    speed: pace by the recorded timestamps divided by speed (0: as fast as read). Exclusive with interval.
    interval: seconds between ticks (default, when speed is not given: the hello's interval_s, else 0.5).
    loop: start again at the first line when the recording ends (the hello is not repeated); without it the
        stream ends there, as an agent that exits would (the node goes DOWN).
    retime: stamp hello and ticks with the replay's own clock.
    logs: the lines a `docker logs` stream plays (then it follows, silent, until closed).
    replies: run() answers, by the first key found as a substring of the command; else rc 0.
    runs_commands: False: run() is refused with a TransportError (a node that must not be commanded).
    stop_after: emit this many ticks, then keep the stream open and silent (the node goes STALE).
    drop_after: emit this many ticks, then end the stream as a lost connection would (the node goes DOWN);
        later connects fail with TransportError.
    """

    python = "replay"

    def __init__(self, node: NodeConfig, lines: Sequence[str], *, speed: float | None = None,
                 interval: float | None = None, loop: bool = True, retime: bool = True,
                 logs: Sequence[str] = (), replies: Mapping[str, CommandResult] | None = None,
                 runs_commands: bool = True, stop_after: int | None = None, drop_after: int | None = None) -> None:
        if speed is not None and interval is not None:
            raise ValueError("give speed= (recorded time) or interval= (fixed), not both")
        self.node = node
        self.lines = [line for line in lines if line.strip()]
        self.hello, self.ticks = split_recording(self.lines)
        self.speed = speed
        self.interval = (interval if interval is not None else float(self.hello.get("interval_s") or 0.5)) \
            if speed is None else None
        self.loop = loop
        self.retime = retime
        self.logs = list(logs)
        self.replies = dict(replies or {})
        self.runs_commands = runs_commands
        self.stop_after = stop_after
        self.drop_after = drop_after
        self.commands: list[str] = []
        self.emitted = 0              # ticks played over every stream (stop_after, drop_after)
        self._connected = False
        self._dropped = False
        self._streams: list[_Stream] = []

    @property
    def connected(self) -> bool:
        return self._connected

    async def connect(self) -> None:
        if self._dropped:
            raise TransportError(f"{self.node.name}: connection refused (replay ended)")
        self._connected = True

    async def run(self, argv: Sequence[str] | str, *, input: bytes | None = None,
                  timeout: float | None = 30) -> CommandResult:
        text = _text(argv)
        self.commands.append(text)
        if not self.runs_commands:
            raise TransportError(f"{self.node.name}: a replayed node runs no commands")
        if not self._connected:
            raise TransportError(f"{self.node.name}: not connected")
        for needle, result in self.replies.items():
            if needle in text:
                return result
        return CommandResult(0, "", "")

    def stream(self, argv: Sequence[str] | str, *, input: bytes | None = None) -> LineStream:
        text = _text(argv)
        self.commands.append(text if len(text) < 300 else text[:300] + "…")
        st = _Stream()
        self._streams.append(st)
        if "docker" in text and " logs" in text:
            return st.stream(lambda: self._log_line(st))
        return st.stream(lambda: self._agent_line(st))

    async def _log_line(self, st: _Stream) -> bytes:
        await asyncio.sleep(0)
        if st.i < len(self.logs):
            st.i += 1
            return (self.logs[st.i - 1] + "\n").encode()
        return await st.silent()              # -f: follow until closed

    async def _pace(self, st: _Stream, d: dict[str, Any]) -> None:
        t = d.get("time")
        if self.speed is not None:
            if self.speed and isinstance(t, (int, float)) and st.prev is not None:
                await asyncio.sleep(max(0.0, (t - st.prev) / self.speed))
            else:
                await asyncio.sleep(0)        # speed 0 still lets the event loop breathe
        elif d.get("type") == "tick" and st.seq:
            await asyncio.sleep(self.interval or 0)
        else:
            await asyncio.sleep(0)
        if isinstance(t, (int, float)):
            st.prev = t

    async def _agent_line(self, st: _Stream) -> bytes:
        while True:
            if st.i >= len(self.lines):
                if not self.loop:
                    return st.end(0)
                if not self.ticks:
                    return await st.silent()
                st.i, st.prev = 0, None
            line = self.lines[st.i]
            st.i += 1
            try:
                d = json.loads(line)
            except ValueError:
                d = None
            if not isinstance(d, dict):
                await asyncio.sleep(0)
                return (line + "\n").encode()         # bad lines are replayed as they were recorded
            kind = d.get("type")
            if kind == "hello" and st.hello_said:
                continue                              # a looped recording says hello once
            await self._pace(st, d)
            if st.closed.is_set():
                return st.end(143)
            if kind == "tick":
                if self.drop_after is not None and self.emitted >= self.drop_after:
                    self._connected = False
                    self._dropped = True
                    return st.end(0)
                if self.stop_after is not None and self.emitted >= self.stop_after:
                    return await st.silent()
                d["seq"] = st.seq
                st.seq += 1
                self.emitted += 1
                if self.retime:
                    d["time"] = time.time()
            elif kind == "hello":
                st.hello_said = True
                if self.retime:
                    d["time"] = time.time()
            return (json.dumps(d, separators=(",", ":")) + "\n").encode()

    async def close(self) -> None:
        for st in self._streams:
            await st.close()
        self._streams.clear()
        self._connected = False

    def describe(self) -> str:
        return f"{self.node.name} (replay)"


Recordings = Mapping[str, "str | Path | Sequence[str]"] | str | Path | Callable[[NodeConfig], Sequence[str]]


def replay_factory(recordings: Recordings, **kwargs: Any) -> Callable[..., ReplayTransport]:
    """A ClusterMonitor `transport_factory`: each node plays its recording.

    recordings: {node name: path or lines}, one path for every node, or a function node -> lines.
    kwargs go to every ReplayTransport; `per_node={name: {...}}` overrides them for one node.
    The transports made are kept in `factory.made` (name -> the latest transport) so tests can inspect commands.
    """
    per_node: dict[str, dict[str, Any]] = kwargs.pop("per_node", {})
    made: dict[str, ReplayTransport] = {}
    cache: dict[str, list[str]] = {}

    def lines_of(src: str | Path | Sequence[str]) -> Sequence[str]:
        if isinstance(src, (str, Path)):
            key = str(src)
            if key not in cache:
                cache[key] = load_recording(src)
            return cache[key]
        return src

    def factory(node: NodeConfig, policy: SshPolicy | None = None, **_: object) -> ReplayTransport:
        src: str | Path | Sequence[str] | None
        if callable(recordings):
            src = recordings(node)
        elif isinstance(recordings, Mapping):
            src = recordings.get(node.name)
        else:
            src = recordings
        if src is None:
            raise TransportError(f"{node.name}: no recording to replay")
        t = ReplayTransport(node, lines_of(src), **{**kwargs, **per_node.get(node.name, {})})
        made[node.name] = t
        return t

    factory.made = made  # type: ignore[attr-defined]
    return factory
