"""The `docker` CLI of a simulated node: what the agent and the recipe runner call, answered from files.

`install(node_dir)` writes `<node_dir>/bin/docker`, a two-line script that runs this module for that node;
a sim node's PATH puts it first, so the real agent and the real runner reach it as plain `docker`.

Containers are directories (`<node_dir>/containers/NAME/container.json` + `log`); a running container is a
detached process: a simulated vLLM server (`vllm serve MODEL …`, the vllm/vllm-openai entrypoint or
`python -m vllm.entrypoints.openai.api_server`), a simulated router (vllm-router, LiteLLM), or an idle
placeholder for anything else (`ray start --block`, `sleep infinity`). There is no daemon: state that docker
would track (exit code, OOMKilled) is read back from the files the processes leave.

Supported: ps, inspect, container inspect/ls, run, start, stop, kill, rm, restart, logs, exec (vllm serve),
image inspect/ls, images, pull (local images only), version, info. Output shapes follow docker's
(`--format` Go templates: fields, json, index, lower/upper, if/else/end; table headers).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .node import pid_alive, read_json, write_atomic

SHIM_MARK = "sparkconsole simulated docker CLI"
SERVER_VERSION = "28.0.4-sim"
# Images a sim node has "pulled". Anything with vllm or litellm in its name is also present.
LOCAL_IMAGES = ("vllm-node", "vllm-node-mxfp4", "vllm/vllm-openai:latest", "nvcr.io/nvidia/vllm:25.09-py3",
                "lmsysorg/vllm-router:latest", "ghcr.io/berriai/litellm:main-stable")
ZERO_TIME = "0001-01-01T00:00:00Z"


class DockerError(Exception):
    def __init__(self, message: str, rc: int = 1) -> None:
        super().__init__(message)
        self.rc = rc


def install(node_dir: Path) -> Path:
    """Write the node's `docker` script (first on the sim node's PATH)."""
    node_dir = Path(node_dir)
    path = node_dir / "bin" / "docker"
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = shlex.join([sys.executable, "-m", "sparkconsole.sim.dockershim", "--node-dir", str(node_dir)])
    write_atomic(path, f"#!/bin/sh\n# {SHIM_MARK} for {node_dir.name} (not a real docker)\nexec {argv} \"$@\"\n")
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------------------------------------------
# time and naming helpers (docker's formats)

def iso(ts: float | None) -> str:
    if not ts:
        return ZERO_TIME
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def human_duration(seconds: float) -> str:
    """docker's go-units HumanDuration."""
    if seconds < 1:
        return "Less than a second"
    if int(seconds) == 1:
        return "1 second"
    if seconds < 60:
        return f"{int(seconds)} seconds"
    minutes = int(seconds / 60)
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = int(seconds / 3600 + 0.5)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{hours // 24 // 365} years"


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([bkmgt]?)b?", text.strip().lower())
    if not m:
        raise DockerError(f"invalid size: '{text}'", 125)
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


def image_present(image: str, node_dir: Path) -> bool:
    extra = read_json(node_dir / "images.json")
    names = set(LOCAL_IMAGES) | set(extra if isinstance(extra, list) else [])
    base = image if ":" in image.rsplit("/", 1)[-1] else image + ":latest"
    return image in names or base in names or "vllm" in image.lower() or "litellm" in image.lower()


def image_id(image: str) -> str:
    return "sha256:" + hashlib.sha256(("sim-image:" + image).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------
# Go template subset for --format

_TOKEN = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.S)


def _lookup(obj: Any, path: str) -> Any:
    if path in (".", ""):
        return obj
    cur = obj
    for part in path.lstrip(".").split("."):
        if isinstance(cur, dict):
            cur = cur.get(part)
        else:
            return None
    return cur


def _go_str(v: Any) -> str:
    if v is None:
        return "<no value>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_go_str(x)}" for k, x in v.items()) + "]"
    if isinstance(v, list):
        return "[" + " ".join(_go_str(x) for x in v) + "]"
    return str(v)


def _eval(expr: str, obj: Any) -> Any:
    parts = shlex.split(expr)
    if not parts:
        return None
    fn, rest = parts[0], parts[1:]
    if fn.startswith("."):
        return _lookup(obj, fn)
    if fn == "json":
        return json.dumps(_eval(" ".join(shlex.quote(p) for p in rest), obj), separators=(",", ":"))
    if fn in ("lower", "upper", "title"):
        v = _go_str(_eval(" ".join(shlex.quote(p) for p in rest), obj))
        return getattr(v, fn)()
    if fn == "index" and len(rest) >= 2:
        cur = _lookup(obj, rest[0])
        for key in rest[1:]:
            cur = cur.get(key) if isinstance(cur, dict) else None
        return cur
    if fn == "len":
        v = _lookup(obj, rest[0]) if rest else None
        return len(v) if isinstance(v, (list, dict, str)) else 0
    raise DockerError(f'template: :1: function "{fn}" not defined', 1)


def render(template: str, obj: Any) -> str:
    """Render the supported Go template subset against one object."""
    template = template.replace("\\t", "\t").replace("\\n", "\n")
    pos = 0
    tokens: list[tuple[str, str]] = []
    for m in _TOKEN.finditer(template):
        tokens.append(("text", template[pos:m.start()]))
        tokens.append(("action", m.group(1)))
        pos = m.end()
    tokens.append(("text", template[pos:]))

    def run(i: int, stop: tuple[str, ...]) -> tuple[str, int, str]:
        out = []
        while i < len(tokens):
            kind, val = tokens[i]
            if kind == "text":
                out.append(val)
                i += 1
                continue
            word = val.split(None, 1)[0] if val else ""
            if word in stop:
                return "".join(out), i, word
            if word == "if":
                cond = _eval(val[2:].strip(), obj)
                then, i, ended = run(i + 1, ("else", "end"))
                other = ""
                if ended == "else":
                    other, i, _ = run(i + 1, ("end",))
                out.append(then if cond not in (None, False, 0, "", [], {}) else other)
                i += 1
                continue
            v = _eval(val, obj)
            out.append(v if isinstance(v, str) else _go_str(v))
            i += 1
        return "".join(out), i, ""

    return run(0, ())[0]


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

    def __enter__(self) -> "Store":
        self._lock_fd = self._open_lock()
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def cdir(self, name: str) -> Path:
        return self.root / name

    def names(self) -> list[str]:
        return sorted(p.parent.name for p in self.root.glob("*/container.json"))

    def get(self, ref: str) -> dict | None:
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

    def all(self) -> list[dict]:
        recs = [self.get(n) for n in self.names()]
        return [r for r in recs if r]

    def save(self, rec: dict) -> None:
        d = self.cdir(rec["name"])
        d.mkdir(parents=True, exist_ok=True)
        write_atomic(d / "container.json", json.dumps(rec, indent=1))

    def refresh(self, rec: dict) -> dict:
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

    def _mark_exited(self, rec: dict) -> dict:
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
        try:
            self.save(rec)
        except OSError:
            pass
        return rec


def _kill_group(pid: int, sig: int) -> None:
    if not pid:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def health_of(store: Store, rec: dict) -> str | None:
    if not rec.get("healthcheck"):
        return None
    if rec.get("state") != "running":
        return "unhealthy"
    ld = read_json(store.node_dir / "load" / f"{rec['name']}.json")
    ready = (isinstance(ld, dict) and ld.get("phase") == "ready") or (store.cdir(rec["name"]) / "ready").is_file()
    return "healthy" if ready else "starting"


def status_text(store: Store, rec: dict, now: float) -> str:
    state = rec.get("state")
    if state == "running":
        h = health_of(store, rec)
        suffix = {"healthy": " (healthy)", "starting": " (health: starting)", "unhealthy": " (unhealthy)"}.get(h or "", "")
        return f"Up {human_duration(now - rec['started_at'])}{suffix}"
    if state == "exited":
        return f"Exited ({rec.get('exit_code', 0)}) {human_duration(now - (rec.get('finished_at') or now))} ago"
    return "Created"


def inspect_obj(store: Store, rec: dict) -> dict:
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


def ps_obj(store: Store, rec: dict, now: float) -> dict:
    cmd = shlex.join(rec.get("cmd") or [])
    return {
        "Command": json.dumps(cmd[:20] + ("…" if len(cmd) > 20 else ""), ensure_ascii=False), "CreatedAt":
        datetime.fromtimestamp(rec["created"], timezone.utc).strftime("%Y-%m-%d %H:%M:%S +0000 UTC"),
        "ID": rec["id"][:12], "Image": rec["image"],
        "Labels": ",".join(f"{k}={v}" for k, v in rec.get("labels", {}).items()), "LocalVolumes": "0",
        "Mounts": ",".join(d for _, d, _ in rec.get("mounts", [])), "Names": rec["name"],
        "Networks": rec.get("network", "bridge"), "Ports": "", "RunningFor": human_duration(now - rec["created"]) + " ago",
        "Size": "0B", "State": rec["state"], "Status": status_text(store, rec, now),
    }


# ---------------------------------------------------------------------------------------------------
# what a container runs

def _secret_name(name: str) -> bool:
    try:
        from ..secrets import is_secret_name
        return is_secret_name(name)
    except ImportError:
        return bool(re.search(r"(TOKEN|KEY|SECRET|PASSWORD|PASSWD)", name.upper()))


_SHELL_OP = re.compile(r"^(\d?>>?|\d?<|&&|\|\||;|\||&|\d?>&\d)")


def _vllm_args(cmd: list[str]) -> list[str] | None:
    """The vLLM arguments when a command starts a vLLM server, else None."""
    if len(cmd) >= 3 and cmd[0] in ("bash", "sh", "/bin/bash", "/bin/sh") and cmd[1] in ("-c", "-lc"):
        try:
            words = shlex.split(re.sub(r"\\[ \t]*\r?\n", " ", cmd[2]))
        except ValueError:
            return None
        for i in range(len(words)):
            if words[i] in ("exec", "env") or _SHELL_OP.match(words[i]) or "=" in words[i]:
                continue
            inner = _vllm_args(words[i:])
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
    args = _vllm_args(full)
    if args is not None:
        return "sparkconsole.sim.server", args
    exe = os.path.basename(full[0]) if full else ""
    if exe == "vllm-router" or (not full and "vllm-router" in image):
        return "sparkconsole.sim.router", ["--flavor", "vllm-router", *full[1:]]
    if exe == "litellm" or (not full and "litellm" in image) or (full and "litellm" in image and full[0].startswith("-")):
        return "sparkconsole.sim.router", ["--flavor", "litellm", *(full[1:] if exe == "litellm" else full)]
    return "sparkconsole.sim.server", ["--sim-idle", "--", *full]


def spawn(store: Store, rec: dict, module: str, args: list[str], *, exec_: bool = False) -> int:
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


def start_container(store: Store, rec: dict) -> None:
    module, args = program_for(rec["image"], rec.get("cmd") or [], rec.get("entrypoint"))
    rec["pid"] = spawn(store, rec, module, args)
    rec["state"] = "running"
    rec["started_at"] = time.time()
    rec["finished_at"] = None
    rec["exit_code"] = 0
    rec["oom_killed"] = False
    rec["exec_pids"] = []
    store.save(rec)


def stop_container(store: Store, rec: dict, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
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


def remove_container(store: Store, rec: dict) -> None:
    d = store.cdir(rec["name"])
    for p in sorted(d.glob("*"), reverse=True):
        if p.is_file():
            p.unlink()
    d.rmdir()


# ---------------------------------------------------------------------------------------------------
# argument parsing (docker's flag shapes: --flag value, --flag=value, -abc short bundles)

RUN_VALUE_FLAGS = {
    "--name", "--gpus", "--network", "--net", "--ipc", "--memory", "-m", "--shm-size", "-e", "--env", "--env-file",
    "-v", "--volume", "--mount", "--restart", "--ulimit", "-p", "--publish", "--entrypoint", "-l", "--label",
    "--health-cmd", "--health-interval", "--health-timeout", "--health-retries", "--health-start-period",
    "--pull", "--runtime", "--cap-add", "--cap-drop", "--device", "--tmpfs", "-u", "--user", "-w", "--workdir",
    "--memory-swap", "--cpus", "--hostname", "-h", "--pid", "--security-opt", "--log-driver", "--log-opt",
    "--platform", "--stop-timeout", "--add-host", "--group-add", "--cgroupns", "--userns",
}
RUN_BOOL_FLAGS = {"-d", "--detach", "--rm", "--init", "--privileged", "-i", "--interactive", "-t", "--tty",
                  "--no-healthcheck", "-P", "--publish-all", "--read-only"}


def split_flags(args: list[str], value_flags: set[str], bool_flags: set[str], *, stop_at_positional: bool):
    """(flags as (name, value) list, positionals). Unknown flags are docker's 'unknown flag' error."""
    flags: list[tuple[str, str | None]] = []
    pos: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            pos.extend(args[i + 1:])
            break
        if a.startswith("--") or (a.startswith("-") and len(a) > 1 and not a[1].isdigit()):
            name, eq, val = a.partition("=")
            if name in value_flags:
                if not eq:
                    i += 1
                    if i >= len(args):
                        raise DockerError(f"flag needs an argument: {name}", 125)
                    val = args[i]
                flags.append((name, val))
            elif name in bool_flags:
                flags.append((name, None))
            elif not name.startswith("--") and len(name) > 2 and all(f"-{c}" in bool_flags | value_flags for c in name[1:]):
                for c in name[1:]:
                    if f"-{c}" in value_flags:
                        i += 1
                        flags.append((f"-{c}", args[i] if i < len(args) else ""))
                    else:
                        flags.append((f"-{c}", None))
            else:
                raise DockerError(f"unknown flag: {name}\nSee 'docker --help'.", 125)
            i += 1
            continue
        if stop_at_positional:
            pos.extend(args[i:])
            break
        pos.append(a)
        i += 1
    return flags, pos


def _get(flags: list[tuple[str, str | None]], *names: str) -> str | None:
    v = None
    for n, val in flags:
        if n in names:
            v = val if val is not None else ""
    return v


def _all(flags: list[tuple[str, str | None]], *names: str) -> list[str]:
    return [val or "" for n, val in flags if n in names]


# ---------------------------------------------------------------------------------------------------
# subcommands

def out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")


def cmd_run(store: Store, args: list[str]) -> int:
    flags, pos = split_flags(args, RUN_VALUE_FLAGS, RUN_BOOL_FLAGS, stop_at_positional=True)
    if not pos:
        raise DockerError('"docker run" requires at least 1 argument.', 125)
    image, cmd = pos[0], pos[1:]
    if not image_present(image, store.node_dir):
        raise DockerError(f"Unable to find image '{image}' locally\ndocker: Error response from daemon: pull access "
                          f"denied for {image}, repository does not exist or may require 'docker login' "
                          "(simulated node: no registry)", 125)
    name = _get(flags, "--name") or f"sim_{hashlib.sha1(str(time.time()).encode()).hexdigest()[:8]}"
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name):
        raise DockerError(f'Invalid container name ({name}), only [a-zA-Z0-9][a-zA-Z0-9_.-] are allowed', 125)
    env = []
    for e in _all(flags, "-e", "--env"):
        k, eq, v = e.partition("=")
        env.append(f"{k}=<redacted>" if eq and _secret_name(k) else e)
    labels = dict((lb.partition("=")[0], lb.partition("=")[2]) for lb in _all(flags, "-l", "--label"))
    mounts = []
    for v in _all(flags, "-v", "--volume"):
        parts = v.split(":")
        mounts.append((parts[0], parts[1] if len(parts) > 1 else parts[0], parts[2] if len(parts) > 2 else "rw"))
    mem = _get(flags, "--memory", "-m")
    shm = _get(flags, "--shm-size")
    with store:
        if store.get(name):
            raise DockerError(f'docker: Error response from daemon: Conflict. The container name "/{name}" is '
                              f"already in use. You have to remove (or rename) that container to be able to reuse "
                              "that name.", 125)
        created = time.time()
        rec = {
            "id": hashlib.sha256(f"{name}:{created}:{os.getpid()}".encode()).hexdigest(), "name": name,
            "image": image, "cmd": cmd, "entrypoint": _get(flags, "--entrypoint"), "created": created,
            "state": "created", "pid": 0, "exit_code": 0, "restart_count": 0, "oom_killed": False,
            "memory_b": parse_size(mem) if mem else 0, "shm_size_b": parse_size(shm) if shm else 67108864,
            "network": _get(flags, "--network", "--net") or "bridge", "ipc": _get(flags, "--ipc") or "private",
            "gpus": _get(flags, "--gpus"), "init": _get(flags, "--init") is not None,
            "privileged": _get(flags, "--privileged") is not None, "restart": _get(flags, "--restart") or "no",
            "auto_remove": _get(flags, "--rm") is not None, "env": env, "labels": labels, "mounts": mounts,
            "healthcheck": _get(flags, "--health-cmd"), "exec_pids": [],
        }
        store.cdir(name).mkdir(parents=True, exist_ok=True)
        start_container(store, rec)
    if _get(flags, "-d", "--detach") is not None:
        out(rec["id"])
        return 0
    return follow_logs(store, name, tail=None, follow=True, wait_exit=True)


def follow_logs(store: Store, name: str, *, tail: int | None, follow: bool, wait_exit: bool = False) -> int:
    path = store.cdir(name) / "log"
    data = path.read_bytes() if path.is_file() else b""
    if tail is not None:
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-tail:]) if tail > 0 else b""
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    if not follow:
        return 0
    offset = path.stat().st_size if path.is_file() else 0
    while True:
        rec = store.get(name)
        running = bool(rec and rec.get("state") == "running")
        if path.is_file() and path.stat().st_size > offset:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        elif not running:
            return int(rec.get("exit_code", 0)) if (rec and wait_exit) else 0
        else:
            time.sleep(0.2)


def cmd_logs(store: Store, args: list[str]) -> int:
    flags, pos = split_flags(args, {"--tail", "-n", "--since", "--until"}, {"-f", "--follow", "-t", "--timestamps", "--details"},
                             stop_at_positional=False)
    if len(pos) != 1:
        raise DockerError('"docker logs" requires exactly 1 argument.', 1)
    rec = store.get(pos[0])
    if not rec:
        raise DockerError(f"Error response from daemon: No such container: {pos[0]}", 1)
    t = _get(flags, "--tail", "-n")
    tail = None if t in (None, "all") else int(t)
    return follow_logs(store, rec["name"], tail=tail, follow=_get(flags, "-f", "--follow") is not None)


def _format_rows(fmt: str | None, objs: list[dict], default_table: list[tuple[str, str]]) -> None:
    if fmt in (None, "", "table"):
        fmt = "table " + "\t".join(f"{{{{.{k}}}}}" for k, _ in default_table)
    if fmt == "json":
        fmt = "{{json .}}"
    if fmt.startswith("table"):
        body = fmt[5:].strip()
        header = render(body, {k: title for k, title in default_table} | {
            k: k.upper() for k in re.findall(r"\{\{\s*\.(\w+)", body) if k not in dict(default_table)})
        rows = [header.split("\t")] + [render(body, o).split("\t") for o in objs]
        widths = [max(len(r[i]) if i < len(r) else 0 for r in rows) for i in range(max(len(r) for r in rows))]
        for r in rows:
            out("   ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
        return
    for o in objs:
        out(render(fmt, o))


def cmd_ps(store: Store, args: list[str]) -> int:
    flags, pos = split_flags(args, {"--format", "--filter", "-f", "-n", "--last"},
                             {"-a", "--all", "-q", "--quiet", "--no-trunc", "-s", "--size", "-l", "--latest"},
                             stop_at_positional=False)
    if pos:
        raise DockerError('"docker ps" accepts no arguments.', 1)
    now = time.time()
    recs = store.all()
    if _get(flags, "-a", "--all") is None:
        recs = [r for r in recs if r["state"] == "running"]
    for f in _all(flags, "--filter", "-f"):
        k, _, v = f.partition("=")
        if k == "name":
            recs = [r for r in recs if re.search(v, r["name"])]
        elif k == "status":
            recs = [r for r in recs if r["state"] == v]
        elif k == "label":
            lk, eq, lv = v.partition("=")
            recs = [r for r in recs if lk in r.get("labels", {}) and (not eq or r["labels"][lk] == lv)]
        elif k in ("id", "ancestor"):
            recs = [r for r in recs if (r["id"].startswith(v) if k == "id" else r["image"] == v)]
        else:
            raise DockerError(f"Error response from daemon: invalid filter '{k}'", 1)
    recs.sort(key=lambda r: r["created"], reverse=True)
    objs = [ps_obj(store, r, now) for r in recs]
    if _get(flags, "-q", "--quiet") is not None:
        for r in recs:
            out(r["id"] if _get(flags, "--no-trunc") is not None else r["id"][:12])
        return 0
    _format_rows(_get(flags, "--format"), objs, [("ID", "CONTAINER ID"), ("Image", "IMAGE"), ("Command", "COMMAND"),
                                                 ("RunningFor", "CREATED"), ("Status", "STATUS"), ("Ports", "PORTS"),
                                                 ("Names", "NAMES")])
    return 0


def cmd_inspect(store: Store, args: list[str], *, images: bool = False) -> int:
    flags, pos = split_flags(args, {"--format", "-f", "--type"}, {"-s", "--size"}, stop_at_positional=False)
    if not pos:
        raise DockerError('"docker inspect" requires at least 1 argument.', 1)
    kind = "image" if images else _get(flags, "--type")
    objs, rc = [], 0
    for ref in pos:
        obj = None
        if kind in (None, "container"):
            rec = store.get(ref)
            obj = inspect_obj(store, rec) if rec else None
        if obj is None and kind in (None, "image") and image_present(ref, store.node_dir):
            obj = {"Id": image_id(ref), "RepoTags": [ref if ":" in ref.rsplit("/", 1)[-1] else ref + ":latest"],
                   "RepoDigests": [], "Created": "2026-01-15T10:00:00Z", "Architecture": "arm64", "Os": "linux",
                   "Size": 21474836480, "Simulated": True}
        if obj is None:
            sys.stderr.write(f"Error: No such {'image' if kind == 'image' else 'object'}: {ref}\n")
            rc = 1
            continue
        objs.append(obj)
    fmt = _get(flags, "--format", "-f")
    if fmt:
        for o in objs:
            out(render(fmt, o))
    else:
        out(json.dumps(objs, indent=4))
    return rc


def _each(store: Store, pos: list[str], fn) -> int:
    rc = 0
    for ref in pos:
        with store:
            rec = store.get(ref)
            if not rec:
                sys.stderr.write(f"Error response from daemon: No such container: {ref}\n")
                rc = 1
                continue
            try:
                fn(rec)
            except DockerError as e:
                sys.stderr.write(f"{e}\n")
                rc = e.rc
                continue
        out(ref)
    return rc


def cmd_stop(store: Store, args: list[str], sig: int = signal.SIGTERM) -> int:
    flags, pos = split_flags(args, {"-t", "--time", "--timeout", "-s", "--signal"}, set(), stop_at_positional=False)
    if not pos:
        raise DockerError('"docker stop" requires at least 1 argument.', 1)
    timeout = float(_get(flags, "-t", "--time", "--timeout") or 10)
    s = _get(flags, "-s", "--signal")
    if s:
        sig = getattr(signal, s if s.startswith("SIG") else "SIG" + s, sig)
    return _each(store, pos, lambda rec: stop_container(store, rec, 0.0 if sig == signal.SIGKILL else timeout, sig))


def cmd_start(store: Store, args: list[str]) -> int:
    _, pos = split_flags(args, set(), {"-a", "--attach", "-i", "--interactive"}, stop_at_positional=False)
    return _each(store, pos, lambda rec: rec["state"] == "running" or start_container(store, rec))


def cmd_restart(store: Store, args: list[str]) -> int:
    flags, pos = split_flags(args, {"-t", "--time", "--timeout", "-s", "--signal"}, set(), stop_at_positional=False)
    timeout = float(_get(flags, "-t", "--time", "--timeout") or 10)

    def restart(rec: dict) -> None:
        stop_container(store, rec, timeout)
        start_container(store, rec)
    return _each(store, pos, restart)


def cmd_rm(store: Store, args: list[str]) -> int:
    flags, pos = split_flags(args, set(), {"-f", "--force", "-v", "--volumes", "-l", "--link"}, stop_at_positional=False)
    force = _get(flags, "-f", "--force") is not None

    def rm(rec: dict) -> None:
        if rec["state"] == "running":
            if not force:
                raise DockerError(f'Error response from daemon: cannot remove container "/{rec["name"]}": container is '
                                  "running: stop the container before removing or force remove", 1)
            stop_container(store, rec, 0.0, signal.SIGKILL)
        remove_container(store, rec)
    if force:
        # docker rm -f on a missing container is quiet and succeeds.
        pos = [p for p in pos if store.get(p)] or []
    return _each(store, pos, rm)


def cmd_exec(store: Store, args: list[str]) -> int:
    flags, pos = split_flags(args, {"-e", "--env", "-w", "--workdir", "-u", "--user", "--env-file"},
                             {"-d", "--detach", "-i", "--interactive", "-t", "--tty", "--privileged"},
                             stop_at_positional=True)
    if len(pos) < 2:
        raise DockerError('"docker exec" requires at least 2 arguments.', 1)
    with store:
        rec = store.get(pos[0])
        if not rec:
            raise DockerError(f"Error response from daemon: No such container: {pos[0]}", 1)
        if rec["state"] != "running":
            raise DockerError(f"Error response from daemon: container {rec['id']} is not running", 1)
        cmd = pos[1:]
        vargs = _vllm_args(cmd)
        if vargs is None:
            if cmd[0] in ("true", ":"):
                return 0
            if cmd[0] == "echo":
                out(" ".join(cmd[1:]))
                return 0
            if os.path.basename(cmd[0]) == "ray" and cmd[1:2] == ["status"]:
                out(ray_status(store, rec))
                return 0
            raise DockerError(f'OCI runtime exec failed: exec failed: simulated container cannot run "{cmd[0]}"', 126)
        pid = spawn(store, rec, "sparkconsole.sim.server", vargs, exec_=True)
        rec.setdefault("exec_pids", []).append(pid)
        store.save(rec)
    if _get(flags, "-d", "--detach") is not None:
        return 0
    while pid_alive(pid):
        time.sleep(0.2)
    return 0


def ray_status(store: Store, head: dict) -> str:
    """`ray status` on a simulated Ray head: one Active line per running `ray start` container, on any simulated
    node of this cluster (the node directories side by side), that is this head or joined its address."""
    def opt(cmd: list[str], name: str) -> str | None:
        return cmd[cmd.index(name) + 1] if name in cmd[:-1] else None
    address = f"{opt(head['cmd'], '--node-ip-address')}:{opt(head['cmd'], '--port')}"
    lines = []
    for path in sorted(store.node_dir.parent.glob("*/containers/*/container.json")):
        rec = read_json(path)
        if not isinstance(rec, dict) or rec.get("state") != "running" or "start" not in rec.get("cmd", []):
            continue
        if rec["id"] == head["id"] or opt(rec["cmd"], "--address") == address:
            lines.append(f" 1 node_{rec['id'][:56]}")
    return ("======== Autoscaler status: SIMULATED ========\nNode status\n" + "-" * 63 + "\nActive:\n"
            + "\n".join(lines) + "\nPending:\n (no pending nodes)")


def cmd_images(store: Store, args: list[str]) -> int:
    flags, _ = split_flags(args, {"--format", "--filter", "-f"}, {"-a", "--all", "-q", "--quiet", "--no-trunc",
                                                                   "--digests"}, stop_at_positional=False)
    extra = read_json(store.node_dir / "images.json")
    names = sorted(set(LOCAL_IMAGES) | set(extra if isinstance(extra, list) else []))
    objs = []
    for n in names:
        repo, _, tag = n.rpartition(":") if ":" in n.rsplit("/", 1)[-1] else (n, "", "latest")
        objs.append({"Repository": repo, "Tag": tag, "ID": image_id(n)[7:19], "CreatedSince": "10 months ago",
                     "Size": "20GB"})
    if _get(flags, "-q", "--quiet") is not None:
        for o in objs:
            out(o["ID"])
        return 0
    _format_rows(_get(flags, "--format"), objs, [("Repository", "REPOSITORY"), ("Tag", "TAG"), ("ID", "IMAGE ID"),
                                                 ("CreatedSince", "CREATED"), ("Size", "SIZE")])
    return 0


def cmd_pull(store: Store, args: list[str]) -> int:
    _, pos = split_flags(args, {"--platform"}, {"-q", "--quiet", "-a", "--all-tags"}, stop_at_positional=False)
    if len(pos) != 1:
        raise DockerError('"docker pull" requires exactly 1 argument.', 1)
    if image_present(pos[0], store.node_dir):
        out(f"Status: Image is up to date for {pos[0]}")
        return 0
    raise DockerError(f"Error response from daemon: pull access denied for {pos[0]} (simulated node: no registry)", 1)


def cmd_info(store: Store, args: list[str], *, version: bool = False) -> int:
    flags, _ = split_flags(args, {"--format", "-f"}, set(), stop_at_positional=False)
    recs = store.all()
    info = {"ServerVersion": SERVER_VERSION, "Name": store.sim.get("name", ""), "Containers": len(recs),
            "ContainersRunning": sum(r["state"] == "running" for r in recs), "Images": len(LOCAL_IMAGES),
            "Driver": "overlay2", "OperatingSystem": "Simulated DGX OS", "Architecture": "aarch64", "NCPU": 20,
            "MemTotal": 130675736576, "Runtimes": {"nvidia": {"path": "nvidia-container-runtime"}, "runc": {}},
            "Simulated": True}
    if version:
        info = {"Client": {"Version": SERVER_VERSION, "ApiVersion": "1.48"},
                "Server": {"Version": SERVER_VERSION, "ApiVersion": "1.48"}}
    fmt = _get(flags, "--format", "-f")
    out(render(fmt, info) if fmt else json.dumps(info, indent=2))
    return 0


GLOBAL_VALUE_FLAGS = {"-H", "--host", "--context", "-c", "-l", "--log-level", "--config"}


def dispatch(store: Store, argv: list[str]) -> int:
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in GLOBAL_VALUE_FLAGS else 1
    if i >= len(argv):
        raise DockerError("Usage:  docker [OPTIONS] COMMAND (simulated)", 0)
    cmd, rest = argv[i], argv[i + 1:]
    if cmd in ("container", "image") and rest:
        sub, rest = rest[0], rest[1:]
        if cmd == "image":
            table = {"inspect": lambda a: cmd_inspect(store, a, images=True), "ls": lambda a: cmd_images(store, a),
                     "list": lambda a: cmd_images(store, a), "pull": lambda a: cmd_pull(store, a)}
            if sub not in table:
                raise DockerError(f"docker image {sub}: not supported by the simulated node", 1)
            return table[sub](rest)
        cmd = {"ls": "ps", "list": "ps"}.get(sub, sub)
    handlers = {
        "ps": cmd_ps, "inspect": cmd_inspect, "run": cmd_run, "start": cmd_start, "stop": cmd_stop,
        "kill": lambda s, a: cmd_stop(s, a, signal.SIGKILL), "rm": cmd_rm, "restart": cmd_restart,
        "logs": cmd_logs, "exec": cmd_exec, "images": cmd_images, "pull": cmd_pull,
        "info": cmd_info, "version": lambda s, a: cmd_info(s, a, version=True),
    }
    if cmd not in handlers:
        raise DockerError(f"docker: '{cmd}' is not a docker command (simulated node supports: "
                          f"{', '.join(sorted(handlers))})", 1)
    return handlers[cmd](store, rest)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] != "--node-dir":
        sys.stderr.write("usage: python -m sparkconsole.sim.dockershim --node-dir DIR DOCKER-ARGS...\n")
        return 2
    store = Store(Path(argv[1]))
    try:
        return dispatch(store, argv[2:])
    except DockerError as e:
        sys.stderr.write(f"{e}\n")
        return e.rc
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
