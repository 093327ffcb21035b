"""The published topology matrix on the simulated demo, through the operator's own command, timed.

    .venv/bin/python benchmarks/demo_matrix.py [--speed 10] [--runs 3] [--concurrency 1,2,4,8,16,32,64] [--smoke]

Runs `sparkconsole bench matrix --recipe gpt-oss-120b --demo --speed F` (a simulated two-node cluster; each
topology launched through the recipe runner and the nodes' docker shims, swept, recorded, stopped) for solo,
cluster-tp2, 2x-solo simple-shuffle and 2x-solo least-busy at pp1024 tg128, then prints:

* the wall time of the whole command (target: under 5 minutes for c1…c64 at 3 runs per level);
* per topology and level, the served figures (simulated time) beside the published ones and beside the headless
  experiment (sparkconsole/sim/experiment.py: the same model without HTTP or real time), with the error vs
  published;
* the winner per level and metric, served vs published, and how many cells agree;
* bench's advisor ("when to use which") on the served results and on the published table.

`--smoke`: solo and 2x-solo simple-shuffle at c1, one run, speed 20; its exit status says nothing of the target.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sparkconsole.bench import advisor
from sparkconsole.bench.benchy_io import bundled_published_csv, import_published_csv
from sparkconsole.bench.results import ResultsStore

TOPOLOGIES = ("solo", "cluster-tp2", "2x-solo-shuffle", "2x-solo-least-busy")
PUBLISHED_LABEL = {"2x-solo-shuffle": "2x-solo-simple-shuffle"}          # the published table's names
METRICS = (("decode_tps", "decode t/s", True), ("prefill_tps", "prefill t/s", True), ("ttft_ms", "TTFT ms", False))
TARGET_WALL_S = 300.0


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


def run_matrix(speed: float, runs: int, conc: str, results: Path) -> float:
    cmd = [sys.executable, "-m", "sparkconsole", "bench", "matrix", "--recipe", "gpt-oss-120b", "--demo",
           "--speed", str(speed), "--topologies", ",".join(TOPOLOGIES), "--pp", "1024", "--tg", "128",
           "--concurrency", conc, "--runs", str(runs), "--results", str(results)]
    print("$ " + " ".join(cmd[2:]), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    for line in proc.stderr.splitlines():
        if line.startswith(("[", "starting", "  ")) or ": pp" in line:
            print("  | " + line)
    print(proc.stdout.strip())
    if proc.returncode != 0:
        raise SystemExit(f"bench matrix failed (exit {proc.returncode})")
    return wall


def headless(conc: tuple[int, ...], runs: int) -> dict[tuple[str, int], dict[str, float]]:
    from sparkconsole.sim import experiment
    from sparkconsole.sim.engine import EngineArgs
    args = EngineArgs(max_num_batched_tokens=32768, gpu_memory_utilization=0.70, max_model_len=4096,
                      kv_cache_dtype="fp8")
    out = {}
    for topo in TOPOLOGIES:
        for r in experiment.run_sweep(PUBLISHED_LABEL.get(topo, topo), "gpt-oss-120b", args, conc, 1024, 128, runs):
            out[(topo, r.concurrency)] = {"decode_tps": r.decode_tps, "prefill_tps": r.prefill_tps,
                                          "ttft_ms": r.ttft_ms}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--speed", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    ap.add_argument("--keep", help="write the results file here (default: a temporary directory)")
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    ns = ap.parse_args()
    if ns.smoke:
        global TOPOLOGIES
        TOPOLOGIES = ("solo", "2x-solo-shuffle")
        ns.speed, ns.runs, ns.concurrency = 20.0, 1, "1"
    conc = tuple(int(c) for c in ns.concurrency.split(","))
    tmp = tempfile.mkdtemp(prefix="demo-matrix-")
    os.environ.setdefault("SPARKCONSOLE_STATE_DIR", str(Path(tmp) / "state"))   # the runner's audit log
    results = Path(ns.keep) if ns.keep else Path(tmp) / "matrix.sqlite"

    wall = run_matrix(ns.speed, ns.runs, ns.concurrency, results)
    with ResultsStore(results) as store:
        served = {}
        for lv in store.levels():
            served[(lv.label, lv.key.concurrency)] = lv
        served_levels = store.levels()
    with ResultsStore(Path(tmp) / "published.sqlite") as pub_store:
        import_published_csv(pub_store, bundled_published_csv())
        pub_levels = pub_store.levels()
    published = {(lv.label, lv.key.concurrency): lv for lv in pub_levels}
    model = headless(conc, ns.runs)

    print(f"\nwall time: {wall:.0f} s for {len(TOPOLOGIES)} topologies × {len(conc)} levels × {ns.runs} runs "
          f"at speed ×{ns.speed:g} (target < {TARGET_WALL_S:.0f} s: {'met' if wall < TARGET_WALL_S else 'MISSED'})")
    print("\nserved (simulated time) / published / headless experiment; error = served vs published\n")
    print("| topology | c | " + " | ".join(f"{t} served / pub / headless (err)" for _, t, _ in METRICS) + " |")
    print("|---|---:|" + "---:|" * len(METRICS))
    within, points = 0, 0
    for topo in TOPOLOGIES:
        for c in conc:
            lv = served.get((topo, c))
            pub = published.get((PUBLISHED_LABEL.get(topo, topo), c))
            cells = []
            for attr, _, _ in METRICS:
                s = getattr(lv, attr) if lv else None
                p = getattr(pub, attr) if pub else None
                h = model.get((topo, c), {}).get(attr)
                err = f"{(s / p - 1) * 100:+.0f}%" if s and p else "—"
                if s and p:
                    points += 1
                    within += abs(s / p - 1) <= 0.25
                cells.append(f"{_fmt(s)} / {_fmt(p)} / {_fmt(h)} ({err})")
            print(f"| {topo} | {c} | " + " | ".join(cells) + " |")
    print(f"\n{within}/{points} served points within 25% of published")

    agree, cells = 0, 0
    lines = []
    for c in conc:
        for attr, title, higher in METRICS:
            def best(table, names):
                vals = {t: getattr(table[k], attr) for t in TOPOLOGIES if (k := (names(t), c)) in table
                        and getattr(table[k], attr) is not None}
                if len(vals) < len(TOPOLOGIES):
                    return None
                return (max if higher else min)(vals, key=vals.get)
            s = best(served, lambda t: t)
            p = best(published, lambda t: PUBLISHED_LABEL.get(t, t))
            if s is None or p is None:
                continue
            cells += 1
            agree += s == p
            if s != p:
                lines.append(f"  c{c} {title}: served {s}, published {PUBLISHED_LABEL.get(p, p)}")
    print(f"winner per level and metric: served matches published in {agree}/{cells} cells")
    for line in lines:
        print(line)

    print("\n## advisor on the served matrix\n")
    print(advisor.markdown(advisor.advise(served_levels)))
    print("## advisor on the published table\n")
    print(advisor.markdown(advisor.advise(pub_levels)))
    return 0 if wall < TARGET_WALL_S or ns.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
