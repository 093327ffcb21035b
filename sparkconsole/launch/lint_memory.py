"""Preflight's judgement of gpu_memory_utilization on a unified-memory node (GB10), from the node's own budget.

vLLM claims gpu_memory_utilization × the GPU's total memory; on a GB10 that total is the host's unified memory
(MemTotal ~121.7 GiB, gb10-facts.md). The claim is made inside the container, under its memory cap
(sparkconsole.container.memory, 100g unless the recipe says otherwise), which turns an out-of-memory into a
container OOM-kill instead of a wedged host (seed 004). Judged per node:

- the claim alone is over the cap: the container is OOM-killed while the model loads. Refused.
- the claim leaves less than CPU_SIDE_GIB under the cap for vLLM's own process (Python, CUDA context, compile
  workers, a speculative drafter): seed 004 ran 0.78 (94.9 GiB, 5.1 GiB left under its 100 GiB cap) for days and
  saw 0.82 (99.8 GiB, 0.2 GiB left, MTP drafter) OOM. A warning while the node's OOM guards are in place (the
  OOM stays inside the container); refused where they are not (swap on, overcommit, too small a min_free_kbytes
  reserve: the same OOM can take the host down).
- with no cap, the claim against what the host itself needs: the console's headroom floor for the OS and page
  cache, plus the min_free_kbytes reserve the seed set (1.5 GiB). Past that an OOM wedges the host. Refused.

A discrete-GPU node (unified false) is not judged here: its claim is on its own memory. Pure: facts come in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

GIB = 1024 ** 3
GB10_MEMTOTAL_GIB = 121.7          # what a GB10 reports as MemTotal (gb10-facts.md)
CPU_SIDE_GIB = 5.0                 # what vLLM's process needs under the cap besides its claim (seed 004, above)
MIN_FREE_RESERVE_GIB = 1.5         # vm.min_free_kbytes=1572864 (seed 004)
GUARD_KEYS = ("swap", "overcommit", "min_free")     # nodes/guard.py keys

SRC_BUDGET = ("a GB10's GPU memory is the host's ~121.7 GiB MemTotal (leptonai/gpud#1170) and an OOM wedges the host "
              "(NVIDIA/open-gpu-kernel-modules#1358); the published run 'Two-Node DGX Spark Cluster: Running DeepSeek "
              "V4 Flash': Docker --memory=100G turns it into a container OOM-kill, 0.78 (5.1 GiB left under the cap) "
              "ran stable, 0.82 (0.2 GiB left) hit OOM")


def size_gib(size: str | None) -> float | None:
    """A Docker size (100g, 512m, 1t, bytes) in GiB; None when absent or unreadable."""
    import re
    if not size:
        return None
    m = re.match(r"^([0-9.]+)([bkmgt]?)$", size.lower())
    if not m:
        return None
    scale = {"": 1 / GIB, "b": 1 / GIB, "k": 1 / 1048576, "m": 1 / 1024, "g": 1.0, "t": 1024.0}[m.group(2)]
    return float(m.group(1)) * scale


def guards_in_place(results: Sequence[Any] | None) -> bool | None:
    """True when swap, overcommit and min_free_kbytes are all ok on the node; None when unknown."""
    if results is None:
        return None
    statuses = {getattr(g, "key", ""): getattr(g, "status", "unknown") for g in results}
    known = [statuses[k] for k in GUARD_KEYS if k in statuses]
    if any(s in ("bad", "warn") for s in known):
        return False
    return True if len(known) == len(GUARD_KEYS) and all(s == "ok" for s in known) else None


def _fraction(value: float) -> str:
    return f"{math.floor(value * 100) / 100:.2f}"


@dataclass(frozen=True)
class Claim:
    """What one server claims of the node's memory, as its command says it: a fraction of the GPU's total
    (`--gpu-memory-utilization`), or a size in GiB (`--gpu-memory-utilization-gb`, newer vLLM: an exact GiB
    target, which wins over a fraction)."""
    gib: float
    text: str                   # how the message says it
    fraction: float | None      # None: given in GiB

    def fix(self, safe_gib: float, total_gib: float) -> str:
        if self.fraction is None:
            return f"--gpu-memory-utilization-gb {math.floor(safe_gib)}"
        return f"--set gpu_memory_utilization={_fraction(safe_gib / total_gib)}"


GB_FLAG = "--gpu-memory-utilization-gb"


def claim_of(argv: Sequence[str], total_gib: float, total_known: bool = True, *,
             default: float | None = None) -> Claim | None:
    """The server's claim from its argv; `default`: the fraction vLLM takes when neither flag is given (None: no
    claim judged)."""
    from .argv import flag_value
    gb = flag_value(argv, GB_FLAG)
    if gb is not None:
        try:
            gib = float(gb)
        except ValueError:
            gib = -1.0
        if gib > 0:
            return Claim(gib, f"{GB_FLAG} {gib:g} = {gib:.1f} GiB", None)
    raw = flag_value(argv, "--gpu-memory-utilization")
    try:
        frac = float(raw) if raw is not None else default
    except ValueError:
        frac = default
    if frac is None:
        return None
    claim = frac * total_gib
    return Claim(claim, f"gpu_memory_utilization {frac:g} × {total_gib:.1f} GiB{'' if total_known else ' (a GB10)'} "
                        f"= {claim:.1f} GiB", frac)


def judge(claimed: float | Claim, total_gib: float, cap_gib: float | None, cap_text: str | None,
          guards: bool | None, headroom_floor_gib: float, total_known: bool) -> tuple[str, str, str] | None:
    """(severity, message, fix) for one node's claim (a Claim, or a gpu_memory_utilization fraction), or None
    when it fits."""
    c = claimed if isinstance(claimed, Claim) else \
        Claim(claimed * total_gib, f"gpu_memory_utilization {claimed:g} × {total_gib:.1f} GiB"
                                   f"{'' if total_known else ' (a GB10)'} = {claimed * total_gib:.1f} GiB", claimed)
    claim, of = c.gib, c.text
    if cap_gib is not None:
        fix = (f"{c.fix(cap_gib - CPU_SIDE_GIB, total_gib)} (or raise sparkconsole.container.memory, below the "
               "host's total)")
        if claim > cap_gib:
            return ("refuse", f"{of}, over the container's {cap_text} cap: the container is OOM-killed while the "
                              "model loads", fix)
        left = cap_gib - claim
        if left < CPU_SIDE_GIB:
            said = {True: "the OOM guards are in place, so an OOM kills the container, not the host",
                    False: "the node's OOM guards are not in place, so that OOM can take the host down",
                    None: "the node's OOM guards were not read"}[guards]
            return ("refuse" if guards is False else "warn",
                    f"{of} leaves {left:.1f} GiB of the container's {cap_text} cap for vLLM's own process "
                    f"(a published run needed more than 0.2 GiB, and ran with 5.1); {said}", fix)
        return None
    need = headroom_floor_gib + MIN_FREE_RESERVE_GIB
    if claim > total_gib - need:
        return ("refuse", f"{of} leaves {total_gib - claim:.1f} GiB for the OS and page cache with no container cap "
                          f"(needed: the {headroom_floor_gib:g} GiB headroom floor + the {MIN_FREE_RESERVE_GIB} GiB "
                          "min_free_kbytes reserve): an OOM here wedges the host",
                f"{c.fix(total_gib - need, total_gib)}, and set sparkconsole.container.memory (e.g. 100g)")
    return None
