"""The SSH transport: one persistent asyncssh connection per node, known_hosts verified by default.

Kept apart from nodes/transport.py so that a cluster of local nodes (the simulator, `status` on this machine)
never imports asyncssh (~0.15 s): make_transport (nodes/connect.py) imports this module only for a remote node.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import shlex
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncssh

from ..config import NodeConfig, SshPolicy
from ..errors import UserError
from .transport import (
    KEEPALIVE_COUNT_MAX,
    KEEPALIVE_INTERVAL_S,
    CommandResult,
    ConfirmNewHost,
    LineStream,
    Transport,
    TransportError,
    _dec,
    _reason,
    bounded,
    kill_tagged_snippet,
    tagged,
    to_command,
)


class _KeyRecorder(asyncssh.SSHClient):
    """Remembers the host key the server offered when known_hosts did not vouch for it."""

    def __init__(self) -> None:
        self.offered: asyncssh.SSHKey | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.offered = key
        return False


class SshTransport(Transport):
    """One persistent asyncssh connection with keepalives; known_hosts verified by default."""

    def __init__(self, node: NodeConfig, policy: SshPolicy, *, confirm_new_host: ConfirmNewHost | None = None,
                 keepalive_interval: float = KEEPALIVE_INTERVAL_S, keepalive_count_max: int = KEEPALIVE_COUNT_MAX) -> None:
        self.node = node
        self.policy = policy
        self.confirm_new_host = confirm_new_host
        self.keepalive_interval = keepalive_interval
        self.keepalive_count_max = keepalive_count_max
        self._conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()

    @property
    def where(self) -> str:
        return f"{self.node.address}:{self.node.ssh.port}"

    @property
    def known_hosts_path(self) -> Path:
        return Path(self.policy.known_hosts or "~/.ssh/known_hosts").expanduser()

    @property
    def connected(self) -> bool:
        c = self._conn
        return c is not None and not c.is_closed()

    def describe(self) -> str:
        return f"{self.node.name} ({self.where})"

    def _known_hosts(self) -> asyncssh.SSHKnownHosts:
        p = self.known_hosts_path
        try:
            return asyncssh.read_known_hosts(str(p)) if p.is_file() else asyncssh.import_known_hosts("")
        except (OSError, ValueError, asyncssh.KeyImportError) as exc:
            raise UserError(f"cannot read known_hosts: {exc}", file=str(p),
                            fix="repair or remove the bad line in that file") from exc

    async def connect(self) -> None:
        async with self._lock:
            if self.connected:
                return
            self._conn = await self._open(allow_tofu=True)

    async def _open(self, *, allow_tofu: bool) -> asyncssh.SSHClientConnection:
        node = self.node
        known = self._known_hosts()
        recorder = _KeyRecorder()
        opts: dict[str, Any] = dict(port=node.ssh.port, known_hosts=known, keepalive_interval=self.keepalive_interval,
                          keepalive_count_max=self.keepalive_count_max, connect_timeout=self.policy.connect_timeout_s,
                          client_factory=lambda: recorder)
        if node.ssh.user:
            opts["username"] = node.ssh.user
        if node.ssh.identity:
            opts["client_keys"] = [str(Path(node.ssh.identity).expanduser())]
        try:
            return await asyncssh.connect(node.address, **opts)
        except asyncssh.HostKeyNotVerifiable:
            key = recorder.offered
            fp = key.get_fingerprint("sha256") if key is not None else "unknown fingerprint"
            trusted = known.match(node.address, node.address, node.ssh.port)[0] if key is not None else []
            if trusted:
                raise UserError(f"host key mismatch for {self.where}: the server offered {fp}, which differs from "
                                f"the key in known_hosts — possible man-in-the-middle; connection refused",
                                file=str(self.known_hosts_path), field=f"nodes.{node.name}",
                                fix=f"if the node was reinstalled, remove the old key: "
                                    f"ssh-keygen -R {shlex.quote(self._host_pattern())} -f {shlex.quote(str(self.known_hosts_path))}") from None
            if key is not None and allow_tofu and self.policy.trust_on_first_use and self.confirm_new_host:
                ok = self.confirm_new_host(self.where, fp)
                if inspect.isawaitable(ok):
                    ok = await ok
                if ok is True:
                    self._remember(key)
                    return await self._open(allow_tofu=False)
            raise UserError(f"unknown host key for {self.where} ({fp}); connection refused", field=f"nodes.{node.name}",
                            fix=f"check the fingerprint on the node, then add it: ssh-keyscan -p {node.ssh.port} "
                                f"{shlex.quote(node.address)} >> {shlex.quote(str(self.known_hosts_path))} "
                                "(or set ssh.trust_on_first_use: true)") from None
        except asyncssh.PermissionDenied as exc:
            raise UserError(f"SSH login to {self.where} refused: {exc.reason}", field=f"nodes.{node.name}.ssh",
                            fix="check ssh.user and ssh.identity, and that the key is in the node's authorized_keys") from None
        except (TimeoutError, OSError, asyncssh.Error) as exc:
            raise TransportError(f"{node.name} ({self.where}) unreachable: {_reason(exc)}") from None

    def _host_pattern(self) -> str:
        a = self.node.address
        return a if self.node.ssh.port == 22 else f"[{a}]:{self.node.ssh.port}"

    def _remember(self, key: asyncssh.SSHKey) -> None:
        p = self.known_hosts_path
        p.parent.mkdir(parents=True, exist_ok=True)
        line = f"{self._host_pattern()} {key.export_public_key('openssh').decode().strip()}\n"
        with open(p, "a", encoding="utf-8") as fh:
            fh.write(line)

    async def _ensure(self) -> asyncssh.SSHClientConnection:
        if not self.connected:
            await self.connect()
        assert self._conn is not None
        return self._conn

    async def run(self, argv: Sequence[str] | str, *, input: bytes | None = None,
                  timeout: float | None = 30) -> CommandResult:
        conn = await self._ensure()
        cmd = to_command(argv)
        tag = uuid.uuid4().hex[:16]
        try:
            proc = await conn.create_process(tagged(cmd, tag), encoding=None)
            if input is not None:
                proc.stdin.write(input)
            proc.stdin.write_eof()
            try:
                r = await bounded(proc.wait(check=False), timeout)
            except TimeoutError:
                # Closing the channel alone leaves a command that neither reads nor writes running on the node.
                await _end_remote(conn, proc, tag)
                raise TransportError(f"{self.node.name}: {cmd[:80]} timed out after {timeout:g} s") from None
            except asyncio.CancelledError:
                await _end_remote(conn, proc, tag)
                raise
        except (OSError, asyncssh.Error) as exc:
            raise TransportError(f"{self.node.name} ({self.where}) connection lost: {_reason(exc)}") from None
        rc = r.exit_status if r.exit_status is not None else (255 if r.exit_signal else -1)
        return CommandResult(rc, _dec(r.stdout), _dec(r.stderr))

    def stream(self, argv: Sequence[str] | str, *, input: bytes | None = None) -> LineStream:
        cmd = to_command(argv)
        tag = uuid.uuid4().hex[:16]
        state: dict[str, asyncio.Future[asyncssh.SSHClientProcess[bytes]]] = {}

        async def start() -> asyncssh.SSHClientProcess[bytes]:
            if "proc" not in state:
                state["proc"] = asyncio.ensure_future(self._start_process(tagged(cmd, tag), input))
            return await state["proc"]

        async def read() -> bytes:
            proc = await start()
            return await proc.stdout.read(65536)

        async def closer() -> None:
            f = state.get("proc")
            if f is None:
                return
            try:
                proc = await f
            except (TransportError, UserError):
                return
            with contextlib.suppress(OSError, asyncssh.Error, BrokenPipeError):
                proc.stdin.write_eof()      # the agent ends on stdin end-of-file…
            try:
                await bounded(proc.wait_closed(), 2.0)
            except (TimeoutError, OSError, asyncssh.Error):
                if self._conn is not None:   # …anything else gets TERM, then KILL
                    await _end_remote(self._conn, proc, tag)

        def returncode() -> int | None:
            f = state.get("proc")
            if f is None or not f.done() or f.exception():
                return None
            return f.result().exit_status

        return LineStream(read, closer, returncode, lost=(asyncssh.Error,))

    async def _start_process(self, cmd: str, input: bytes | None) -> asyncssh.SSHClientProcess[bytes]:
        conn = await self._ensure()
        try:
            proc = await conn.create_process(cmd, encoding=None, stderr=asyncssh.DEVNULL)
            if input is not None:
                proc.stdin.write(input)
                await proc.stdin.drain()
            return proc
        except (OSError, asyncssh.Error) as exc:
            raise TransportError(f"{self.node.name} ({self.where}) connection lost: {_reason(exc)}") from None

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            with contextlib.suppress(TimeoutError, OSError, asyncssh.Error):
                await bounded(conn.wait_closed(), 3.0)



async def _end_remote(conn: asyncssh.SSHClientConnection, proc: asyncssh.SSHClientProcess[Any], tag: str) -> None:
    """TERM, then KILL, the remote command and its children; then close the channel."""
    for sig in ("TERM", "KILL"):
        if proc.exit_status is not None or proc.exit_signal is not None:
            break
        try:
            await bounded(conn.run(kill_tagged_snippet(tag, sig), check=False), 5.0)
            await bounded(proc.wait_closed(), 1.0)
            break
        except (TimeoutError, OSError, asyncssh.Error):
            continue
    proc.close()
    with contextlib.suppress(TimeoutError, OSError, asyncssh.Error):
        await bounded(proc.wait_closed(), 2.0)


