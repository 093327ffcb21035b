"""Preflight's word on a launch beside other workloads: the node's budget against the sum of what runs (each
workload's measured use, or its claim while it loads) and this launch's claim (placement/fit.py decides; this
module says it, and lint.py makes it findings).

- refuse `memory_budget`: the launch does not fit any node's budget beside what runs (the placement's one line);
- warn `memory_budget`: a node whose memory could not be read (the estimate alone, marked as such), a workload
  whose memory is not measured (its claim counted instead), a launch with no estimate (placed by room alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import UserError

if TYPE_CHECKING:
    from ..placement.fit import Placement

RULE = "memory_budget"
SRC_BUDGET = ("a GB10's memory is unified and an OOM freezes the host (NVIDIA/open-gpu-kernel-modules#1358); a "
              "container's cap does not hold its GPU memory (graphistry/pygraphistry PR 1671), so the node's budget "
              "counts every workload's claim and measured use")


@dataclass(frozen=True)
class BudgetNote:
    severity: str                 # refuse | warn
    message: str
    fix: str | None = None
    node: str | None = None
    rule: str = RULE


def budget_notes(placed: Placement | UserError | None) -> list[BudgetNote]:
    """What the placement of this launch says of the nodes' budgets (nothing when it was not placed: offline)."""
    if placed is None:
        return []
    if isinstance(placed, UserError):
        return [BudgetNote("refuse", placed.problem, placed.fix)]
    out = []
    for room in placed.rooms.values():
        if not any(t.node == room.node for c in placed.choices for t in c.takes):
            continue
        if room.estimated:
            out.append(BudgetNote("warn", f"memory not read ({room.budget.reason}): the estimate only, a GB10 "
                                          "assumed", None, room.node))
        for r in room.running:
            if r.measured_b is None:
                out.append(BudgetNote("warn", f"{r.workload}'s memory is not measured ({r.why}): its claim is "
                                              "counted", None, room.node))
    for c in placed.choices:
        for t in c.takes:
            if t.take_b is None:
                out.append(BudgetNote("warn", f"{c.ask.name}: no memory estimate (weights unknown): placed by the "
                                              "room left alone", "add the model's size to the recipe's metadata",
                                      t.node))
    return out
