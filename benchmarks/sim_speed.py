"""How fast the simulator runs: engine steps per second and the accuracy sweep's wall time.

    .venv/bin/python benchmarks/sim_speed.py [--smoke]

Targets: the 4-topology c1-c64 sweep with 10 runs per level (what tests/test_sim_accuracy.py runs)
well under 20 s; a c64 engine step in well under a millisecond, so a simulated server can keep up
with real time at any speed-up the demo uses.
"""

from __future__ import annotations

import argparse
import time

from sparkconsole.sim.engine import EngineArgs, SimEngine
from sparkconsole.sim.experiment import run_sweep
from sparkconsole.sim.profiles import MODELS
from sparkconsole.sim.reference import load_topology_study

ARGS = EngineArgs(max_num_batched_tokens=32768, gpu_memory_utilization=0.70, max_model_len=4096,
                  kv_cache_dtype="fp8")


def engine_steps(concurrency: int) -> tuple[float, float]:
    """(wall µs per step, simulated seconds per wall second) draining `concurrency` pp1024/tg128 requests."""
    e = SimEngine(MODELS["gpt-oss-120b"], ARGS)
    for i in range(concurrency):
        e.add_request(f"r{i}", 1024, 128)
    steps, simulated = 0, 0.0
    t0 = time.perf_counter()
    while e.has_work():
        simulated += e.step().duration_s
        steps += 1
    wall = time.perf_counter() - t0
    return 1e6 * wall / steps, simulated / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    args = ap.parse_args()
    for c in (1, 16) if args.smoke else (1, 16, 64):
        us, ratio = engine_steps(c)
        print(f"engine c{c:<3} {us:8.1f} µs/step   {ratio:10.0f}x real time")
    table = load_topology_study()
    topologies = table.topologies[:1] if args.smoke else table.topologies
    levels = table.concurrency[:2] if args.smoke else table.concurrency
    runs = 1 if args.smoke else 10
    t0 = time.perf_counter()
    for topo in topologies:
        run_sweep(topo, "gpt-oss-120b", ARGS, levels, 1024, 128, runs)
    print(f"accuracy sweep ({len(topologies)} topologies x {len(levels)} levels x {runs} runs): "
          f"{time.perf_counter() - t0:.1f} s wall")


if __name__ == "__main__":
    main()
