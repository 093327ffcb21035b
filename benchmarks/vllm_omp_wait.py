"""What OpenMP's wait policy costs the test bed's vLLM CPU server: CPU seconds and wall time for a fixed load.

    .venv/bin/python benchmarks/vllm_omp_wait.py [--rounds 2] [--busy] [--smoke]

The CPU build runs the model's layers as OpenMP parallel regions. Between two regions OpenMP's threads spin by
default, and a tiny model is mostly gaps between regions. On cores shared with other processes (the test suite's
two cores, several servers and their clients) a spinning thread waits for one that is not running.
`OMP_WAIT_POLICY=PASSIVE` (the test bed's setting: tests/testbed/vllm.py, recipes/tiny-testbed.yaml) makes them
sleep instead.

Each round starts one server per policy (alternated, so both meet the same stretches of a noisy machine), then sends
48 completions of 32 tokens, 4 at a time. `--busy` keeps one core busy with a shell loop meanwhile, as the suite's
other tests do. CPU is the server's process group's own (user + system). Figures: docs/TESTBED.md.
`--smoke` starts no vLLM: it measures the CPU of this process's own group (what a round reads of a server's)
while a busy loop runs, and says what it skipped.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.testbed import vllm as testbed_vllm  # noqa: E402
from tests.testbed.model import ensure_tiny_model  # noqa: E402

POLICIES: dict[str, str | None] = {"spin (OpenMP's default)": None, "PASSIVE": "PASSIVE"}
REQUESTS, CONCURRENCY, TOKENS = 48, 4, 32


def one_round(policy: str | None, venv, model) -> tuple[float, float, float]:
    """(CPU s to healthy, CPU s for the load, wall s for the load)."""
    server = testbed_vllm.wait_vllm_server(testbed_vllm.spawn_vllm_server(
        venv, model, Path(tempfile.mkdtemp(prefix="vllm-omp-")), env={"OMP_WAIT_POLICY": policy}), 600)
    try:
        started = testbed_vllm.group_cpu_seconds(server.proc.pid)

        def complete(_: int) -> None:
            r = httpx.post(server.url + "/v1/completions", timeout=300, json={
                "model": model.name, "prompt": "alpha bravo " * 30, "max_tokens": TOKENS, "ignore_eos": True})
            r.raise_for_status()

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(complete, range(REQUESTS)))
        wall = time.monotonic() - t0
        return started, testbed_vllm.group_cpu_seconds(server.proc.pid) - started, wall
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--busy", action="store_true", help="keep one core busy meanwhile")
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    args = ap.parse_args()
    if args.smoke:
        busy = subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True)
        try:
            before = testbed_vllm.group_cpu_seconds(busy.pid)
            time.sleep(0.2)
            print(f"a busy loop's process group: {testbed_vllm.group_cpu_seconds(busy.pid) - before:.2f} CPU s in 0.2 s")
        finally:
            busy.kill()
            busy.wait()
        print(f"skipped: {len(POLICIES)} vLLM starts and {REQUESTS} completions each (run without --smoke)")
        return
    venv = testbed_vllm.ensure_vllm_venv()
    model = ensure_tiny_model(venv)
    busy = subprocess.Popen(["sh", "-c", "while :; do :; done"]) if args.busy else None
    got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in POLICIES}
    try:
        for i in range(args.rounds):
            names = list(POLICIES) if i % 2 == 0 else list(reversed(POLICIES))
            for name in names:
                r = one_round(POLICIES[name], venv, model)
                got[name].append(r)
                print(f"round {i + 1} {name:24}: start {r[0]:5.1f} CPU s; {REQUESTS} requests at c{CONCURRENCY}: "
                      f"{r[1]:5.1f} CPU s in {r[2]:5.1f} s", flush=True)
    finally:
        if busy:
            busy.kill()
    for name, rows in got.items():
        print(f"{name:24}: median {statistics.median(r[1] for r in rows):5.1f} CPU s, "
              f"{statistics.median(r[2] for r in rows):5.1f} s for the load")
    spin, passive = (statistics.median(r[1] for r in got[n]) for n in POLICIES)
    print(f"PASSIVE / spin, CPU for the load: {passive / spin:.2f}")


if __name__ == "__main__":
    main()
