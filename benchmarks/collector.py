"""What one collector per cluster saves and costs: agents per node and recorder ticks per second with N viewers,
each on its own (as before the collector) against 1 collector + N attached viewers; the collector's and a viewer's
CPU and memory at 2 and 32 nodes × 2 Hz.

    .venv/bin/python benchmarks/collector.py [--viewers 3] [--seconds 15] [--nodes 2,32] [--smoke]

Real processes over two real sshd nodes on loopback (tests/testbed/sshd.py); 32 nodes are 16 SSH connections
to each of the two servers (one agent each, GPU-less readings of this machine: a tick line is ~40 % of a GB10's).
Viewers are `status --watch --json` processes; the collector is `record`. CPU is each process's user+system time
over the window, as a share of one core; memory is RSS at the end. Prints one JSON object; no assertion.
`--smoke`: 2 nodes, 1 viewer, a 1-s window, shorter settling.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparkconsole.recorder.reader import RecorderReader  # noqa: E402
from tests.test_collector import agents as agents_on  # noqa: E402
from tests.testbed.sshd import start_sshd_nodes  # noqa: E402

SETTLE_S = 3.0        # after every agent is up: each connection ticking
ATTACH_S = 5.0        # after the viewers start: attached and reading


def cluster_file(path: Path, sshd, n: int, interval: float) -> Path:
    servers = list(sshd)
    nodes = "".join(f"  - name: n{i:02d}\n    address: {s.address}\n"
                    f"    ssh: {{user: {s.user}, port: {s.port}, identity: {s.identity}}}\n"
                    for i, s in ((i, servers[i % len(servers)]) for i in range(n)))
    path.write_text(f"nodes:\n{nodes}ssh: {{known_hosts: {sshd.known_hosts}, connect_timeout_s: 10}}\n"
                    f"agent: {{interval_s: {interval}}}\n")
    return path


def agents(sshd) -> int:
    return sum(agents_on(node) for node in sshd)


def spawn(cfg: Path, env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sparkconsole", "--cluster", str(cfg), *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def cpu_s(proc: subprocess.Popen) -> float:
    t = psutil.Process(proc.pid).cpu_times()
    return t.user + t.system


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, 15)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait(10)


def settle(sshd, want: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while agents(sshd) < want and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(SETTLE_S)


def ticks_per_s(db: Path, t0: float, t1: float) -> float:
    r = RecorderReader(db)
    try:
        return sum(len(r.ticks(node, t0, t1)) for node in r.tick_counts()) / (t1 - t0)
    finally:
        r.close()


def run(sshd, root: Path, n_nodes: int, viewers: int, seconds: float, interval: float, alone_max: int) -> dict:
    cfg = cluster_file(root / f"c{n_nodes}.yaml", sshd, n_nodes, interval)
    out: dict = {"nodes": n_nodes, "viewers": viewers, "tick_hz": 1 / interval}
    if n_nodes <= alone_max:
        out["alone"] = alone(sshd, root, cfg, n_nodes, viewers, seconds)
        time.sleep(2)
    out["collector"] = attached(sshd, root, cfg, n_nodes, viewers, seconds)
    return out


def alone(sshd, root: Path, cfg: Path, n_nodes: int, viewers: int, seconds: float) -> dict:
    """Before the collector: every viewer on its own (no collector runs: each starts its agents)."""
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(root / f"state-alone-{n_nodes}"), "PYTHONPATH": str(ROOT)}
    procs = [spawn(cfg, env, "status", "--watch", "--json", "--timeout", "60") for _ in range(viewers)]
    try:
        settle(sshd, viewers * n_nodes)
        c0 = [cpu_s(p) for p in procs]
        time.sleep(seconds)
        return {"agents_per_node": agents(sshd) / n_nodes,
                "viewer_cpu_pct": round(100 * max(cpu_s(p) - c for p, c in zip(procs, c0, strict=False)) / seconds, 2),
                "viewer_rss_mb": round(max(psutil.Process(p.pid).memory_info().rss for p in procs) / 2**20, 1)}
    finally:
        stop(procs)


def attached(sshd, root: Path, cfg: Path, n_nodes: int, viewers: int, seconds: float) -> dict:
    """1 collector + the same viewers, attached to it; the recorder's ticks per second over the window."""
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(root / f"state-coll-{n_nodes}"), "PYTHONPATH": str(ROOT)}
    db = root / f"rec{n_nodes}.sqlite"
    coll = spawn(cfg, env, "record", "--file", str(db))
    procs = [coll]
    try:
        settle(sshd, n_nodes)
        procs += [spawn(cfg, env, "status", "--watch", "--json", "--timeout", "60") for _ in range(viewers)]
        time.sleep(ATTACH_S)
        c0 = [cpu_s(p) for p in procs]
        t0 = time.time()
        time.sleep(seconds)
        t1 = time.time()
        cpu = [round(100 * (cpu_s(p) - c) / seconds, 2) for p, c in zip(procs, c0, strict=False)]
        out = {"agents_per_node": agents(sshd) / n_nodes, "collector_cpu_pct": cpu[0],
               "collector_rss_mb": round(psutil.Process(coll.pid).memory_info().rss / 2**20, 1),
               "viewer_cpu_pct": max(cpu[1:]) if cpu[1:] else None,
               "viewer_rss_mb": round(max(psutil.Process(p.pid).memory_info().rss
                                          for p in procs[1:]) / 2**20, 1) if procs[1:] else None}
    finally:
        stop(procs)
    out["recorder_ticks_per_s"] = round(ticks_per_s(db, t0, t1 - 1), 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--viewers", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--nodes", default="2,32")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--alone-max-nodes", type=int, default=2, help="viewers on their own only up to this many nodes "
                    "(N viewers × 32 nodes of agents is more than a 2-core machine runs)")
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    args = ap.parse_args()
    if args.smoke:
        global SETTLE_S, ATTACH_S
        args.viewers, args.seconds, args.nodes, SETTLE_S, ATTACH_S = 1, 1.0, "2", 0.5, 1.0
    root = Path(tempfile.mkdtemp(prefix="sc-bench-coll-"))
    sshd = start_sshd_nodes(root / "nodes")
    try:
        figures = [run(sshd, root, int(n), args.viewers, args.seconds, args.interval, args.alone_max_nodes) for n in args.nodes.split(",")]
    finally:
        sshd.stop()
    print(json.dumps({"cpus": os.cpu_count(), "runs": figures}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
