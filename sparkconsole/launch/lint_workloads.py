"""Preflight's word on a launch beside other workloads: the node's budget against the sum of what runs (each
workload's measured use, or its claim while it loads) and this launch's claim (placement/fit.py decides; this
module says it as findings, for `recipe lint` and the console's preflight).

- refuse `memory_budget`: the launch does not fit any node's budget beside what runs (the placement's one line);
- warn `memory_budget`: a node whose memory could not be read (the estimate alone, marked as such), a workload
  whose memory is not measured (its claim counted instead), a launch with no estimate (placed by room alone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lint import Finding

if TYPE_CHECKING:
    from ..errors import UserError
    from ..placement.fit import Placement

SRC_BUDGET = ("gb10-facts.md: unified memory, an OOM freezes the host; a container's cap does not hold its GPU "
              "memory, so the node's budget counts every workload's claim and measured use")


def refusal_finding(err: UserError) -> Finding:
    return Finding("memory_budget", "refuse", err.problem, SRC_BUDGET, err.fix)


def budget_findings(placement: Placement) -> list[Finding]:
    out = []
    for room in placement.rooms.values():
        if not any(t for c in placement.choices for t in c.takes if t.node == room.node):
            continue
        if room.estimated:
            out.append(Finding("memory_budget", "warn", f"memory not read ({room.budget.reason}): the estimate only, "
                                                        "a GB10 assumed", SRC_BUDGET, None, room.node))
        for r in room.running:
            if r.measured_b is None:
                out.append(Finding("memory_budget", "warn", f"{r.workload}'s memory is not measured ({r.why}): its "
                                                            "claim is counted", SRC_BUDGET, None, room.node))
    for c in placement.choices:
        for t in c.takes:
            if t.take_b is None:
                out.append(Finding("memory_budget", "warn", f"{c.ask.name}: no memory estimate (weights unknown): "
                                                            "placed by the room left alone", SRC_BUDGET,
                                   "add the model's size to the recipe's metadata", t.node))
    return out
