"""CLI start-up: how long `sparkconsole …` takes to answer, as a ratio to a bare interpreter start measured in the
same run (the floor: `python -c pass` from the same venv).

    .venv/bin/python benchmarks/cli_start.py [--runs 15] [--src DIR] [--smoke]

Cases (each run once per round, rounds interleaved so a busy neighbour hits all of them alike):
  --version, --help, argument errors of `status` and `recipe plan`   target: within 4x of the floor
  `recipe plan gpt-oss-120b` on a cluster file, `bench report` on an empty results file   (pay for what they use)
For the commands that do work, the heaviest imports (`python -X importtime`, cumulative) are listed: where the
rest of the time goes.

`--src DIR` (repeatable) runs the sparkconsole found in DIR (a checkout of another commit: `git archive REV
sparkconsole | tar -x -C /tmp/old`), for before/after figures from one venv, rounds interleaved. Prints one JSON
object. `--smoke`: one run of each case, no warming pass.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _time(cmd: list[str], cwd: Path, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def heaviest_imports(cmd: list[str], cwd: Path, env: dict, top: int = 6) -> list[tuple[str, float]]:
    """Top-level imports by cumulative time (ms): what a command pays for before it starts working."""
    p = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], cwd=cwd, env=env, capture_output=True, text=True)
    rows = []
    for line in p.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, cumulative, name = line[len("import time:"):].split("|")
        if not name.startswith("  "):          # nested imports are indented further
            rows.append((name.strip(), int(cumulative) / 1000))
    return [(n, round(ms, 1)) for n, ms in sorted(rows, key=lambda r: -r[1])[:top]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--src", type=Path, action="append", help="directory holding the sparkconsole package to time "
                    "(repeat to compare checkouts: rounds interleave them; default: this checkout)")
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    a = ap.parse_args()
    if a.smoke:
        a.runs = 1
    srcs = [p.resolve() for p in (a.src or [ROOT])]
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Path(tmp) / "c.yaml"
        cluster.write_text("nodes:\n  - {name: spark1, address: 192.168.100.10}\n"
                           "  - {name: spark2, address: 192.168.100.11}\n")
        results = Path(tmp) / "r.sqlite"
        sc = [py, "-m", "sparkconsole"]
        cases = {
            "floor: python -c pass": [py, "-c", "pass"],
            "--version": [*sc, "--version"],
            "--help": [*sc, "--help"],
            "status --bogus (argument error)": [*sc, "status", "--bogus"],
            "recipe plan x --port y (argument error)": [*sc, "recipe", "plan", "x", "--port", "y"],
            "recipe plan gpt-oss-120b -T 2x-solo": [*sc, "--cluster", str(cluster), "recipe", "plan", "gpt-oss-120b",
                                                    "-T", "2x-solo"],
            "bench report (empty results)": [*sc, "bench", "report", "--results", str(results)],
        }
        envs = {src: {**os.environ, "PYTHONPATH": str(src)} for src in srcs}
        for src in srcs if not a.smoke else ():
            for cmd in cases.values():          # warm the page cache and the .pyc files once
                _time(cmd, src, envs[src])
        times = {src: {k: [] for k in cases} for src in srcs}
        load = []
        for _ in range(a.runs):
            load.append(os.getloadavg()[0])
            for name, cmd in cases.items():
                for src in srcs:
                    times[src][name].append(_time(cmd, src, envs[src]))
        out: dict = {"runs": a.runs, "cpus": os.cpu_count(),
                     "load_avg_1m": {"min": round(min(load), 2), "max": round(max(load), 2)}, "by_src": {}}
        for src in srcs:
            floor = statistics.median(times[src]["floor: python -c pass"])
            r: dict = {"floor_ms": round(floor * 1000, 1), "cases": {}}
            for name, ts in times[src].items():
                med = statistics.median(ts)
                r["cases"][name] = {"median_ms": round(med * 1000, 1), "max_ms": round(max(ts) * 1000, 1),
                                    "x_floor": round(med / floor, 2)}
            for name in ("recipe plan gpt-oss-120b -T 2x-solo", "bench report (empty results)"):
                r["cases"][name]["heaviest_imports_ms"] = heaviest_imports(cases[name], src, envs[src])
            out["by_src"][str(src)] = r
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
