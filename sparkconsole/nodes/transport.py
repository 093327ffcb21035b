"""What every way of reaching a node shares (the Transport contract, its streams and errors), and this machine
reached directly. `make_transport` (nodes/connect.py) picks the transport for a node; SSH is nodes/ssh.py.

    t = make_transport(node, cluster.ssh)
    await t.connect()                       # host-key mismatch / auth failure -> UserError (one line)
    r = await t.run(["docker", "ps"])       # argv lists are shlex.join'ed; a str is an already-quoted snippet
    s = t.stream(["python3", "-c", code], input=payload)   # async iterator of stdout lines
    async for line in s: ...
    await s.close(); await t.close()

Connection loss and unreachable nodes raise TransportError (one line); the monitor turns it into DOWN.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import os
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..config import NodeConfig

MAX_LINE = 1 << 20          # a longer stdout line is dropped (counted in LineStream.overlong)
# A line still unended after this many bytes never ends (a node printing without a newline): reading it on would
# cost the console a core for nothing, so the stream is dropped and the caller comes back after its back-off.
ENDLESS_LINE = 16 * MAX_LINE
KEEPALIVE_INTERVAL_S = 5.0
KEEPALIVE_COUNT_MAX = 3

ConfirmNewHost = Callable[[str, str], "bool | Awaitable[bool]"]


class TransportError(Exception):
    """The node cannot be reached or the connection was lost. The message is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str


T = TypeVar("T")


async def bounded(aw: Awaitable[T], timeout: float | None) -> T:
    """asyncio.wait_for without Python 3.11's race that can lose the caller's cancellation (a monitor that
    never stops): the caller's cancel always propagates; on timeout the inner work is cancelled and
    asyncio.TimeoutError raised."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())   # retrieved: no "never retrieved"
        raise TimeoutError
    return task.result()


def to_command(argv: Sequence[str] | str) -> str:
    """The shell text a remote shell receives: lists are quoted word by word; a str is taken as written."""
    if isinstance(argv, str):
        return argv
    return shlex.join([str(a) for a in argv])


class LineStream:
    """Async iterator over a running command's stdout lines (text, newline stripped).

    `await close()` ends the command (stdin end-of-file, then the channel/process); `returncode` once ended.
    Lines longer than MAX_LINE are skipped and counted in `overlong`; one still unended past ENDLESS_LINE bytes
    raises TransportError.
    """

    def __init__(self, read: Callable[[], Awaitable[bytes]], closer: Callable[[], Awaitable[None]],
                 returncode: Callable[[], int | None], *, max_line: int = MAX_LINE, endless_line: int = ENDLESS_LINE,
                 lost: tuple[type[BaseException], ...] = ()) -> None:
        self._read = read
        self._lost = (OSError, asyncio.IncompleteReadError) + lost    # what a lost stream raises
        self._closer = closer
        self._returncode = returncode
        self._buf = bytearray()
        self._lines: collections.deque[str] = collections.deque()
        self._eof = False
        self._skipping = False      # inside an overlong line: drop bytes until its newline
        self._skipped = 0           # bytes of that line so far
        self._closing: asyncio.Task[None] | None = None
        self.max_line = max_line
        self.endless_line = endless_line
        self.overlong = 0

    @property
    def returncode(self) -> int | None:
        return self._returncode()

    def __aiter__(self) -> LineStream:
        return self

    async def __anext__(self) -> str:
        while not self._lines:
            if self._eof:
                if self._buf and not self._skipping:
                    tail = bytes(self._buf)
                    self._buf.clear()
                    return tail.decode("utf-8", "replace")
                raise StopAsyncIteration
            try:
                chunk = await self._read()
            except self._lost as exc:
                raise TransportError(f"stream lost: {exc}") from exc
            if not chunk:
                self._eof = True
                continue
            self._feed(chunk)
        return self._lines.popleft()

    def _feed(self, chunk: bytes) -> None:
        parts = chunk.split(b"\n")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if self._skipping:
                self._skipped += len(part)
                if not last:
                    self._skipping = False      # the overlong line ended here
                elif self._skipped > self.endless_line:
                    raise TransportError(f"a line still unended after {self._skipped:,} bytes; stream dropped")
                continue
            self._buf += part
            if len(self._buf) > self.max_line:
                self._skipped = len(self._buf)
                self._buf = bytearray()
                self.overlong += 1
                self._skipping = last           # still inside it: drop bytes until its newline
                continue
            if not last:
                self._lines.append(self._buf.decode("utf-8", "replace"))
                self._buf = bytearray()

    async def close(self) -> None:
        # The closing runs as a task of its own and to its end even when the caller is cancelled (a monitor
        # stopped twice cancels its own teardown): a closer cut short would leave the command running with
        # nobody left to end it. Every caller waits on that one closing.
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._closer())
            self._closing.add_done_callback(lambda t: t.cancelled() or t.exception())   # retrieved
        await asyncio.shield(self._closing)


class Transport(abc.ABC):
    node: NodeConfig
    python: str = "python3"     # the interpreter that runs the agent on the node

    @property
    @abc.abstractmethod
    def connected(self) -> bool: ...

    @abc.abstractmethod
    async def connect(self) -> None: ...

    @abc.abstractmethod
    async def run(self, argv: Sequence[str] | str, *, input: bytes | None = None,
                  timeout: float | None = 30) -> CommandResult: ...

    @abc.abstractmethod
    def stream(self, argv: Sequence[str] | str, *, input: bytes | None = None) -> LineStream: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    def describe(self) -> str:
        return self.node.name


# ---------------------------------------------------------------- local

class LocalTransport(Transport):
    """Runs commands on this machine (asyncio subprocesses), with node.env added to the environment."""

    python = sys.executable or "python3"

    def __init__(self, node: NodeConfig) -> None:
        self.node = node
        self._open = False
        self._env = {**os.environ, **dict(node.env)}

    @property
    def connected(self) -> bool:
        return self._open

    async def connect(self) -> None:
        self._open = True

    async def _spawn(self, argv: Sequence[str] | str, stdin: int) -> asyncio.subprocess.Process:
        # own process group (start_new_session): close() can end the command and its children
        kw: dict[str, Any] = dict(stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                  env=self._env, start_new_session=True)
        try:
            if isinstance(argv, str):
                return await asyncio.create_subprocess_exec("/bin/sh", "-c", argv, **kw)
            return await asyncio.create_subprocess_exec(*[str(a) for a in argv], **kw)
        except OSError as exc:
            raise TransportError(f"{self.node.name}: cannot run {to_command(argv)[:80]}: {exc.strerror or exc}") from exc

    async def run(self, argv: Sequence[str] | str, *, input: bytes | None = None,
                  timeout: float | None = 30) -> CommandResult:
        if not self._open:
            await self.connect()
        proc = await self._spawn(argv, asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL)
        try:
            out, err = await bounded(proc.communicate(input), timeout)
        except TimeoutError:
            _killpg(proc)
            await proc.wait()
            raise TransportError(f"{self.node.name}: {to_command(argv)[:80]} timed out after {timeout:g} s") from None
        except asyncio.CancelledError:
            _killpg(proc)
            raise
        return CommandResult(proc.returncode if proc.returncode is not None else -1,
                             out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def stream(self, argv: Sequence[str] | str, *, input: bytes | None = None) -> LineStream:
        state: dict[str, Any] = {}

        async def start() -> asyncio.subprocess.Process:
            if "proc" not in state:
                state["proc"] = asyncio.ensure_future(self._spawn(argv, asyncio.subprocess.PIPE))
            # shielded: a reader cancelled mid-spawn leaves the spawn to finish, and the closer to end it
            proc: asyncio.subprocess.Process = await asyncio.shield(state["proc"])
            if input is not None and not state.get("fed"):
                state["fed"] = True
                assert proc.stdin is not None       # spawned with pipes
                proc.stdin.write(input)
                await proc.stdin.drain()
            if "drain_err" not in state:   # stderr must not fill its pipe and block the command
                state["drain_err"] = asyncio.ensure_future(_drain(proc.stderr))
            return proc

        async def read() -> bytes:
            proc = await start()
            assert proc.stdout is not None          # spawned with pipes
            return await proc.stdout.read(65536)

        async def closer() -> None:
            if "proc" not in state:
                return
            try:
                proc = await state["proc"]
            except (asyncio.CancelledError, TransportError):
                return          # it never started: nothing to end
            if proc.stdin and not proc.stdin.is_closing():
                proc.stdin.close()          # the agent ends on stdin end-of-file
            try:
                await bounded(proc.wait(), 2.0)
            except TimeoutError:
                _killpg(proc, signal.SIGTERM)
                try:
                    await bounded(proc.wait(), 2.0)
                except TimeoutError:
                    _killpg(proc)
                    with contextlib.suppress(TimeoutError):  # Python 3.11's wait() also waits for every pipe to close, which a stray child may hold
                        await bounded(proc.wait(), 5.0)
            if "drain_err" in state:
                state["drain_err"].cancel()

        def returncode() -> int | None:
            f = state.get("proc")
            return f.result().returncode if f is not None and f.done() and not f.exception() else None

        return LineStream(read, closer, returncode)

    async def close(self) -> None:
        self._open = False

    def describe(self) -> str:
        return f"{self.node.name} (this machine)"


async def _drain(reader: asyncio.StreamReader | None) -> None:
    if reader is None:
        return
    try:
        while await reader.read(65536):
            pass
    except Exception:  # noqa: BLE001 — best effort: the pipe just has to stay empty
        pass


def _killpg(proc: asyncio.subprocess.Process, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


TAG_VAR = "SPARKCONSOLE_RUN"


def tagged(cmd: str, tag: str) -> str:
    """The command under `sh -c`, with a marker in its environment that its whole process tree inherits."""
    return shlex.join(["env", f"{TAG_VAR}={tag}", "sh", "-c", cmd])


def kill_tagged_snippet(tag: str, sig: str) -> str:
    # Closing a channel does not end a command that neither reads nor writes, and sshd refuses "signal"
    # requests for root logins: find the command's processes by their marker instead (Linux /proc).
    return (f"pids=$(grep -lzx {shlex.quote(f'{TAG_VAR}={tag}')} /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); "
            f'[ -z "$pids" ] || kill -s {sig} $pids 2>/dev/null; true')


def _dec(b: object) -> str:
    if b is None:
        return ""
    return b.decode("utf-8", "replace") if isinstance(b, (bytes, bytearray)) else str(b)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "connect timed out"
    text = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())[:200]
