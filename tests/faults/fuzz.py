"""How many examples a fuzz test runs: the suite runs a quarter of each full count (the fuzz was four of the
suite's ten slowest tests, minutes of CPU on 2 cores); benchmarks/faults.py sets SPARKCONSOLE_FUZZ=full and runs
every example for docs/RELIABILITY.md's figures."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FULL = os.environ.get("SPARKCONSOLE_FUZZ") == "full"


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples if FULL else max(25, examples // 4), deadline=None,
                    suppress_health_check=list(HealthCheck))
