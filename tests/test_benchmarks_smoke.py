"""Every benchmark script still runs: each `benchmarks/*.py` with `--smoke`, a run of a few seconds that prints its
figures (README, "Docs"). The figures are printed here and never asserted; a script that no longer
runs, or that runs for minutes, fails the suite, so the figures the docs quote stay reproducible. A new script is
covered by being there. A script whose full run needs the heavy test bed (vLLM, routers) or a GPU exercises in its
smoke run what it can without them and says what it skipped. Modules without a `__main__` block (helpers of another
script) are imported the same way."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
# Smoke runs that start the slow parts of the suite (tmux, OpenSSH nodes, a browser, a simulated cluster, pytest
# itself): seconds of CPU each, so in the slow run only (`-m "not slow"` leaves them out).
SLOW = {
    "collector": "OpenSSH nodes, a collector and a viewer process",
    "console": "the console in tmux, twice, and in process",
    "demo_matrix": "bench matrix on a simulated cluster",
    "demo_start": "the demo in tmux and headless",
    "faults": "pytest on two fault tests",
    "tab_open": "OpenSSH nodes, chromium and the web console",
    "telemetry": "OpenSSH nodes and the agent's processes",
}
TIMEOUT_S = 120          # a smoke run is seconds; this only catches a script that ignores --smoke


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@pytest.mark.parametrize("script", [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else [])
                                    for p in BENCHMARKS])
def test_the_benchmark_runs_in_its_smoke_mode(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    cpu = _children_cpu()
    r = subprocess.run([sys.executable, str(script), "--smoke"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S * (3 if script.stem in SLOW else 1))
    print(f"{script.name} --smoke: exit {r.returncode}, {_children_cpu() - cpu:.1f} CPU s\n{r.stdout[-6000:]}")
    assert r.returncode == 0, f"{script.name} --smoke failed:\n{r.stderr[-4000:]}"


def test_every_slow_entry_names_a_script() -> None:
    assert set(SLOW) <= {p.stem for p in BENCHMARKS}
