"""The simulated docker's subcommands: run, ps, inspect, logs, start, stop, kill, rm, restart, exec (vllm serve;
ray status), images, pull, info, version — docker's flag shapes parsed (`--flag value`, `--flag=value`, `-abc`
bundles) and answered from the container store; `dispatch` picks one from a command line."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from .containers import (
    LOCAL_IMAGES,
    Store,
    image_id,
    image_present,
    inspect_obj,
    ps_obj,
    remove_container,
    spawn,
    start_container,
    stop_container,
    vllm_args,
)
from .dockerfmt import DockerError, format_rows, out, parse_size, render
from .files import pid_alive, read_json

SERVER_VERSION = "28.0.4-sim"


def _secret_name(name: str) -> bool:
    try:
        from ..secrets import is_secret_name
        return is_secret_name(name)
    except ImportError:
        return bool(re.search(r"(TOKEN|KEY|SECRET|PASSWORD|PASSWD)", name.upper()))


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


def split_flags(args: list[str], value_flags: set[str], bool_flags: set[str], *, stop_at_positional: bool
                ) -> tuple[list[tuple[str, str | None]], list[str]]:
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
        rec: dict[str, Any] = {
            "id": hashlib.sha256(f"{name}:{created}:{os.getpid()}".encode()).hexdigest(), "name": name,
            "image": image, "cmd": cmd, "entrypoint": _get(flags, "--entrypoint"), "created": created,
            "state": "created", "pid": 0, "exit_code": 0, "restart_count": 0, "oom_killed": False,
            "memory_b": parse_size(mem) if mem else 0, "shm_size_b": parse_size(shm) if shm else 67108864,
            "network": _get(flags, "--network", "--net") or "bridge", "ipc": _get(flags, "--ipc") or "private",
            "gpus": _get(flags, "--gpus"), "init": _get(flags, "--init") is not None,
            "privileged": _get(flags, "--privileged") is not None, "restart": _get(flags, "--restart") or "no",
            "auto_remove": _get(flags, "--rm") is not None, "env": env, "labels": labels, "mounts": mounts,
            "healthcheck": _get(flags, "--health-cmd"), "exec_pids": [],
            "tmpfs": [t.partition(":")[0] for t in _all(flags, "--tmpfs")],
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
    format_rows(_get(flags, "--format"), objs, [("ID", "CONTAINER ID"), ("Image", "IMAGE"), ("Command", "COMMAND"),
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


def _each(store: Store, pos: list[str], fn: Callable[[dict[str, Any]], object]) -> int:
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
    def start(rec: dict[str, Any]) -> None:
        if rec["state"] != "running":
            start_container(store, rec)
    return _each(store, pos, start)


def cmd_restart(store: Store, args: list[str]) -> int:
    flags, pos = split_flags(args, {"-t", "--time", "--timeout", "-s", "--signal"}, set(), stop_at_positional=False)
    timeout = float(_get(flags, "-t", "--time", "--timeout") or 10)

    def restart(rec: dict[str, Any]) -> None:
        stop_container(store, rec, timeout)
        start_container(store, rec)
    return _each(store, pos, restart)


def cmd_rm(store: Store, args: list[str]) -> int:
    flags, pos = split_flags(args, set(), {"-f", "--force", "-v", "--volumes", "-l", "--link"}, stop_at_positional=False)
    force = _get(flags, "-f", "--force") is not None

    def rm(rec: dict[str, Any]) -> None:
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
        vargs = vllm_args(cmd)
        if vargs is None:
            if cmd[0] in ("true", ":"):
                return 0
            if cmd[0] == "echo":
                out(" ".join(cmd[1:]))
                return 0
            if cmd[0] == "touch" and len(cmd) > 1:      # the drain gate's flag (launch/gate.py)
                for path in cmd[1:]:
                    f = store.fs(rec["name"]) / path.lstrip("/")
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.touch()
                return 0
            if cmd[:2] == ["rm", "-f"]:                  # opening the drain gate again
                for path in cmd[2:]:
                    (store.fs(rec["name"]) / path.lstrip("/")).unlink(missing_ok=True)
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


def ray_status(store: Store, head: dict[str, Any]) -> str:
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
    format_rows(_get(flags, "--format"), objs, [("Repository", "REPOSITORY"), ("Tag", "TAG"), ("ID", "IMAGE ID"),
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
    handlers: dict[str, Callable[[Store, list[str]], int]] = {
        "ps": cmd_ps, "inspect": cmd_inspect, "run": cmd_run, "start": cmd_start, "stop": cmd_stop,
        "kill": lambda s, a: cmd_stop(s, a, signal.SIGKILL), "rm": cmd_rm, "restart": cmd_restart,
        "logs": cmd_logs, "exec": cmd_exec, "images": cmd_images, "pull": cmd_pull,
        "info": cmd_info, "version": lambda s, a: cmd_info(s, a, version=True),
    }
    if cmd not in handlers:
        raise DockerError(f"docker: '{cmd}' is not a docker command (simulated node supports: "
                          f"{', '.join(sorted(handlers))})", 1)
    return handlers[cmd](store, rest)
