"""What one start of the test bed's vLLM server costs: seconds to /health 200 and the machine's CPU seconds for it.

    .venv/bin/python benchmarks/vllm_start.py [--rounds 3] [--smoke]

Alternates the two process layouts of vLLM CPU 0.32 on one GPU-less "GPU", so both meet the same stretches of a noisy
machine:
- `mp`: vLLM's default on CPU (platforms/cpu.py turns `uni` into `mp`): API server, engine core and a worker process,
  each importing torch and vLLM;
- `uni`: VLLM_ENABLE_V1_MULTIPROCESSING=0, which the CPU platform reads as leave `uni` alone: the model runs inside
  the engine core; one process fewer. The test bed sets this (tests/testbed/vllm.py, recipes/tiny-testbed.yaml).
CPU is read from /proc/stat (all processes), so run it on a quiet machine. Figures: docs/TESTBED.md.
`--smoke` starts no vLLM (a start is most of a minute of a core): it prints each layout's command and environment
and the machine's busy CPU over a second, and says what it skipped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.testbed import vllm as testbed_vllm  # noqa: E402
from tests.testbed.model import ensure_tiny_model  # noqa: E402


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def one_start(layout: str, venv, model) -> tuple[float, float, int, float]:
    # "1" is vLLM's own default: the CPU platform then turns `uni` into `mp`
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1" if layout == "mp" else "0"}
    c0, t0 = busy_seconds(), time.monotonic()
    server = testbed_vllm.wait_vllm_server(testbed_vllm.spawn_vllm_server(
        venv, model, Path(tempfile.mkdtemp(prefix="vllm-start-")), env=env), 600)
    wall, cpu = time.monotonic() - t0, busy_seconds() - c0
    try:
        testbed_vllm.chat(server.url, model.name, "hello", max_tokens=4)
        procs = testbed_vllm.group_processes(server.pid)
        rss = server.rss_bytes() / 2**30
    finally:
        server.stop()
    return wall, cpu, len(procs), rss


def smoke() -> None:
    model = testbed_vllm.TinyModel(Path("tiny-llama"))
    for layout in ("mp", "uni"):
        env = {**testbed_vllm.vllm_env_vars(), "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if layout == "mp" else "0"}
        argv = testbed_vllm.serve_argv("python", model, 8000)
        print(f"{layout:3}: {' '.join(argv[1:])} with VLLM_ENABLE_V1_MULTIPROCESSING="
              f"{env['VLLM_ENABLE_V1_MULTIPROCESSING']}")
    c0, t0 = busy_seconds(), time.monotonic()
    time.sleep(1.0)
    print(f"machine busy: {busy_seconds() - c0:.2f} CPU s in {time.monotonic() - t0:.2f} s")
    print("skipped: the vLLM starts (the test bed's vLLM venv and tiny model; run without --smoke)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    venv = testbed_vllm.ensure_vllm_venv()
    model = ensure_tiny_model(venv)
    got: dict[str, list[tuple[float, float, int, float]]] = {"mp": [], "uni": []}
    for i in range(args.rounds):
        for layout in (("mp", "uni") if i % 2 == 0 else ("uni", "mp")):
            r = one_start(layout, venv, model)
            got[layout].append(r)
            print(f"round {i + 1} {layout:3}: healthy in {r[0]:5.1f} s, {r[1]:5.1f} CPU s, {r[2]} processes, "
                  f"{r[3]:.2f} GiB", flush=True)
    for layout, rows in got.items():
        print(f"{layout:3}: median {statistics.median(r[0] for r in rows):5.1f} s to healthy, "
              f"{statistics.median(r[1] for r in rows):5.1f} CPU s per start ({len(rows)} starts)")
    ratio = statistics.median(r[1] for r in got["uni"]) / statistics.median(r[1] for r in got["mp"])
    print(f"uni / mp CPU per start: {ratio:.2f}")


if __name__ == "__main__":
    main()
