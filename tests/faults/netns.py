"""A test node behind a link that can be cut: an sshd inside a network namespace this suite creates, joined to the
host by a veth pair with addresses from 10.253.0.0/24 (nothing else is touched).

    with netns_node(identity_pub, root) as node:     # node.address, node.port, node.known_hosts_line
        node.link(False); ...; node.link(True)        # the host side of the veth goes down / up

Everything is removed on exit, also on failure: the sshd and every process under it (by PID), then the namespace
(which takes the veth pair with it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.testbed.sshd import node_setenv

SSHD = "/usr/sbin/sshd"
_seq = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def netns_unavailable() -> str | None:
    """None when a namespace can be made here, else why not (the test is then skipped with this reason)."""
    if not os.path.exists(SSHD):
        return "no sshd"
    name = f"scprobe{os.getpid()}"
    try:
        r = _ip("netns", "add", name, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns` unavailable: {exc}"
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


@dataclass
class NetnsNode:
    ns: str
    host_if: str
    address: str
    host_address: str
    port: int
    dir: Path
    host_key_pub: Path
    proc: subprocess.Popen | None = None

    @property
    def known_hosts_line(self) -> str:
        algo, blob = self.host_key_pub.read_text().split()[:2]
        return f"[{self.address}]:{self.port} {algo} {blob}\n"

    def link(self, up: bool) -> None:
        _ip("link", "set", self.host_if, "up" if up else "down")

    def processes(self) -> list[int]:
        if self.proc is None:
            return []
        try:
            return [self.proc.pid] + [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


@contextlib.contextmanager
def netns_node(authorized_pub: Path, root: Path):
    n = next(_seq)
    tag = f"{os.getpid() % 100000}{n}"
    # A /30 per namespace so two of ours never share addresses; the host end is .1, the node .2 of the block.
    block = (os.getpid() * 7 + n * 4) % 252
    block -= block % 4
    host_addr, node_addr = f"10.253.0.{block + 1}", f"10.253.0.{block + 2}"
    node = NetnsNode(ns=f"scfault{tag}", host_if=f"scf{tag}h"[:15], address=node_addr, host_address=host_addr,
                     port=2222, dir=root / f"netns{n}", host_key_pub=root / f"netns{n}" / "host_key.pub")
    node.dir.mkdir(parents=True)
    peer = f"scf{tag}n"[:15]
    try:
        _ip("netns", "add", node.ns)
        _ip("link", "add", node.host_if, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", node.ns)
        _ip("addr", "add", f"{host_addr}/30", "dev", node.host_if)
        _ip("link", "set", node.host_if, "up")
        _ip("-n", node.ns, "addr", "add", f"{node_addr}/30", "dev", peer)
        _ip("-n", node.ns, "link", "set", peer, "up")
        _ip("-n", node.ns, "link", "set", "lo", "up")
        key = node.dir / "host_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (node.dir / "authorized_keys").write_text(authorized_pub.read_text())
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        (node.dir / "sshd_config").write_text(f"""\
ListenAddress {node_addr}
Port {node.port}
HostKey {key}
PidFile {node.dir / 'sshd.pid'}
AuthorizedKeysFile {node.dir / 'authorized_keys'}
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
ClientAliveInterval 0
LogLevel ERROR
{node_setenv("")}""")
        node.proc = subprocess.Popen(["ip", "netns", "exec", node.ns, SSHD, "-D", "-e", "-f",
                                      str(node.dir / "sshd_config")],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(node.dir / "sshd.log", "ab"), start_new_session=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection((node_addr, node.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        break
            except OSError:
                if node.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("sshd in the namespace did not start: " +
                                       (node.dir / "sshd.log").read_text()[-300:]) from None
                time.sleep(0.05)
        yield node
    finally:
        for pid in reversed(node.processes()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if node.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=10)
        _ip("link", "del", node.host_if, check=False)
        _ip("netns", "del", node.ns, check=False)
