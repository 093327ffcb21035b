"""Helpers for timing comparisons on the test bed (the llama-benchy cross-check and its lockstep benchmark)."""

from __future__ import annotations

import os
import statistics


def interquartile_mean(values: list[float]) -> float:
    """Mean of the middle half: steady against the outliers and the two modes of a c2 level, unlike a median."""
    v = sorted(values)
    k = len(v) // 4
    return statistics.fmean(v[k:len(v) - k])


def split_cpus() -> tuple[set[int] | None, set[int] | None]:
    """(server CPUs, client CPUs): one each when there are two or more, else no pinning."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:2])
