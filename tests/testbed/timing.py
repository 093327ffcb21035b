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


Rounds = dict[str, dict[str, dict[str, list[list[float]]]]]   # concurrency -> tool -> key -> rounds of values


def compare_rounds(data: Rounds) -> dict[tuple[int, str], tuple[float, float, float]]:
    """(concurrency, key) -> (ours, llama-benchy, ratio) from a lockstep run (tests/testbed/lockstep.py).

    The ratio is the interquartile mean over rounds of ours/theirs (each the mean of that round's two batches):
    a round lasts a second or two, so both tools' batches in it met the same machine, and a stretch where the
    VM's speed shifted by a third (seen: c1 decode 210 -> 125 t/s for half a run) moves those rounds' ratios
    little, where it moved a ratio of pooled means by 6-9 %. The middle half of the rounds, not their median:
    as steady against odd rounds, and less noisy (c1 TTFT, six runs: 0.4-1.6 points closer to 1 in each).
    ours and theirs are interquartile means of all values, for the record."""
    out = {}
    for c, per in data.items():
        for key, ours_rounds in per["ours"].items():
            if key == "prompt_tokens":           # what was sent, not a figure
                continue
            theirs_rounds = per["benchy"][key]
            ratios = [statistics.fmean(a) / statistics.fmean(b) for a, b in zip(ours_rounds, theirs_rounds, strict=False) if a and b]
            if not ratios:
                continue
            flat = {who: [v for r in per[who][key] for v in r] for who in ("ours", "benchy")}
            out[(int(c), key)] = (interquartile_mean(flat["ours"]), interquartile_mean(flat["benchy"]),
                                  interquartile_mean(ratios))
    return out


def merge_rounds(a: Rounds, b: Rounds) -> Rounds:
    """Two lockstep runs as one: every round of both, for the same concurrencies."""
    return {c: {who: {k: a[c][who][k] + b[c][who][k] for k in a[c][who]} for who in a[c]} for c in a}
