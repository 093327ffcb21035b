"""A placement in words, as `sparkconsole recipe fit` prints it and the console's launch confirmation shows it:
each choice (where, why, what it takes, the room left after it), then each node (MemTotal, the reserve,
MemAvailable, what runs measured, what was placed, what is free)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .fit import gib

if TYPE_CHECKING:
    from .fit import Choice, NodeRoom, Placement


def choice_lines(c: Choice) -> list[str]:
    where = ", ".join(c.nodes)
    lines = [f"{c.ask.name} ({c.ask.recipe.key} × {c.ask.topology}) → {where}: {c.reason}"]
    for t in c.takes:
        lines.append(f"    {t.node}: {t.words()}")
        lines.append(f"    {t.node}: free after it {gib(c.free_after.get(t.node))}")
    if c.plan is not None:
        ports = sorted({p for ls in c.plan.listens.values() for _, p in ls})
        names = ", ".join(sorted({s.container for s in c.plan.services}))
        moved = [k for k in ("port", "router_port", "container_names") if k in c.options]
        lines.append(f"    serves at {c.plan.endpoint or '?'} as {c.plan.model or '?'}; ports {', '.join(map(str, ports))};"
                     f" containers {names}" + (" (moved beside what runs: " + ", ".join(moved) + ")" if moved else ""))
    return lines


def node_lines(room: NodeRoom, offline: bool = False) -> list[str]:
    b = room.budget
    avail = gib(b.available_b) if b.available_b is not None else "not read"
    head = (f"{room.node}: MemTotal {gib(b.total_b)}, reserve {gib(b.reserve_b)} (headroom floor + "
            f"min_free_kbytes), MemAvailable {avail}")
    if room.estimated and not offline:
        head += f" — ESTIMATE ONLY: {b.reason or 'the node was not read'}"
    lines = [head]
    for r in room.running:
        lines.append(f"    running {r.words()}")
    for t in room.placed:
        lines.append(f"    placed  {t.workload}: takes {gib(t.take_b)} ({t.basis})")
    free = room.free_b()
    tail = " (MemAvailable leaves less than the budget: memory held outside the workloads)" \
        if room.limited_by_available() else ""
    lines.append(f"    free {gib(free)}{tail}")
    return lines


def render_placement(p: Placement) -> str:
    mode = "pack" if p.pack else "spread"
    where = ("offline: GB10 nodes assumed, nothing running" if p.offline else "nodes read")
    lines = [f"fit: {len(p.choices)} workload(s) on {len(p.rooms)} node(s), {mode}, largest first ({where})"]
    for c in p.choices:
        lines += choice_lines(c)
    for room in p.rooms.values():
        lines += node_lines(room, p.offline)
    return "\n".join(lines)
