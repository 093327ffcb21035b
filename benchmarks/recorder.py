"""The flight recorder's cost: bytes per node-hour on disk, and the console's extra CPU at 2 and 32 nodes × 2 Hz.

    .venv/bin/python benchmarks/recorder.py [--seconds 600] [--smoke]

Ticks are the GB10 recording's (tests/fixtures/agent-gb10-replay.jsonl), re-timed to 2 Hz per node with
MemAvailable wandering by a few MiB (so rows are not identical). They go through exactly what the console runs
per tick: Recorder.on_node (queue) + Guardian.on_node (forecast every second, alert engine) + the writer thread
(SQLite WAL batches). Fast-forwarded: CPU is measured with time.process_time() (every thread of the process) for
`--seconds` seconds of ticks, and divided by those seconds: the share of one core the console would spend on it
in real time. Targets (issue 16): ≤ 2 % of a core more at 32 nodes, ≤ 50 MB per node-day at full rate.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparkconsole.alerts import AlertEngine  # noqa: E402
from sparkconsole.config import ClusterConfig, NodeConfig, Thresholds  # noqa: E402
from sparkconsole.nodes.recording import load_recording, split_recording  # noqa: E402
from sparkconsole.nodes.samples import NodeState, Tick  # noqa: E402
from sparkconsole.protect import Guardian  # noqa: E402
from sparkconsole.recorder.feed import Recorder  # noqa: E402


class FakeNode:
    """What Recorder/Guardian read of a NodeMonitor (the monitor's own parsing is not the recorder's cost)."""

    def __init__(self, cfg: NodeConfig) -> None:
        self.name, self.config = cfg.name, cfg
        self.state, self.since, self.last_error = NodeState.LIVE, time.time(), None
        self.info, self.last, self.containers, self.transport = None, None, (), None


def run(nodes: int, seconds: float, tmp: Path) -> dict:
    _, ticks = split_recording(load_recording(ROOT / "tests/fixtures/agent-gb10-replay.jsonl"))
    cfgs = tuple(NodeConfig(name=f"spark{i}", address=f"10.0.0.{i + 1}") for i in range(nodes))
    cluster = ClusterConfig(nodes=cfgs, endpoints=(), source=str(tmp / f"c{nodes}.yaml"))
    path = tmp / f"rec-{nodes}.sqlite"
    rec = Recorder.open(cluster, path)
    guardian = Guardian(cluster, AlertEngine(Thresholds()), recorder=rec)
    fakes = [FakeNode(c) for c in cfgs]
    # parse once, outside the measurement: the monitor parses ticks whether or not the recorder runs
    t0 = time.time() - seconds
    n_ticks = int(seconds * 2)
    prepared = []
    for k in range(n_ticks):
        d = dict(ticks[k % len(ticks)])
        d["time"] = t0 + k * 0.5
        d["seq"] = k
        if isinstance(d.get("mem"), dict):
            d["mem"] = {**d["mem"], "available_kb": d["mem"]["available_kb"] - (k * 7919) % 4096}
        prepared.append(Tick.from_json(d, d["time"]))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for tick in prepared:
        for f in fakes:
            f.last = tick
            rec.on_node(f)
            guardian.on_node(f)
    rec.close()                       # waits for the writer thread: its CPU is in the figure
    cpu = time.process_time() - cpu0
    size = path.stat().st_size + sum(p.stat().st_size for p in tmp.glob(f"rec-{nodes}.sqlite-*"))
    node_hours = nodes * seconds / 3600
    return {"nodes": nodes, "seconds": seconds, "ticks": n_ticks * nodes, "cpu_s": round(cpu, 3),
            "core_pct": round(100 * cpu / seconds, 2), "us_per_tick": round(1e6 * cpu / (n_ticks * nodes), 1),
            "bytes_per_node_hour": int(size / node_hours), "mb_per_node_day": round(size / node_hours * 24 / 1e6, 1),
            "wall_s": round(time.perf_counter() - wall0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs every benchmark so)")
    args = ap.parse_args()
    if args.smoke:
        args.seconds = 2.0
    with tempfile.TemporaryDirectory() as d:
        import os
        os.environ["SPARKCONSOLE_STATE_DIR"] = d
        for n in (2, 32):
            print(json.dumps(run(n, args.seconds, Path(d))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
