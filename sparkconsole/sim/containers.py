"""The simulated docker's containers: records on disk under a lock (`Store`), what docker reports of them
(state, health, inspect and ps objects), the images a node has, and the processes that play them — a simulated
vLLM server, a router, or an idle placeholder — started, stopped and removed."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .dockerfmt import human_duration, iso
from .files import pid_alive, read_json, write_atomic

# Images a sim node has "pulled". Anything with vllm or litellm in its name is also present.
LOCAL_IMAGES = ("vllm-node", "vllm-node-mxfp4", "vllm/vllm-openai:latest", "nvcr.io/nvidia/vllm:25.09-py3",
                "lmsysorg/vllm-router:latest", "ghcr.io/berriai/litellm:main-stable")


def image_present(image: str, node_dir: Path) -> bool:
    extra = read_json(node_dir / "images.json")
    names = set(LOCAL_IMAGES) | set(extra if isinstance(extra, list) else [])
    base = image if ":" in image.rsplit("/", 1)[-1] else image + ":latest"
    return image in names or base in names or "vllm" in image.lower() or "litellm" in image.lower()


def image_id(image: str) -> str:
    return "sha256:" + hashlib.sha256(("sim-image:" + image).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------
# container records

class Store:
    def __init__(self, node_dir: Path) -> None:
        self.node_dir = Path(node_dir)
        self.root = self.node_dir / "containers"
        self.root.mkdir(parents=True, exist_ok=True)
        self.sim = read_json(self.node_dir / "sim.json") or {}
        self._lock_fd: int | None = None

    def _open_lock(self) -> int:
        return os.open(self.root / ".lock", os.O_CREAT | os.O_RDWR, 0o600)

    def __enter__(self) -> Store:
        self._lock_fd = self._open_lock()
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def cdir(self, name: str) -> Path:
        return self.root / name

    def fs(self, name: str) -> Path:
        """The container's own files (what `docker exec … touch` writes); removing the container removes them."""
        return self.cdir(name) / "fs"

    def names(self) -> list[str]:
        return sorted(p.parent.name for p in self.root.glob("*/container.json"))

    def get(self, ref: str) -> dict[str, Any] | None:
        """By name (with or without the leading /) or by an ID prefix."""
        ref = ref.lstrip("/")
        if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", ref) and (self.root / ref / "container.json").is_file():
            rec = read_json(self.root / ref / "container.json")
            return self.refresh(rec) if isinstance(rec, dict) else None
        if re.fullmatch(r"[0-9a-f]{3,64}", ref):
            for n in self.names():
                rec = read_json(self.root / n / "container.json")
                if isinstance(rec, dict) and rec.get("id", "").startswith(ref):
                    return self.refresh(rec)
        return None

    def all(self) -> list[dict[str, Any]]:
        recs = [self.get(n) for n in self.names()]
        return [r for r in recs if r]

    def save(self, rec: dict[str, Any]) -> None:
        d = self.cdir(rec["name"])
        d.mkdir(parents=True, exist_ok=True)
        write_atomic(d / "container.json", json.dumps(rec, indent=1))

    def refresh(self, rec: dict[str, Any]) -> dict[str, Any]:
        """A running record whose process died becomes exited, with what the process left behind.

        Readers (ps, inspect) hold no lock, so the exited record is written back only under the lock and only if the
        file still says running: a reader racing `docker stop` would otherwise overwrite the stop's exit code with 137
        (its process died between the reader's read and its check)."""
        if rec.get("state") != "running" or pid_alive(rec.get("pid")):
            return rec
        if self._lock_fd is not None:
            return self._mark_exited(rec)
        fd = self._open_lock()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # A stop holds the lock and writes the record when it is done; until then it reads as running,
                # as Docker's does while a stop is under way.
                return rec
            current = read_json(self.cdir(rec["name"]) / "container.json")
            if not isinstance(current, dict) or current.get("pid") != rec.get("pid") or current.get("state") != "running":
                return current if isinstance(current, dict) else rec
            return self._mark_exited(current)
        finally:
            os.close(fd)

    def _mark_exited(self, rec: dict[str, Any]) -> dict[str, Any]:
        d = self.cdir(rec["name"])
        code = (d / "exitcode").read_text().strip() if (d / "exitcode").is_file() else ""
        rec["state"] = "exited"
        rec["exit_code"] = int(code) if code.lstrip("-").isdigit() else 137
        rec["oom_killed"] = (d / "oom").is_file()
        rec["finished_at"] = (d / "exitcode").stat().st_mtime if code else time.time()
        rec["pid"] = 0
        for pid in rec.get("exec_pids", []):
            _kill_group(pid, signal.SIGKILL)
        rec["exec_pids"] = []
        with contextlib.suppress(OSError):
            self.save(rec)
        return rec


def _kill_group(pid: int, sig: int) -> None:
    if not pid:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def health_of(store: Store, rec: dict[str, Any]) -> str | None:
    if not rec.get("healthcheck"):
        return None
    if rec.get("state") != "running":
        return "unhealthy"
    ld = read_json(store.node_dir / "load" / f"{rec['name']}.json")
    ready = (isinstance(ld, dict) and ld.get("phase") == "ready") or (store.cdir(rec["name"]) / "ready").is_file()
    return "healthy" if ready else "starting"


def status_text(store: Store, rec: dict[str, Any], now: float) -> str:
    state = rec.get("state")
    if state == "running":
        h = health_of(store, rec)
        suffix = {"healthy": " (healthy)", "starting": " (health: starting)", "unhealthy": " (unhealthy)"}.get(h or "", "")
        return f"Up {human_duration(now - rec['started_at'])}{suffix}"
    if state == "exited":
        return f"Exited ({rec.get('exit_code', 0)}) {human_duration(now - (rec.get('finished_at') or now))} ago"
    return "Created"


def inspect_obj(store: Store, rec: dict[str, Any]) -> dict[str, Any]:
    h = health_of(store, rec)
    state = {
        "Status": rec["state"], "Running": rec["state"] == "running", "Paused": False, "Restarting": False,
        "OOMKilled": bool(rec.get("oom_killed")), "Dead": False, "Pid": rec.get("pid") or 0,
        "ExitCode": rec.get("exit_code", 0), "Error": "", "StartedAt": iso(rec.get("started_at")),
        "FinishedAt": iso(rec.get("finished_at")),
    }
    if h:
        state["Health"] = {"Status": h, "FailingStreak": 0, "Log": []}
    cmd = rec.get("cmd") or []
    gpus = rec.get("gpus")
    return {
        "Id": rec["id"], "Created": iso(rec["created"]), "Path": cmd[0] if cmd else "", "Args": cmd[1:],
        "State": state, "Image": image_id(rec["image"]), "Name": "/" + rec["name"],
        "RestartCount": rec.get("restart_count", 0), "Driver": "overlay2", "Platform": "linux",
        "HostConfig": {
            "Memory": rec.get("memory_b", 0), "ShmSize": rec.get("shm_size_b", 67108864),
            "NetworkMode": rec.get("network", "bridge"), "IpcMode": rec.get("ipc", "private"),
            "Init": rec.get("init", False), "Privileged": rec.get("privileged", False),
            "RestartPolicy": {"Name": rec.get("restart", "no"), "MaximumRetryCount": 0},
            "AutoRemove": rec.get("auto_remove", False),
            "DeviceRequests": [{"Driver": "", "Count": -1 if gpus == "all" else int(gpus), "DeviceIDs": None,
                                "Capabilities": [["gpu"]], "Options": {}}] if gpus else None,
        },
        "Config": {"Hostname": store.sim.get("name", ""), "Image": rec["image"], "Cmd": cmd, "Entrypoint": None,
                   "Env": rec.get("env", []), "Labels": rec.get("labels", {})},
        "Mounts": [{"Type": "bind", "Source": s, "Destination": d, "RW": "ro" not in m}
                   for s, d, m in rec.get("mounts", [])],
        "NetworkSettings": {"Networks": {rec.get("network", "bridge"): {}}},
        "Simulated": True,
    }


def ps_obj(store: Store, rec: dict[str, Any], now: float) -> dict[str, Any]:
    cmd = shlex.join(rec.get("cmd") or [])
    return {
        "Command": json.dumps(cmd[:20] + ("…" if len(cmd) > 20 else ""), ensure_ascii=False), "CreatedAt":
        datetime.fromtimestamp(rec["created"], UTC).strftime("%Y-%m-%d %H:%M:%S +0000 UTC"),
        "ID": rec["id"][:12], "Image": rec["image"],
        "Labels": ",".join(f"{k}={v}" for k, v in rec.get("labels", {}).items()), "LocalVolumes": "0",
        "Mounts": ",".join(d for _, d, _ in rec.get("mounts", [])), "Names": rec["name"],
        "Networks": rec.get("network", "bridge"), "Ports": "", "RunningFor": human_duration(now - rec["created"]) + " ago",
        "Size": "0B", "State": rec["state"], "Status": status_text(store, rec, now),
    }


# ---------------------------------------------------------------------------------------------------
# what a container runs

_SHELL_OP = re.compile(r"^(\d?>>?|\d?<|&&|\|\||;|\||&|\d?>&\d)")


def vllm_args(cmd: list[str]) -> list[str] | None:
    """The vLLM arguments when a command starts a vLLM server, else None."""
    if len(cmd) >= 3 and cmd[0] in ("bash", "sh", "/bin/bash", "/bin/sh") and cmd[1] in ("-c", "-lc"):
        if len(cmd) > 4 and '"$@"' in cmd[2]:
            return vllm_args(cmd[4:])     # a wrapper that runs its arguments (the mods' wait, the drain gate's path)
        try:
            words = shlex.split(re.sub(r"\\[ \t]*\r?\n", " ", cmd[2]))
        except ValueError:
            return None
        for i in range(len(words)):
            if words[i] in ("exec", "env") or _SHELL_OP.match(words[i]) or "=" in words[i]:
                continue
            inner = vllm_args(words[i:])
            if inner is not None:
                end = next((j for j, w in enumerate(inner) if _SHELL_OP.match(w)), len(inner))
                return inner[:end]
        return None
    if len(cmd) >= 2 and os.path.basename(cmd[0]) == "vllm" and cmd[1] == "serve":
        return cmd[2:]
    for i, w in enumerate(cmd):
        if w in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"):
            return cmd[i + 1:]
    return None


def program_for(image: str, cmd: list[str], entrypoint: str | None) -> tuple[str, list[str]]:
    """(module, args) of the process that plays this container."""
    full = ([entrypoint] if entrypoint else []) + cmd
    if entrypoint is None and "vllm-openai" in image and (not cmd or cmd[0].startswith("-") or "/" in cmd[0]):
        full = ["vllm", "serve", *cmd]       # the vllm/vllm-openai image's entrypoint is `vllm serve`
    args = vllm_args(full)
    if args is not None:
        return "sparkconsole.sim.server", args
    exe = os.path.basename(full[0]) if full else ""
    if exe == "vllm-router" or (not full and "vllm-router" in image):
        return "sparkconsole.sim.router", ["--flavor", "vllm-router", *full[1:]]
    if exe == "litellm" or (not full and "litellm" in image) or (full and "litellm" in image and full[0].startswith("-")):
        return "sparkconsole.sim.router", ["--flavor", "litellm", *(full[1:] if exe == "litellm" else full)]
    return "sparkconsole.sim.server", ["--sim-idle", "--", *full]


def spawn(store: Store, rec: dict[str, Any], module: str, args: list[str], *, exec_: bool = False) -> int:
    d = store.cdir(rec["name"])
    for stale in ("exitcode", "oom", "ready"):
        if not exec_:
            (d / stale).unlink(missing_ok=True)
    argv = [sys.executable, "-m", module, "--sim-node-dir", str(store.node_dir), "--sim-container", rec["name"],
            "--sim-memory-limit", str(rec.get("memory_b", 0)), *(["--sim-exec"] if exec_ else []), *args]
    with open(d / "log", "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=d, close_fds=True)
    return proc.pid


HOST_CGROUP = "0::/user.slice/user-1000.slice/session-1.scope\n"   # a GPU process in no container


def proc_root(node_dir: Path) -> Path:
    """The simulated node's /proc (the agent's `--proc-root`)."""
    return node_dir / "proc"


def cgroup_root(node_dir: Path) -> Path:
    """The simulated node's /sys/fs/cgroup (the agent's `--cgroup-root`)."""
    return node_dir / "sys" / "fs" / "cgroup"


def write_proc_entry(proc_root: Path, pid: int, rec: dict[str, Any] | None, cid: str | None) -> str:
    """/proc/PID/{comm,cgroup} of one process on the simulated node (written once): in its container's Docker scope,
    or a host session. Returns the entry's name."""
    pdir = proc_root / str(pid)
    if not (pdir / "cgroup").is_file():
        pdir.mkdir(parents=True, exist_ok=True)
        cmd = (rec.get("cmd") or ["vllm"]) if rec else []
        write_atomic(pdir / "comm", (os.path.basename(str(cmd[0])) if cmd else "python3")[:15] + "\n")
        write_atomic(pdir / "cgroup", f"0::/system.slice/docker-{cid}.scope\n" if cid else HOST_CGROUP)
    return pdir.name


def write_cgroup_scope(cgroup_root: Path, cid: str, rec: dict[str, Any], charged_b: int) -> None:
    """A running container's memory cgroup (cgroup v2, Docker's systemd scope): its cap and what is charged to it,
    a process's own few MiB at least."""
    d = cgroup_root / "system.slice" / f"docker-{cid}.scope"
    d.mkdir(parents=True, exist_ok=True)
    cap = int(rec.get("memory_b") or 0)
    write_atomic(d / "memory.max", f"{cap}\n" if cap else "max\n")
    write_atomic(d / "memory.current", f"{charged_b or 8 << 20}\n")


def start_container(store: Store, rec: dict[str, Any]) -> None:
    for mount in rec.get("tmpfs") or ():        # a tmpfs starts empty each time, as Docker's does
        shutil.rmtree(store.fs(rec["name"]) / str(mount).lstrip("/"), ignore_errors=True)
    module, args = program_for(rec["image"], rec.get("cmd") or [], rec.get("entrypoint"))
    rec["pid"] = spawn(store, rec, module, args)
    rec["state"] = "running"
    rec["started_at"] = time.time()
    rec["finished_at"] = None
    rec["exit_code"] = 0
    rec["oom_killed"] = False
    rec["exec_pids"] = []
    store.save(rec)
    # On a host the container's cgroup and /proc/PID are there as soon as `docker inspect` gives the PID: the agent
    # may read them at once, before the node's next write of its processes (which keeps them: the container runs).
    if rec.get("id"):
        write_cgroup_scope(cgroup_root(store.node_dir), rec["id"], rec, 0)
    write_proc_entry(proc_root(store.node_dir), rec["pid"], rec, rec.get("id"))


def stop_container(store: Store, rec: dict[str, Any], timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
    if rec.get("state") != "running":
        return
    pids = [rec["pid"], *rec.get("exec_pids", [])]
    for pid in pids:
        _kill_group(pid, sig)
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = False
    for pid in pids:
        if pid_alive(pid):
            _kill_group(pid, signal.SIGKILL)
            killed = True
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline + 5:
        time.sleep(0.02)
    d = store.cdir(rec["name"])
    code = (d / "exitcode").read_text().strip() if (d / "exitcode").is_file() else ""
    rec["state"] = "exited"
    if killed or sig == signal.SIGKILL:
        rec["exit_code"] = 137
    elif code.lstrip("-").isdigit():
        rec["exit_code"] = int(code)
    else:
        # Died of the stop signal before it could report (e.g. still importing): Docker says 128 + signal.
        rec["exit_code"] = 128 + int(sig)
    rec["oom_killed"] = (d / "oom").is_file()
    rec["finished_at"] = time.time()
    rec["pid"] = 0
    rec["exec_pids"] = []
    for p in (store.node_dir / "load").glob(f"{rec['name']}*.json"):
        p.unlink(missing_ok=True)
    store.save(rec)


def remove_container(store: Store, rec: dict[str, Any]) -> None:
    d = store.cdir(rec["name"])
    shutil.rmtree(store.fs(rec["name"]), ignore_errors=True)
    for p in sorted(d.glob("*"), reverse=True):
        if p.is_file():
            p.unlink()
    d.rmdir()
