"""Test bed plugin: a real Docker engine (Debian's docker.io) on its own socket and data root, plus the vLLM image.

The engine runs with `--bridge=none --iptables=false` so it never touches the host's bridge or firewall;
containers use `--network host`. No registry is reachable here, so the image is `docker import`ed from an
almost empty root filesystem and everything a vLLM container needs (/usr, the Python install, the vLLM venv,
the model) is bind-mounted read-only from the host. The engine is stopped by its PID at session end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.testbed.cache import TestbedError

IMAGE = "sparkconsole-testbed/base:1"
# vLLM sizes itself from /dev/shm and opens sockets under /tmp; see docs/TESTBED.md for the failures seen without.
SHM_SIZE = "1g"
DOCKER_HINT = "install Debian's docker.io (scripts/test does: apt-get install -y docker.io)"


def docker_cli() -> str:
    """The client shipped with the engine (same API version) when present, else whatever is on PATH."""
    for cand in (Path(shutil.which("dockerd") or "/nonexistent").with_name("docker"), Path("/usr/bin/docker")):
        if cand.is_file():
            return str(cand)
    found = shutil.which("docker")
    if not found:
        raise TestbedError(f"no docker client: {DOCKER_HINT}")
    return found


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below root, deepest first (from /proc/self/mountinfo)."""
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == str(root) or point.startswith(str(root) + "/"):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def _wait_pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@dataclass
class DockerEngine:
    """One dockerd on a private socket. `.host` is the DOCKER_HOST value for clients (e.g. the launch runner)."""

    root: Path
    proc: subprocess.Popen | None = None
    start_seconds: float | None = None
    cli: str = field(default_factory=docker_cli)

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path:
        return self.root / "dockerd.log"

    def env(self) -> dict[str, str]:
        """Environment for any docker client aimed at this engine (config dir kept private, no host creds)."""
        return {**os.environ, "DOCKER_HOST": self.host, "DOCKER_CONFIG": str(self.root / "client-config")}

    def run(self, args: Sequence[str], *, check: bool = True, timeout: float = 120,
            input: bytes | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.cli, *args], env=self.env(), capture_output=True, timeout=timeout,
                              input=input.decode() if input is not None else None, text=True)
        if check and proc.returncode != 0:
            raise TestbedError(f"docker {' '.join(args[:3])} failed (rc {proc.returncode}): "
                               f"{proc.stderr.strip().splitlines()[-1:] or ''}")
        return proc

    def inspect(self, name: str) -> dict:
        return json.loads(self.run(["inspect", name]).stdout)[0]

    def start(self, timeout: float = 60) -> None:
        dockerd = shutil.which("dockerd")
        if not dockerd:
            raise TestbedError(f"no dockerd: {DOCKER_HINT}")
        argv = [
            dockerd, "--host", self.host, "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
            "--pidfile", str(self.root / "docker.pid"), "--bridge=none", "--iptables=false", "--ip-masq=false",
            "--userland-proxy=false", "--shutdown-timeout", "5",
        ]
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:]
                raise TestbedError(f"dockerd exited with {self.proc.returncode}: {tail} (log: {self.log_path})")
            if self.socket.exists() and self._answers():
                self.start_seconds = round(time.monotonic() - started, 2)
                return
            time.sleep(0.1)
        self.stop()
        raise TestbedError(f"dockerd did not answer within {timeout:.0f} s (log: {self.log_path})")

    def _answers(self) -> bool:
        """dockerd makes its socket before it serves: under load (engines of other workers starting beside it on
        two cores) a first `docker version` has waited on it past 10 s. That is "not yet", not a failure."""
        try:
            return self.run(["version", "--format", "{{.Server.Version}}"], check=False, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def stop(self) -> None:
        """Remove containers, stop dockerd by its PID, unmount what it left, delete its directories."""
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                ids = self.run(["ps", "-aq"], check=False, timeout=20).stdout.split()
                if ids:
                    self.run(["rm", "-f", *ids], check=False, timeout=60)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                # dockerd's own containerd shares its session: take the whole group down
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # the managed containerd normally exits with dockerd; make sure nothing of this group lingers
        if self.proc:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        for point in _mounts_under(self.root):
            subprocess.run(["umount", "-l", point], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def make_base_rootfs_tar(dest: Path) -> Path:
    """A root filesystem of empty directories and the usual /bin, /lib symlinks: the host's files are mounted in."""
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp)
        # sbin must be a real directory: `--init` mounts /sbin/docker-init into it
        for d in ("usr", "etc", "root", "tmp", "proc", "sys", "dev", "run", "sbin", "var/tmp", "home"):
            (rootfs / d).mkdir(parents=True, exist_ok=True)
        (rootfs / "tmp").chmod(0o1777)
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            (rootfs / link).symlink_to(target)
        with tarfile.open(dest, "w") as tar:
            tar.add(rootfs, arcname=".")
    return dest


def import_base_image(engine: DockerEngine, name: str = IMAGE) -> str:
    if engine.run(["image", "inspect", name], check=False).returncode == 0:
        return name
    tar_path = make_base_rootfs_tar(engine.root / "rootfs.tar")
    engine.run(["import", str(tar_path), name])
    tar_path.unlink()
    return name


@dataclass(frozen=True)
class TestbedImage:
    """What a container from the host-mounted image needs: read-only mounts, tmpfs, environment.

    `run_argv` builds a complete `docker run` argv (without the leading `docker`), so other tests (the launch
    runner's) can start their own containers with the same image and mounts.
    """

    __test__ = False

    name: str
    mounts: tuple[tuple[str, str], ...]  # (host path, container path), all read-only
    env: tuple[tuple[str, str], ...]
    tmpfs: tuple[str, ...] = ("/tmp",)
    shm_size: str = SHM_SIZE
    vllm_python: str = ""  # the vLLM venv's interpreter, same path inside the container
    model: object = None  # tests.testbed.model.TinyModel: .path (mounted at the same path) and .name

    def run_argv(self, container_name: str, command: Sequence[str], *, memory: str | None = "6g",
                 extra_mounts: Sequence[tuple[str, str]] = (), extra_env: dict[str, str] | None = None,
                 detach: bool = True) -> list[str]:
        argv = ["run"] + (["--detach"] if detach else ["--rm"])
        argv += ["--name", container_name, "--init", "--network", "host", "--shm-size", self.shm_size]
        if memory:
            argv += ["--memory", memory]
        for path in self.tmpfs:
            argv += ["--tmpfs", path]
        for src, dst in (*self.mounts, *extra_mounts):
            argv += ["--mount", f"type=bind,source={src},target={dst},readonly"]
        for key, value in (*self.env, *(extra_env or {}).items()):
            argv += ["--env", f"{key}={value}"]
        return argv + [self.name, *command]


def host_mounts(*extra_paths: Path) -> tuple[tuple[str, str], ...]:
    """The host files a Python program needs in the empty image: /usr, the Python install, identity files."""
    paths = [Path("/usr"), Path(sys.base_prefix).resolve()]
    paths += [p for p in (Path("/etc/passwd"), Path("/etc/group"), Path("/etc/ld.so.cache")) if p.exists()]
    paths += [p.resolve() for p in extra_paths]
    seen: list[tuple[str, str]] = []
    for p in paths:
        if not any(str(p).startswith(src + "/") or str(p) == src for src, _ in seen):
            seen.append((str(p), str(p)))
    return tuple(seen)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    # a short path: unix socket paths are limited to 108 bytes
    root = Path(tempfile.mkdtemp(prefix="sc-docker-", dir="/tmp"))
    engine = DockerEngine(root)
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def testbed_base_image(docker_engine: DockerEngine) -> str:
    return import_base_image(docker_engine)
