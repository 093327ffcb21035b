"""Runs the fault and abuse suite (tests/faults/) and prints its figures: faults tried and survived, data lost,
bad inputs tried, tracebacks shown — counted by tests/faults/conftest.py during the run, not typed in.

    .venv/bin/python benchmarks/faults.py            # everything, the 60 s link cut included (a few minutes)
    .venv/bin/python benchmarks/faults.py --fast     # without the 60 s link cut
    .venv/bin/python benchmarks/faults.py -- -k link # extra pytest arguments after --
    .venv/bin/python benchmarks/faults.py --smoke    # quick faults and every route of both listeners, in seconds

Exit status: pytest's. The table is markdown, ready for docs/RELIABILITY.md.
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

ROOT = Path(__file__).resolve().parents[1]
SMOKE_TESTS = ("tests/faults/test_recorder_damage.py::test_garbage_header",
               "tests/faults/test_bad_cluster_files.py::test_huge_document_refused_without_parsing",
               "tests/faults/test_listener_fuzz.py::test_each_route_of_the_router_answers_plain_requests_cleanly")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="skip the 60 s link cut")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        # one process: the ledger that counts the figures lives in the pytest process (no xdist workers)
        targets = list(SMOKE_TESTS) if args.smoke else ["tests/faults"]
        cmd = [sys.executable, "-m", "pytest", *targets, "-q", "-p", "no:cacheprovider", "-n", "0"]
        if args.fast:
            # The root conftest marks all of tests/faults slow (it is minutes of CPU): skip only the longest.
            cmd += ["--deselect", "tests/faults/test_link_cut.py::test_link_cut_60s"]
        cmd += args.pytest_args
        t0 = time.monotonic()
        env = {**os.environ, "SPARKCONSOLE_FAULT_FIGURES": str(out), "SPARKCONSOLE_FUZZ": "full"}   # every example
        r = subprocess.run(cmd, cwd=ROOT, env=env)
        took = time.monotonic() - t0
        if not out.exists():
            print("no figures written (did the suite run?)", file=sys.stderr)
            return r.returncode or 1
        f = json.loads(out.read_text())
    print()
    kind = "smoke (two faults, the listeners' routes)" if args.smoke else "fast" if args.fast else "full"
    print(f"Fault suite, {kind} run, {took:.0f} s:")
    print()
    print("| figure | value |")
    print("|---|---|")
    print(f"| faults tried | {f['faults_tried']} |")
    print(f"| faults survived | {f['faults_survived']} |")
    print(f"| data lost | {f['data_lost']} |")
    print(f"| bad inputs tried | {f['bad_inputs_tried']} |")
    print(f"| tracebacks shown | {f['tracebacks_shown']} |")
    print()
    if f.get("listeners"):
        print("| listener | requests sent | routes covered | 5xx | tracebacks | secrets found |")
        print("|---|---|---|---|---|---|")
        for name, fig in f["listeners"].items():
            print(f"| {name} | {fig['requests']} | {fig['routes covered']} of {fig['routes']} | {fig['5xx']} | "
                  f"{fig['tracebacks']} | {fig['secrets']} |")
        print()
    for what, outcome in f["faults"].items():
        print(f"- {outcome}: {what}")
    for w in f["lost_where"]:
        print(f"- lost: {w}")
    for w in f["tracebacks_where"]:
        print(f"- traceback: {w}")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
