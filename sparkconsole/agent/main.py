"""The agent's loop: a hello, then one tick a slot on a fixed grid (no drift), each one JSON line on stdout; it ends
after --count ticks, when stdin reaches end-of-file (--watch-stdin: the console left), or when stdout is gone."""

from __future__ import annotations

import json
import os
import select
import sys
import time

from .containers import PROCS_REFRESH_S, ContainerPoller, GpuProcsReader, read_cgroup_memory
from .host import CGROUP_ROOT, guards_now, name_self, read_meminfo, read_pressure
from .sources import open_gpu_source

# Types for the checker only: the node imports nothing it does not run (`typing` included).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .sources import GpuSource

AGENT_VERSION = "0.1.0"


def _boot_id(proc_root: str) -> str | None:
    try:
        with open(os.path.join(proc_root, "sys", "kernel", "random", "boot_id"), encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def make_hello(source: GpuSource, proc_root: str, interval: float) -> dict[str, Any]:
    import socket

    u = os.uname()
    h: dict[str, Any] = {
        "type": "hello", "agent_version": AGENT_VERSION, "hostname": socket.gethostname() or u.nodename,
        "kernel": u.release, "boot_id": _boot_id(proc_root), "driver": None, "nvml_version": None,
        "gpu_source": source.name, "simulated": source.simulated, "interval_s": interval, "time": time.time(),
        "gpus": []}
    h.update(source.hello())
    h["type"] = "hello"
    return {k: v for k, v in h.items() if v is not None}


def make_tick(seq: int, source: GpuSource, proc_root: str, errors: list[str]) -> dict[str, Any]:
    t: dict[str, Any] = {"type": "tick", "seq": seq, "time": time.time()}
    gpus = source.sample(errors)
    if gpus is not None:
        t["gpus"] = gpus
    mem = read_meminfo(proc_root)
    if mem is not None:
        t["mem"] = mem
    pressure = read_pressure(proc_root)
    if pressure is not None:
        t["pressure"] = pressure
    t["guards"] = guards_now(proc_root)
    return t


def _stdin_closed(timeout: float) -> bool:
    """Waits up to `timeout` on stdin; True once the console has gone (end-of-file)."""
    r, _, _ = select.select([0], [], [], max(timeout, 0))
    if not r:
        return False
    try:
        return os.read(0, 65536) == b""
    except OSError:
        return True


def _args(argv: list[str] | None) -> Any:
    import argparse

    ap = argparse.ArgumentParser(prog="agent")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--container-interval", type=float, default=5.0)
    ap.add_argument("--count", type=int, default=0, help="stop after N ticks (0: run until stopped)")
    ap.add_argument("--gpu-source", default="auto")
    ap.add_argument("--proc-root", default="/proc")
    ap.add_argument("--containers", choices=("docker", "none"), default="docker")
    ap.add_argument("--docker-host", default=None, help="DOCKER_HOST for the container poller (a non-default engine)")
    ap.add_argument("--cgroup-root", default="/sys/fs/cgroup", help="where the node's cgroup tree is mounted")
    ap.add_argument("--watch-stdin", action="store_true")
    return ap.parse_args(argv)


def _add_containers(tick: dict[str, Any], poller: ContainerPoller, errors: list[str],
                    last_error: str | None) -> str | None:
    """The poller's newest reading into the tick (cgroups every tick, containers when a new list came), its error
    said once until it changes; returns the error now said."""
    cg = read_cgroup_memory(poller.cgroup_files, poller.cgroup_missing)
    if cg:
        tick["cgroups"] = cg
    conts, cerr = poller.take()
    if conts is not None:
        tick["containers"] = conts
    if cerr and cerr != last_error:
        errors.append(cerr)
    return cerr if (conts is not None or cerr) else last_error


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    interval = max(args.interval, 0.01)

    name_self()
    CGROUP_ROOT[0] = args.cgroup_root
    pending_errors: list[str] = []   # said once, on the first tick
    source = open_gpu_source(args.gpu_source, pending_errors)
    poller = None
    if args.docker_host:
        os.environ["DOCKER_HOST"] = args.docker_host
    if args.containers == "docker":
        poller = ContainerPoller(args.container_interval, args.proc_root, args.cgroup_root)
        if not poller.exe:
            pending_errors.append("docker: not found on PATH")
            poller = None
    # NVML's list is read every PROCS_REFRESH_S; a replay or a simulated node's list costs nothing more than the
    # file the tick already read, and follows it tick by tick
    procs = GpuProcsReader(source, args.proc_root, PROCS_REFRESH_S if source.name == "nvml" else 0.0)
    no_ids: dict[str, str] = {}
    out = sys.stdout
    last_container_error = None
    try:
        out.write(json.dumps(make_hello(source, args.proc_root, interval), separators=(",", ":")) + "\n")
        out.flush()
        start = time.monotonic()
        seq = 0
        slot = 0
        while True:
            errors, pending_errors = pending_errors, []
            tick = make_tick(seq, source, args.proc_root, errors)
            if poller is not None:
                last_container_error = _add_containers(tick, poller, errors, last_container_error)
            tick["gpu_procs"] = procs.reading(poller.ids if poller is not None else no_ids, errors)
            if errors:
                tick["errors"] = errors
            out.write(json.dumps(tick, separators=(",", ":")) + "\n")
            out.flush()
            seq += 1
            if args.count and seq >= args.count:
                return 0
            # Sleep to the next slot on a fixed grid (no drift); skip slots we were too slow for.
            slot += 1
            now = time.monotonic()
            if start + slot * interval < now:
                slot = int((now - start) / interval) + 1
            next_at = start + slot * interval
            wait = next_at - time.monotonic()
            if args.watch_stdin:
                if _stdin_closed(wait):
                    return 0
            elif wait > 0:
                time.sleep(wait)
    except (BrokenPipeError, KeyboardInterrupt):
        # The console went away: leave quietly, and keep Python from complaining at exit.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return 0
