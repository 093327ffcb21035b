"""Preflight's judgement of gpu_memory_utilization on a unified-memory node (GB10), against the node's budget.

vLLM claims gpu_memory_utilization × the GPU's total memory; on a GB10 that total is the host's unified memory
(MemTotal ~121.7 GiB, gb10-facts.md). The container's memory cap does not contain that claim: CUDA allocations are
not charged to the container's cgroup there. Public measurements on DGX Spark: a container reached 8 GB under a
4 GB `docker --memory` cap (graphistry/pygraphistry pull request 1671); 12 GiB of CUDA memory allocated inside a
cgroup v2 scope with MemoryMax=8G moved memory.current from 5.7 MB to 409 MB and nothing was killed, while a plain
malloc in the same scope was killed between 7 and 8 GiB (Blackwellboy/model-serving-minefield issue 57). This
project has no GB10 to test on: those measurements are the best knowledge, and they are what the findings cite.

So the claim is judged against the node (placement/budget.py): MemTotal, less the reserve (the console's headroom
floor and the vm.min_free_kbytes the kernel keeps), less what the other workloads on the node measurably hold (their
processes' GPU memory from NVML plus their cgroups' usage). Judged per node, the claims of every server the plan
puts there summed:

- the claims are over the budget: the node runs out of memory while the model loads, and a GB10 freezes. Refused.
- the claims plus vLLM's own CPU side (CPU_SIDE_GIB: Python, compile workers, host buffers — what the cap does
  hold) are over it, or a claim is above SEED_STABLE_FRACTION (seed 004: 0.78 ran stable for days, 0.82 hit OOM on
  its nodes, with an MTP drafter): a warning that says which.

A discrete-GPU node (unified false) is not judged here: its claim is on its own memory. Pure: facts come in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..placement.budget import GIB as GIB_B
from ..placement.budget import HOST_PROCESSES, NodeBudget

GIB = 1024 ** 3
GB10_MEMTOTAL_GIB = 121.7          # what a GB10 reports as MemTotal (gb10-facts.md)
CPU_SIDE_GIB = 5.0                 # vLLM's process beside its claim: seed 004 ran with 5.1 GiB beside 0.78's claim
SEED_STABLE_FRACTION = 0.78        # seed 004: stable at 0.78, OOM at 0.82 (an MTP drafter on the head node)
MIN_FREE_RESERVE_GIB = 1.5         # vm.min_free_kbytes=1572864 (seed 004)
GUARD_KEYS = ("swap", "overcommit", "min_free")     # nodes/guard.py keys

CAP_CONTAINS = ("the container's memory cap holds vLLM's CPU side (Python, compile workers, host buffers), not "
                "its GPU claim: CUDA memory is not charged to the container's cgroup on a GB10")
SRC_BUDGET = ("a GB10's GPU memory is the host's ~121.7 GiB MemTotal (leptonai/gpud#1170) and an OOM freezes the host "
              "(NVIDIA/open-gpu-kernel-modules#1358); graphistry/pygraphistry PR 1671: a container reached 8 GB under "
              "a 4 GB docker --memory cap; Blackwellboy/model-serving-minefield issue 57: 12 GiB of CUDA memory in a "
              "MemoryMax=8G scope moved memory.current 5.7 → 409 MB, no OOM kill; the published run 'Two-Node DGX "
              "Spark Cluster: Running DeepSeek V4 Flash': 0.78 ran stable, 0.82 hit OOM")


def size_gib(size: str | None) -> float | None:
    """A Docker size (100g, 512m, 1t, bytes) in GiB; None when absent or unreadable."""
    import re
    if not size:
        return None
    m = re.match(r"^([0-9.]+) ?([bkmgt]?)i?b?$", size.lower())   # docker's spellings too: 10gb, 64GiB
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
    return f"{max(math.floor(value * 100) / 100, 0.0):.2f}"


@dataclass(frozen=True)
class Claim:
    """What one server claims of the node's memory, as its command says it: a fraction of the GPU's total
    (`--gpu-memory-utilization`), or a size in GiB (`--gpu-memory-utilization-gb`, newer vLLM: an exact GiB
    target, which wins over a fraction)."""
    gib: float
    fraction: float | None      # None: given in GiB


GB_FLAG = "--gpu-memory-utilization-gb"


def claim_of(argv: Sequence[str], total_gib: float, *, default: float | None = None,
             fraction_flags: Sequence[str] = ("--gpu-memory-utilization",),
             gib_flags: Sequence[str] = (GB_FLAG,)) -> Claim | None:
    """The server's claim from its argv, in its runtime's flags; `default`: the fraction it takes when neither flag
    is given (None: no claim judged)."""
    from .argv import flag_value
    gb = flag_value(argv, *gib_flags) if gib_flags else None
    if gb is not None:
        try:
            gib = float(gb)
        except ValueError:
            gib = -1.0
        if gib > 0:
            return Claim(gib, None)
    raw = flag_value(argv, *fraction_flags) if fraction_flags else None
    try:
        frac = float(raw) if raw is not None else default
    except ValueError:
        frac = default
    return None if frac is None else Claim(frac * total_gib, frac)


def claim_words(claims: Sequence[Claim], total_gib: float, total_known: bool = True) -> str:
    """How a message says the claims: the fractions × the total (as before), or the GiB each asks for."""
    total = sum(c.gib for c in claims)
    many = f" for {len(claims)} servers" if len(claims) > 1 else ""
    if all(c.fraction is not None for c in claims):
        each = " + ".join(f"{c.fraction:g}" for c in claims)
        return (f"gpu_memory_utilization {each} × {total_gib:.1f} GiB{'' if total_known else ' (a GB10)'} = "
                f"{total:.1f} GiB{many}")
    each = " + ".join(f"{GB_FLAG} {c.gib:g}" if c.fraction is None else
                      f"gpu_memory_utilization {c.fraction:g} × {total_gib:.1f} GiB" for c in claims)
    return f"{each} = {total:.1f} GiB{many}"


def _g(b: float) -> str:
    return f"{b / GIB_B:.1f}"


def _budget_words(b: NodeBudget, total_gib: float) -> str:
    """How the budget is made: total − reserve − what is held, each workload named."""
    text = f"MemTotal {total_gib:.1f} − {_g(b.reserve_b)} reserve (headroom floor + vm.min_free_kbytes)"
    held = [w for w in b.held if (w.total_b or 0) > 0]
    if held:
        names = ", ".join(f"{'GPU processes in no container' if w.container == HOST_PROCESSES else w.container} "
                          f"{_g(w.total_b or 0)}" for w in held[:4]) + (" …" if len(held) > 4 else "")
        text += f" − {_g(b.held_b)} held by other workloads ({names})"
    if not b.measured:
        text += f"; {b.reason}" if b.reason else "; the node's memory was not read"
    elif b.unmeasured:
        w = b.unmeasured[0]
        text += f"; not all of {w.container}'s memory is measured ({w.reason})"
    return text


def judge(claims: Sequence[float | Claim], total_gib: float, budget: NodeBudget, cap_text: str | None,
          total_known: bool) -> tuple[str, str, str] | None:
    """(severity, message, fix) for the claims the plan puts on one node (Claims, or gpu_memory_utilization
    fractions), or None when they fit."""
    cs = [c if isinstance(c, Claim) else Claim(c * total_gib, c) for c in claims]
    claim_b = sum(c.gib for c in cs) * GIB_B
    free = budget.free_b if budget.free_b is not None else 0
    of = claim_words(cs, total_gib, total_known)
    where = f"the node's budget of {_g(free)} GiB ({_budget_words(budget, total_gib)})"
    cap = (f"; the container's {cap_text} cap would not stop it (it holds vLLM's CPU side, not CUDA memory)"
           if cap_text else "")
    best = (free - CPU_SIDE_GIB * GIB_B) / len(cs) / (total_gib * GIB_B)
    safe = min(best, SEED_STABLE_FRACTION)
    fix = (f"--set gpu_memory_utilization={_fraction(safe)}" if all(c.fraction is not None for c in cs) else
           f"{GB_FLAG} {max(math.floor(safe * total_gib), 0)}")
    if any((w.total_b or 0) > 0 for w in budget.held):
        fix += ", or stop what holds the memory"
    if claim_b > free:
        return ("refuse", f"{of}, over {where}: the node runs out of memory while the model loads and a GB10 "
                          f"freezes{cap}", fix)
    said = []
    if claim_b + CPU_SIDE_GIB * GIB_B > free:
        said.append(f"with vLLM's own CPU side (~{CPU_SIDE_GIB:g} GiB) it is {_g(claim_b + CPU_SIDE_GIB * GIB_B)} "
                    f"GiB, over {where}")
    high = [c for c in cs if c.gib > SEED_STABLE_FRACTION * total_gib + 1e-9]
    if high:
        said.append(f"above {SEED_STABLE_FRACTION} of the memory, where a published two-node run saw OOM on its "
                    "nodes (0.82 with an MTP drafter; 0.78 ran stable)")
    if said:
        room = "" if claim_b + CPU_SIDE_GIB * GIB_B > free else f"; the budget has room ({_g(free)} GiB)"
        return "warn", f"{of}: " + "; ".join(said) + room + cap, fix
    return None
