"""Test bed plugin: real OpenSSH servers on loopback, one per test node.

`sshd_nodes` (session scope) starts one `sshd -D -f CONFIG` on 127.0.0.2 and one on 127.0.0.3, each on a free
unprivileged port with its own generated host key; one generated user key logs in to both as the current user.
It yields an `SshdCluster` (a list of `SshdNode`) with `known_hosts` written and `cluster_config()` to build a
ClusterConfig. Each node can be frozen (SIGSTOP: a network partition, ticks stop but no FIN arrives), killed
(SIGKILL of the listener and its session processes) and restarted on the same address, port and host key.
Everything is stopped by PID at the end, also on failure. The test is skipped only if sshd cannot be installed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import free_port

ADDRESSES = ("127.0.0.2", "127.0.0.3")
SSHD = "/usr/sbin/sshd"
# sshd's own default PATH: a node's python3 is its system one
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def node_setenv(extra_config: str) -> str:
    """`extra_config` with its SetEnv lines merged into one that also sets a node's plain environment (sshd takes
    the first SetEnv line only). SHLVL=1: bash, started by sshd, then does not read this machine's ~/.bashrc,
    which is a developer's (here `pyenv init`, ~140 processes and 0.1 CPU s for every command a test sends, and
    `python3` a pyenv shim of as many more); a node's own is not. PATH: sshd's default, with this interpreter's
    directory last where the system has no python3 of its own."""
    path = NODE_PATH if shutil.which("python3", path=NODE_PATH) else f"{NODE_PATH}:{Path(sys._base_executable).parent}"
    env = {"SHLVL": "1", "PATH": path}
    lines = []
    for line in extra_config.splitlines():
        if line.split(None, 1)[:1] == ["SetEnv"]:
            env.update(kv.split("=", 1) for kv in shlex.split(line)[1:])
        else:
            lines.append(line)
    return "\n".join([*lines, "SetEnv " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())]) + "\n"


def _ensure_sshd() -> str | None:
    """None when sshd is ready, else why it cannot be installed."""
    if os.path.exists(SSHD) and shutil.which("ssh-keygen"):
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "--no-install-recommends", "openssh-server"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=300", "update"], capture_output=True, env=env)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0 or not os.path.exists(SSHD):
        return "openssh-server could not be installed: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    return None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, even by SIGKILL (no orphan sshd)."""
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)


def _descendants(pid: int) -> list[int]:
    import psutil
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _is_sshd(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip().startswith("sshd")
    except OSError:
        return False


@dataclass
class SshdNode:
    name: str
    address: str
    port: int
    user: str
    identity: str
    known_hosts: str
    dir: Path
    host_key: Path
    proc: subprocess.Popen | None = None
    frozen: list[int] = field(default_factory=list)
    keep_alive: bool = False          # outlive the process that started it (`python -m tests.testbed up --nodes`)

    @property
    def config_path(self) -> Path:
        return self.dir / "sshd_config"

    def start(self) -> None:
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config_path)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=open(self.dir / "sshd.log", "ab"),
                                     start_new_session=True, preexec_fn=None if self.keep_alive else _die_with_parent)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd on {self.address}:{self.port} exited: " +
                                   (self.dir / "sshd.log").read_text()[-300:])
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd on {self.address}:{self.port} did not answer in 10 s")

    def sshd_pids(self) -> list[int]:
        """The listener and its session processes (sshd only: the commands they run are left to notice)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        return [self.proc.pid] + [p for p in _descendants(self.proc.pid) if _is_sshd(p)]

    def session_pids(self) -> list[int]:
        """Every process under the listener (sessions and the commands they run)."""
        return _descendants(self.proc.pid) if self.proc and self.proc.poll() is None else []

    def freeze(self) -> None:
        """Stop sshd (listener and sessions) without closing anything: a silent network partition."""
        self.frozen = self.sshd_pids()
        for pid in self.frozen:
            _signal(pid, signal.SIGSTOP)

    def kill(self) -> None:
        """SIGKILL the sessions, then the listener: the node's SSH connections drop at once."""
        pids = self.sshd_pids()
        for pid in reversed(pids):
            _signal(pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)
        self.frozen = []

    def restart(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is None:
            return
        pids = self.session_pids()
        for pid in [self.proc.pid, *pids]:
            _signal(pid, signal.SIGCONT)
            _signal(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class SshdCluster(list):
    """The running test nodes (a list of SshdNode) and what a client needs to reach them."""

    def __init__(self, nodes: list[SshdNode], root: Path, known_hosts: str, identity: str) -> None:
        super().__init__(nodes)
        self.root = root
        self.known_hosts = known_hosts
        self.identity = identity

    def known_hosts_lines(self) -> str:
        return Path(self.known_hosts).read_text()

    def cluster_config(self, *, known_hosts: str | None = None, trust_on_first_use: bool = False,
                       interval_s: float = 0.5, connect_timeout_s: float = 5.0, nodes: list[SshdNode] | None = None,
                       agent_args: tuple[str, ...] = ("--containers", "none")):
        from sparkconsole.config import ClusterConfig, NodeConfig, SshPolicy, SshSettings
        picked = nodes if nodes is not None else list(self)
        ncs = tuple(NodeConfig(name=n.name, address=n.address, role="head" if i == 0 else "worker",
                               ssh=SshSettings(user=n.user, port=n.port, identity=n.identity), agent_args=agent_args)
                    for i, n in enumerate(picked))
        policy = SshPolicy(known_hosts=known_hosts or self.known_hosts, trust_on_first_use=trust_on_first_use,
                           connect_timeout_s=connect_timeout_s)
        return ClusterConfig(nodes=ncs, endpoints=(), ssh=policy, agent_interval_s=interval_s, source="<sshd test bed>")

    def stop(self) -> None:
        for n in self:
            n.stop()

    def write_cluster_file(self, path: Path, containers: list[str], ports: list[int]) -> Path:
        """A cluster file over these nodes as an operator writes one for the test bed: a container name and a free
        port each, the loopback link, and a core each (round robin over this machine's) for a CPU build's ranks."""
        cores = len(os.sched_getaffinity(0))
        path.write_text("nodes:\n" + "".join(
            f"  - name: {n.name}\n    address: {n.address}\n"
            f"    ssh: {{user: {n.user}, port: {n.port}, identity: {n.identity}}}\n"
            f"    container: {containers[i]}\n    vllm_port: {ports[i]}\n    eth_if: lo\n"
            f"    vllm_env: {{VLLM_CPU_OMP_THREADS_BIND: \"{i % cores}\"}}\n"
            for i, n in enumerate(self)) + f"ssh: {{known_hosts: {self.known_hosts}}}\n")
        return path


def start_sshd_nodes(root: Path, addresses=ADDRESSES, extra_config: str | Callable[[int], str] = "",
                     keep_alive: bool = False) -> SshdCluster:
    """`extra_config`: more sshd_config lines, e.g. `SetEnv DOCKER_HOST=…` so that every session on these nodes
    finds its Docker engine the way a real node's shell does, with nothing set by the client; or a function of
    the node's index giving each node its own (e.g. its own HF_HOME)."""
    import getpass
    user = getpass.getuser()
    root.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)     # privilege separation directory
    identity = root / "id_ed25519"
    _keygen(identity, "sparkconsole-test-user")
    known_lines = []
    nodes: list[SshdNode] = []
    for i, address in enumerate(addresses):
        d = root / f"node{i + 1}"
        d.mkdir()
        host_key = d / "ssh_host_ed25519_key"
        _keygen(host_key, f"node{i + 1}")
        (d / "authorized_keys").write_text((identity.with_suffix(".pub")).read_text())
        port = free_port(address)
        (d / "sshd_config").write_text(f"""\
ListenAddress {address}
Port {port}
HostKey {host_key}
PidFile {d / 'sshd.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
MaxStartups 64
MaxSessions 64
LogLevel ERROR
{node_setenv(extra_config(i) if callable(extra_config) else extra_config)}""")
        algo, blob = host_key.with_suffix(".pub").read_text().split()[:2]
        known_lines.append(f"[{address}]:{port} {algo} {blob}\n")
        nodes.append(SshdNode(name=f"node{i + 1}", address=address, port=port, user=user, identity=str(identity),
                              known_hosts=str(root / "known_hosts"), dir=d, host_key=host_key, keep_alive=keep_alive))
    (root / "known_hosts").write_text("".join(known_lines))
    cluster = SshdCluster(nodes, root, str(root / "known_hosts"), str(identity))
    try:
        for n in nodes:
            n.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def sshd_nodes():
    why = _ensure_sshd()
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="sparkconsole-sshd-"))
    cluster = start_sshd_nodes(root)
    atexit.register(cluster.stop)      # also when the session is torn down abnormally
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sshd_live(sshd_nodes):
    """The same nodes, brought back up after a test that froze or killed one."""
    yield sshd_nodes
    for n in sshd_nodes:
        if n.frozen or n.proc is None or n.proc.poll() is not None:
            for pid in n.frozen:
                _signal(pid, signal.SIGCONT)
            n.restart()
