"""sparkconsole's and llama-benchy's clients on one real vLLM server, batch by batch (tests/testbed/lockstep.py).

    .venv/bin/python benchmarks/xcheck_lockstep.py [--rounds 24] [--repeat 2] [--pp 128] [--tg 64] [--smoke]

Starts the test bed's vLLM (CPU) with the tiny model pinned to the first CPU, runs the lockstep harness on the
second, and prints per concurrency the interquartile means of each tool's per-request TTFT, prefill t/s and
decode t/s and their ratio (each round: ours, theirs, theirs, ours, one batch each). The CLI-level comparison
(tests/test_bench_vllm.py) runs whole sweeps one after the other; this one samples the same stretches of the
server's wandering speed with both tools. docs/BENCHMARKS.md has runs. `--smoke` starts no vLLM and builds
nothing: it prints the CPU split and which of the test bed's venvs the cache holds, and says what it skipped.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.testbed.benchy import BENCHY_VENV, Benchy, seed_book  # noqa: E402
from tests.testbed.cache import cache_root, cached_venv, ensure_venv  # noqa: E402
from tests.testbed.model import ensure_tiny_model  # noqa: E402
from tests.testbed.timing import compare_rounds, split_cpus  # noqa: E402
from tests.testbed.vllm import VLLM_VENV, ensure_vllm_venv, start_vllm_server  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    args = ap.parse_args()
    server_cpus, client_cpus = split_cpus()
    if args.smoke:
        print(f"server on CPUs {server_cpus}, clients on {client_cpus}")
        for spec in (VLLM_VENV, BENCHY_VENV):
            print(f"{spec.name}: {'in the cache' if cached_venv(spec) else 'not built'}")
        print(f"skipped: the vLLM start and {args.repeat} x {args.rounds} lockstep rounds (run without --smoke)")
        return 0
    venv = ensure_vllm_venv()
    model = ensure_tiny_model(venv)
    home = cache_root() / "benchy-home"
    seed_book(home)
    benchy = Benchy(ensure_venv(BENCHY_VENV), home)
    tmp = Path(tempfile.mkdtemp(prefix="xcheck-lockstep-"))
    server = start_vllm_server(venv, model, tmp, cpus=server_cpus)
    print(f"vLLM {server.url} ready in {server.start_seconds} s (CPUs {server_cpus}); clients on {client_cpus}")
    try:
        for rep in range(args.repeat):
            t0 = time.monotonic()
            data = benchy.lockstep(server.url, model, tmp / f"lockstep-{rep}.json", pp=args.pp, tg=args.tg,
                                   concurrency=(1, 2), rounds=args.rounds, cpus=client_cpus)
            print(f"\nrun {rep + 1}: {args.rounds} rounds in {time.monotonic() - t0:.0f} s "
                  "(round ratio: interquartile mean over rounds of ours/theirs; IQM: of all values)")
            for (c, key), (a, b, r) in compare_rounds(data).items():
                print(f"  c{c} {key:18s} ours {a:8.1f}  llama-benchy {b:8.1f}  IQM {100 * (a / b - 1):+5.1f}%"
                      f"  round ratio {100 * (r - 1):+5.1f}%")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
