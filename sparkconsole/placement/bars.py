"""A node's memory budget as the console's bar draws it: what placement publishes, in the order it is drawn.

    [ held by each workload | claimed, not yet held | held outside the workloads | free | reserve ]

Each workload's measured share (its processes' GPU memory and its cgroup) and, beside it, the rest of its claim
while it is still loading; memory held by nothing sparkconsole launched (MemTotal − MemAvailable − the
workloads' share: the OS, page cache it cannot drop, a process started by hand); what is free for a new workload
(placement/fit.py's room); and the reserve (headroom floor + vm.min_free_kbytes), drawn last because it is never
given. A node not read is an estimate (a GB10, nothing held), marked as such. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .fit import NodeRoom, Running, gib

if TYPE_CHECKING:
    from .budget import NodeBudget

HELD, CLAIM, OTHER, FREE, RESERVE = "held", "claim", "other", "free", "reserve"


@dataclass(frozen=True)
class Segment:
    kind: str                 # held | claim | other | free | reserve
    bytes: int
    label: str                # the workload (held, claim), else the kind in words


@dataclass(frozen=True)
class BudgetBar:
    node: str
    total_b: int | None
    segments: tuple[Segment, ...]
    free_b: int | None
    estimated: bool           # the node's memory was not read: a GB10 assumed
    note: str | None = None

    def words(self) -> str:
        parts = [f"{s.label} {gib(s.bytes)}" for s in self.segments if s.kind in (HELD, CLAIM) and s.bytes]
        tail = f"free {gib(self.free_b)}" + (" (estimate: node not read)" if self.estimated else "")
        return f"{self.node}: " + ", ".join([*parts, tail])


def node_bar(budget: NodeBudget, running: Sequence[Running]) -> BudgetBar:
    room = NodeRoom(budget, [r for r in running if r.node == budget.node])
    total = budget.total_b
    segs: list[Segment] = []
    held_sum = 0
    for r in sorted(room.running, key=lambda r: r.workload):
        held = r.measured_b or 0
        held_sum += held
        segs.append(Segment(HELD, held, r.workload))
        rest = r.counted_b - held
        if rest > 0:
            segs.append(Segment(CLAIM, rest, r.workload))
    free = room.free_b()
    if total is None:
        return BudgetBar(budget.node, None, tuple(segs), free, room.estimated, budget.reason)
    claimed = sum(s.bytes for s in segs)
    other = 0
    if budget.available_b is not None:
        other = max(0, total - budget.available_b - held_sum)
    free_shown = max(0, min(free or 0, total - budget.reserve_b - claimed - other))
    segs.append(Segment(OTHER, other, "outside the workloads"))
    segs.append(Segment(FREE, free_shown, "free"))
    segs.append(Segment(RESERVE, min(budget.reserve_b, max(0, total - claimed - other - free_shown)), "reserve"))
    return BudgetBar(budget.node, total, tuple(segs), free, room.estimated, budget.reason)


def bars(budgets: Sequence[NodeBudget], running: Sequence[Running]) -> list[BudgetBar]:
    return [node_bar(b, running) for b in budgets]


def cells(bar: BudgetBar, width: int) -> list[tuple[int, Segment]]:
    """Each segment's width in cells of a `width`-cell bar (largest remainders, so the cells add up exactly; a
    non-empty segment gets at least one cell while there is room)."""
    total = bar.total_b or sum(s.bytes for s in bar.segments) or 1
    exact = [s.bytes * width / total for s in bar.segments]
    counts = [max(int(x), 1 if s.bytes > 0 else 0) for x, s in zip(exact, bar.segments, strict=True)]
    by_remainder = sorted(range(len(exact)), key=lambda i: int(exact[i]) - exact[i])
    i = 0
    while sum(counts) < width and by_remainder:
        counts[by_remainder[i % len(by_remainder)]] += 1
        i += 1
    while sum(counts) > width and max(counts, default=0) > 0:
        counts[counts.index(max(counts))] -= 1
    return list(zip(counts, bar.segments, strict=True))
