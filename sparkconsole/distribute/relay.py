"""A binary pipe between two nodes' commands through this machine: `SRC | DEST`, counted as it flows.

The transports (nodes/transport.py) answer text and line streams; a model blob or a `docker save` archive is
bytes, so this opens the processes itself on the transport's own connection (one SSH connection per node,
host keys verified there) and ends them the same way the transport does: TERM then KILL of the remote command's
process tree by its marker, because closing the channel can leave it running.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncssh

from ..nodes.ssh import SshTransport, _end_remote
from ..nodes.transport import LocalTransport, Transport, TransportError, _killpg, _reason, tagged, to_command

CHUNK = 1 << 20


class BinaryProcess:
    """A command on a node with binary stdin/stdout; stderr is kept (bounded) for the error line."""

    # proc: an asyncio subprocess (local) or an asyncssh process (SSH), used through what both have
    def __init__(self, node: str, proc: Any, end: Callable[[], Awaitable[None]], *, local: bool) -> None:
        self.node = node
        self._proc = proc
        self._end = end
        self._local = local
        self._err = asyncio.ensure_future(self._read_err())
        self.stderr = b""

    async def _read_err(self) -> None:
        try:
            while True:
                b = await self._proc.stderr.read(65536)
                if not b:
                    return
                self.stderr = (self.stderr + b)[-8192:]
        except Exception:  # noqa: BLE001 — a lost channel shows as the exit status instead
            return

    async def read(self, n: int = CHUNK) -> bytes:
        try:
            data: bytes = await self._proc.stdout.read(n)
            return data
        except (OSError, asyncssh.Error) as exc:
            raise TransportError(f"{self.node}: connection lost: {_reason(exc)}") from None

    async def write(self, data: bytes) -> None:
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except (OSError, asyncssh.Error, BrokenPipeError, ConnectionResetError) as exc:
            raise TransportError(f"{self.node}: the receiving command ended: {_reason(exc)}") from None

    async def close_stdin(self) -> None:
        try:
            if self._local:
                self._proc.stdin.close()
            else:
                self._proc.stdin.write_eof()
        except (OSError, asyncssh.Error, BrokenPipeError):
            pass

    async def wait(self) -> int:
        rc: int
        try:
            if self._local:
                rc = await self._proc.wait()
            else:
                r = await self._proc.wait(check=False)
                rc = r.exit_status if r.exit_status is not None else 255
        except (OSError, asyncssh.Error) as exc:
            raise TransportError(f"{self.node}: connection lost: {_reason(exc)}") from None
        await asyncio.wait({self._err}, timeout=5)
        return rc

    async def kill(self) -> None:
        await self._end()
        self._err.cancel()

    def error_text(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()


async def open_binary(transport: Transport, argv: Sequence[str]) -> BinaryProcess:
    node = transport.node.name
    if isinstance(transport, LocalTransport):
        await transport.connect()
        proc = await transport._spawn(argv, asyncio.subprocess.PIPE)

        async def end() -> None:
            if proc.returncode is None:
                _killpg(proc)
                await proc.wait()
        return BinaryProcess(node, proc, end, local=True)
    if not isinstance(transport, SshTransport):
        raise TransportError(f"{node}: cannot stream a command's binary output over a {type(transport).__name__}")
    conn = await transport._ensure()          # the node's one connection (known_hosts verified by the transport)
    tag = uuid.uuid4().hex[:16]
    try:
        remote = await conn.create_process(tagged(to_command(argv), tag), encoding=None)
    except (OSError, asyncssh.Error) as exc:
        raise TransportError(f"{node}: connection lost: {_reason(exc)}") from None

    async def end_ssh() -> None:
        with contextlib.suppress(Exception):  # the node may be gone: nothing left to end there
            await _end_remote(conn, remote, tag)
    return BinaryProcess(node, remote, end_ssh, local=False)


class RelayError(Exception):
    """The pipe broke: `side` is "source" or "dest", `rc` its exit status, `text` its stderr."""

    def __init__(self, side: str, node: str, rc: int | None, text: str) -> None:
        super().__init__(f"{node}: {text or f'exit status {rc}'}")
        self.side, self.node, self.rc, self.text = side, node, rc, text


async def relay(src_t: Transport, src_argv: Sequence[str], dst_t: Transport, dst_argv: Sequence[str], *,
                on_bytes: Callable[[int], None] | None = None, chunk: int = CHUNK) -> tuple[int, str]:
    """Runs SRC on one node and DEST on another, pipes SRC's stdout into DEST's stdin; returns (bytes, DEST's
    stdout). Cancelled or failed: both commands are ended; a failing side raises RelayError with its stderr."""
    src = await open_binary(src_t, src_argv)
    try:
        dst = await open_binary(dst_t, dst_argv)
    except BaseException:
        await src.kill()
        raise
    moved = 0
    try:
        try:
            while True:
                data = await src.read(chunk)
                if not data:
                    break
                await dst.write(data)
                moved += len(data)
                if on_bytes:
                    on_bytes(len(data))
        except TransportError as exc:
            # Which side broke: a receiver that died (disk full) has an exit status and an error line.
            await dst.close_stdin()
            await src.kill()
            rc = await _settled(dst)
            if rc not in (None, 0) or dst.error_text():
                raise RelayError("dest", dst.node, rc, dst.error_text()) from None
            raise RelayError("source", src.node, None, str(exc)) from None
        await dst.close_stdin()
        src_rc = await src.wait()
        if src_rc != 0:
            await dst.kill()
            raise RelayError("source", src.node, src_rc, src.error_text())
        out = b""
        try:
            while True:
                b = await dst.read(65536)
                if not b:
                    break
                out += b[:65536 - len(out)]
        except TransportError:
            pass
        dst_rc = await dst.wait()
        if dst_rc != 0:
            raise RelayError("dest", dst.node, dst_rc, dst.error_text())
        return moved, out.decode("utf-8", "replace")
    except BaseException:
        await asyncio.gather(src.kill(), dst.kill(), return_exceptions=True)
        raise


async def _settled(p: BinaryProcess) -> int | None:
    try:
        return await asyncio.wait_for(p.wait(), 10)
    except (TimeoutError, TransportError):
        return None
