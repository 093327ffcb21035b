"""A simulated cluster's footprint on this machine: its state directory under the temp dir, the ports it claimed
(shared by every cluster running here: two demos or test workers starting side by side), and what an owner that
died without cleaning up left behind (its state directories, its processes)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import UserError
from .files import pid_alive, read_json, write_atomic

STATE_PREFIX = "sparkconsole-sim-"
PORT_CLAIMS = "sparkconsole-sim-ports.json"     # beside the state directories, in the temp dir


@contextlib.contextmanager
def _port_claims() -> Iterator[dict[str, list[Any]]]:
    """The live claims ("host:port" -> [owner pid, state dir]), under an exclusive lock; changes are written back.
    A claim lapses with its owner process or its state dir."""
    tmp = Path(tempfile.gettempdir())
    with open(tmp / (PORT_CLAIMS + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        raw = read_json(tmp / PORT_CLAIMS)
        raw = raw if isinstance(raw, dict) else {}
        claims = {k: v for k, v in raw.items()
                  if isinstance(v, list) and len(v) == 2 and pid_alive(v[0]) and Path(str(v[1])).is_dir()}
        yield claims
        if claims != raw:
            write_atomic(tmp / PORT_CLAIMS, json.dumps(claims))


def claim_port(host: str, preferred: int, owner: Path) -> int:
    """A port for a simulated server on `host`: `preferred` when free, else the next free one above it.

    A simulated vLLM, like the real one, binds only once its model is loaded, seconds after the port was
    chosen. A bind probe alone would hand the same free port to two clusters starting side by side (two demos,
    or test workers), and the second would read the first's /health as its own. So every live cluster's
    claims are kept in one file (_port_claims). The fallbacks stay near `preferred`, not where bind(0) would
    put them: the kernel's ephemeral range is also where outgoing connections take their ports, so one could
    hold the port by the time the server binds it."""
    with _port_claims() as claims:
        for port in range(preferred, min(preferred + 200, 65536)):
            mine = claims.get(f"{host}:{port}", [None, str(owner)])[1] == str(owner)    # claim_addresses' own
            if mine and _free(host, port):
                claims[f"{host}:{port}"] = [os.getpid(), str(owner)]
                return port
    raise UserError(f"no free port on {host}", field="--port", fix="free a port on the loopback address")


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def claim_addresses(count: int, ports: tuple[int, ...], owner: Path) -> list[str]:
    """`count` loopback addresses (127.0.x.2, 127.0.x.3, …) on which every one of `ports` is free and unclaimed,
    each claimed for `owner`.

    For a cluster whose servers bind the ports a recipe names (a launch through the recipe runner), not ports the
    cluster chooses: claim_port moves the port, this moves the addresses. A bind probe alone could pick the
    addresses where another cluster has claimed a port it has not bound yet."""
    with _port_claims() as claims:
        for third in range(0, 250):
            hosts = [f"127.0.{third}.{2 + i}" for i in range(count)]
            if all(f"{h}:{p}" not in claims and _free(h, p) for h in hosts for p in ports):
                for h in hosts:
                    for p in ports:
                        claims[f"{h}:{p}"] = [os.getpid(), str(owner)]
                return hosts
    raise UserError(f"no {count} loopback addresses with ports {', '.join(map(str, ports))} free", field="--demo",
                    fix="stop other simulated clusters (sparkconsole demo, bench matrix --demo)")


def release_ports(owner: Path) -> None:
    """Drop the claims a stopped cluster made (a crashed one's lapse by themselves)."""
    with _port_claims() as claims:
        for k in [k for k, v in claims.items() if v[1] == str(owner)]:
            del claims[k]


def sweep_stale(tmp: Path) -> list[Path]:
    """Remove state directories of simulated clusters whose owner died without cleaning up (SIGKILL):
    their processes end by themselves once the owner is gone, their files would stay forever."""
    removed = []
    for d in tmp.glob(STATE_PREFIX + "*"):
        owners = set()
        for sim_json in d.glob("*/sim.json"):
            try:
                owners.add(int(json.loads(sim_json.read_text()).get("owner_pid") or 0))
            except (OSError, ValueError, TypeError, AttributeError):
                owners.add(-1)     # unreadable: leave it alone
        if owners and not any(o <= 0 or pid_alive(o) for o in owners) and time.time() - d.stat().st_mtime > 10:
            kill_leftovers(d)
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def kill_leftovers(root: Path) -> list[int]:
    """End simulator processes that still name this state directory (ours alone: the path is unique)."""
    import psutil
    mark = str(root)
    me = os.getpid()
    victims = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if p.info["pid"] != me and any(mark in a for a in cmd) and any("sparkconsole.sim." in a for a in cmd):
                victims.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for p in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(victims, timeout=3)
    return [p.pid for p in victims]
