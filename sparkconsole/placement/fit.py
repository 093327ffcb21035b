"""Where each of a set of workloads goes, against each node's unified memory: `sparkconsole recipe fit`, and the
launch of a workload beside what runs (launch/beside.py), the preflight of several workloads (launch/lint_workloads.py)
and the console's budget bars (placement/bars.py) all read this one placement.

What a workload takes on a node (`Take`): its claim (vLLM takes gpu_memory_utilization × MemTotal at start whatever
it needs) or, where its estimated need is larger or it claims nothing, that need (placement/estimate.py). What a
running workload counts for (`Running`): the larger of what it measurably holds now (its processes' GPU memory and
its container's cgroup, nodes/workload_memory.py) and what it claimed at launch (its `sparkconsole.claim` label): a
server still loading holds less than it is about to take. A node's room (`NodeRoom`): MemTotal, less the reserve
(the console's headroom floor and vm.min_free_kbytes), less what runs and what was placed before; with the node
read, never more than MemAvailable less the reserve and the claims not yet taken, since something beside the
workloads (the OS, a process started by hand) may hold memory too. On a GB10 a container's cap does not hold its
GPU memory, so the budget is always the node's, never the cap.

Spread (the default) puts each workload on the node with the most room, so that a load's peak and a leak have
the most margin; pack (`--pack`) on the fullest node it still fits, keeping whole nodes free for a large model
later. Workloads are placed largest first (what is hardest to place goes where the room still is), each choice
with its reason, and a set that does not fit is refused in one line naming the workload and by how much.

Pure: budgets, what runs and the estimator come in (offline: a GB10's budget per node, nothing running).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import ClusterConfig
from ..errors import UserError
from .slots import Taken, check_names, hold, slots

if TYPE_CHECKING:
    from ..launch.steps import Plan
    from ..recipes import Recipe
    from .budget import NodeBudget
    from .estimate import MemoryEstimate

GIB = 1024 ** 3
TIE_B = GIB                    # rooms closer than this are equal: the cluster file's order decides
Estimator = Callable[["Recipe", "Plan", Mapping[str, int]], Sequence["MemoryEstimate"]]


def gib(b: int | float | None) -> str:
    return "?" if b is None else f"{b / GIB:.1f} GiB"


@dataclass(frozen=True)
class Ask:
    """One workload to place: a recipe in a topology, its plan overrides and its name."""
    name: str
    recipe: Recipe
    topology: str
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def pinned(self) -> tuple[str, ...]:
        """Nodes named with --node: placed there, not chosen."""
        return tuple(self.overrides.get("nodes") or ())


@dataclass(frozen=True)
class Take:
    """What one workload's server takes on one node. `cap_b`: a CPU build's container cap, which holds all of its
    memory (no GPU memory beside it), so it bounds the take; on a GPU node the cap never does."""
    workload: str
    node: str
    estimate: MemoryEstimate | None
    cap_b: int | None = None

    @property
    def take_b(self) -> int | None:
        e = self.estimate
        known = [v for v in ((e.claim_b, e.need_b) if e is not None else ()) if v is not None]
        if self.cap_b is not None:
            return min([*known, self.cap_b]) if known else self.cap_b
        return max(known) if known else None

    @property
    def basis(self) -> str:
        e = self.estimate
        if self.take_b is None:
            return "unknown"
        if self.cap_b is not None and self.take_b == self.cap_b:
            return "container cap: a CPU build holds nothing beside it"
        if e is None:
            return "unknown"
        if e.claim_b is not None and self.take_b == e.claim_b:
            return "claim"
        return "need" if e.claim_b is None else "need (above its claim)"

    def words(self) -> str:
        e = self.estimate
        if e is None:
            return f"{self.workload}: no estimate; takes {gib(self.take_b)} ({self.basis})"
        parts = [f"weights {gib(e.weights_b)}", f"KV {gib(e.kv_b)}", f"overhead {gib(e.overhead_b)}"]
        need = f"need {gib(e.need_b)} ({' + '.join(parts)})"
        claim = f"claim {gib(e.claim_b)}" if e.claim_b is not None else "no claim"
        return f"{self.workload}: {need}; {claim}; takes {gib(self.take_b)} (its {self.basis}; source {e.source})"


@dataclass(frozen=True)
class Running:
    """A workload running on a node, as the node's budget counts it."""
    workload: str
    node: str
    containers: tuple[str, ...]
    measured_b: int | None          # Σ what its containers measurably hold there (None: not measured)
    claim_b: int | None             # what it claimed at launch (its label), None: not said
    why: str | None = None          # why the measurement is partial or missing

    @property
    def counted_b(self) -> int:
        return max(self.measured_b or 0, self.claim_b or 0)

    @property
    def pending_b(self) -> int:
        """Claimed but not yet held (a server still loading): MemAvailable does not show it gone yet."""
        if self.claim_b is None or self.measured_b is None:
            return 0
        return max(0, self.claim_b - self.measured_b)

    def words(self) -> str:
        held = gib(self.measured_b) if self.measured_b is not None else "not measured"
        claim = gib(self.claim_b) if self.claim_b is not None else "?"
        why = f" ({self.why})" if self.why and self.measured_b is None else ""
        return f"{self.workload} ({', '.join(self.containers)}): holds {held}{why}, claimed {claim}, " \
               f"counts {gib(self.counted_b)}"


@dataclass
class NodeRoom:
    """One node's budget with what runs there and what this placement put there."""
    budget: NodeBudget
    running: list[Running] = field(default_factory=list)
    placed: list[Take] = field(default_factory=list)

    @property
    def node(self) -> str:
        return self.budget.node

    @property
    def estimated(self) -> bool:
        """The node's memory was not read: its budget is an estimate (a GB10's), marked as such."""
        return not self.budget.measured

    @property
    def total_b(self) -> int | None:
        return self.budget.total_b

    def committed_b(self) -> int:
        return sum(r.counted_b for r in self.running) + sum(t.take_b or 0 for t in self.placed)

    def free_b(self) -> int | None:
        """The budget left: total − reserve − what runs (its claim or its use) − what was placed."""
        if self.total_b is None:
            return None
        budget_left = self.total_b - self.budget.reserve_b - self.committed_b()
        avail = self.budget.available_b
        if avail is None:
            return budget_left
        there = avail - self.budget.reserve_b - sum(r.pending_b for r in self.running) \
            - sum(t.take_b or 0 for t in self.placed)
        return min(budget_left, there)

    def limited_by_available(self) -> bool:
        """MemAvailable, not the budget, is what leaves the least room (memory held outside any workload)."""
        avail = self.budget.available_b
        if avail is None or self.total_b is None:
            return False
        budget_left = self.total_b - self.budget.reserve_b - self.committed_b()
        return self.free_b() != budget_left


@dataclass(frozen=True)
class Choice:
    """Where one workload went, why, and the room left on each of its nodes after it; `options`: the plan options
    that launch it there (its nodes, and the port and container names it takes beside the others: slots.py)."""
    ask: Ask
    nodes: tuple[str, ...]
    takes: tuple[Take, ...]
    reason: str
    free_after: Mapping[str, int | None]
    options: Mapping[str, Any] = field(default_factory=dict)
    plan: Plan | None = None

    @property
    def claims(self) -> dict[str, int]:
        """node → the claim its server carries as a label (the budget counts it until the server holds it)."""
        return {t.node: t.take_b for t in self.takes if t.take_b is not None}


@dataclass
class Placement:
    rooms: dict[str, NodeRoom]
    choices: list[Choice] = field(default_factory=list)
    pack: bool = False
    offline: bool = False

    def choice(self, name: str) -> Choice:
        return next(c for c in self.choices if c.ask.name == name)

    def render(self) -> str:
        from .render import render_placement
        return render_placement(self)


def running_on(groups: Sequence[Any], memory: Mapping[str, Mapping[str, Any]]) -> list[Running]:
    """What runs on each node (nodes/launches.py groups) with what it measurably holds there: `memory` is
    node → container → WorkloadMemory (nodes/workload_memory.py), empty for a node not read."""
    out = []
    for g in groups:
        for node in g.nodes:
            members = [m for m in g.members if m.node == node and m.running]
            if not members:
                continue
            held = memory.get(node, {})
            figures = [held.get(m.container) for m in members]
            known = [w.total_b for w in figures if w is not None and w.total_b is not None]
            why = next((w.reason for w in figures if w is not None and w.reason), None)
            if not held:
                why = "the node's memory was not read"
            claims = [m.claim_b for m in members if m.claim_b is not None]
            out.append(Running(g.name, node, tuple(m.container for m in members), sum(known) if known else None,
                               sum(claims) if claims else None, why))
    return out


def _needed(ask: Ask, cluster: ClusterConfig) -> int:
    from ..launch.plan import cluster_split
    if ask.pinned:
        return len(ask.pinned)
    if ask.topology == "solo":
        return 1
    if ask.topology in ("2x-solo", "disagg"):
        return 2
    params = ask.recipe.params(ask.topology, ask.overrides)
    return cluster_split(params, None)[2]


class Placer:
    """Places asks one by one on `rooms` (see the module's docstring)."""

    def __init__(self, cluster: ClusterConfig, rooms: dict[str, NodeRoom], estimator: Estimator, *,
                 pack: bool = False, taken: dict[str, Taken] | None = None) -> None:
        self.cluster, self.rooms, self.estimator, self.pack = cluster, rooms, estimator, pack
        self.taken = taken if taken is not None else {}
        self.order = [n.name for n in cluster.nodes]
        self._takes: dict[tuple[str, tuple[str, ...]], tuple[Take, ...]] = {}

    def takes(self, ask: Ask, nodes: Sequence[str]) -> tuple[Take, ...]:
        """The ask's servers planned on `nodes` (head first), each one's estimate there."""
        key = (ask.name, tuple(nodes))
        if key not in self._takes:
            from ..launch.plan import make_plan
            plan = make_plan(ask.recipe, ask.topology, self.cluster, {**ask.overrides, "nodes": list(nodes)})
            totals = {n: self.rooms[n].total_b or 0 for n in plan.nodes}
            estimates = list(self.estimator(ask.recipe, plan, {k: v for k, v in totals.items() if v}))
            cap = _cpu_cap(ask.recipe, plan)
            takes = []
            for n in plan.nodes:
                mine = [e for e in estimates if e.node == n]
                takes.append(Take(ask.name, n, _sum(mine), cap))
            self._takes[key] = tuple(takes)
        return self._takes[key]

    def size(self, ask: Ask) -> int:
        """How much the ask takes on one node (its largest server), for the largest-first order."""
        first = self.order[: _needed(ask, self.cluster)] if not ask.pinned else list(ask.pinned)
        try:
            return max((t.take_b or 0 for t in self.takes(ask, first)), default=0)
        except UserError:
            return 0

    def place(self, ask: Ask) -> Choice:
        need = _needed(ask, self.cluster)
        if ask.pinned:
            nodes = list(ask.pinned)
            reason = f"on {', '.join(nodes)} as asked (--node)"
        else:
            nodes, reason = self._choose(ask, need)
        takes = self.takes(ask, nodes)
        for t in takes:
            # no estimate (weights unknown, no claim): placed by the room alone, which preflight says (a warning)
            room = self.rooms[t.node].free_b()
            if room is not None and t.take_b is not None and t.take_b > room:
                raise self._refusal(ask, t, room)
        from ..launch.plan import make_plan
        asked = {**ask.overrides, "nodes": list(nodes), "workload": ask.name}
        options = {"nodes": list(nodes), "workload": ask.name, **slots(ask.recipe, ask.topology, self.cluster, asked,
                                                                       self.taken)}
        plan = make_plan(ask.recipe, ask.topology, self.cluster, {**ask.overrides, **options})
        hold(self.taken, plan)
        for t in takes:
            self.rooms[t.node].placed.append(t)
        after = {t.node: self.rooms[t.node].free_b() for t in takes}
        return Choice(ask, tuple(nodes), takes, reason, after, options, plan)

    def _choose(self, ask: Ask, need: int) -> tuple[list[str], str]:
        """The `need` nodes by the rule, head first for a topology whose first node carries the router."""
        rooms = []
        for n in self.order:
            t = (self.takes(ask, [n]) if need == 1 else self._probe(ask, n))[0]
            room = self.rooms[n].free_b()
            rooms.append((n, room, t.take_b))
        fits = [(n, r, tk) for n, r, tk in rooms if r is None or tk is None or tk <= r]
        if len(fits) < need:
            best = max(rooms, key=lambda x: (x[1] if x[1] is not None else -1))
            t = self._probe(ask, best[0])[0]
            raise self._refusal(ask, t, best[1] or 0, nodes_short=need - len(fits) if len(fits) else None)

        def room_of(x: tuple[str, int | None, int | None]) -> int:
            return x[1] if x[1] is not None else 0
        # Rooms within TIE_B of each other are one room (two agents read MemAvailable a moment apart): among them
        # the first in the cluster file goes first, so a placement on equal nodes is the same every time.
        left = list(fits)
        chosen: list[tuple[str, int | None, int | None]] = []
        while len(chosen) < need:
            edge = (min if self.pack else max)(room_of(x) for x in left)
            pick = next(x for x in left if abs(room_of(x) - edge) <= TIE_B)
            chosen.append(pick)
            left.remove(pick)
        others = sorted(left, key=lambda x: -room_of(x))
        # head first, as the cluster file orders them: a router, a prefill side, rank 0 go where they always went
        names = sorted((n for n, _, _ in chosen), key=self.order.index)
        if self.pack:
            kept = ", ".join(f"{n} ({gib(r)} free)" for n, r, _ in others[:2])
            reason = ("pack: " + ", ".join(f"{n} is the fullest node it fits ({gib(r)} free)" for n, r, _ in chosen)
                      + (f"; {kept} kept for what comes next" if kept else ""))
        else:
            nxt = ", ".join(f"{n} {gib(r)}" for n, r, _ in others[:2])
            reason = ("spread: " + ", ".join(f"{n} has the most room ({gib(r)} free)" for n, r, _ in chosen)
                      + (f"; next: {nxt}" if nxt else ""))
        return names, reason

    def _probe(self, ask: Ask, node: str) -> tuple[Take, ...]:
        """A multi-node ask's take on `node`, taken from a plan with `node` first (each rank's share is alike)."""
        need = _needed(ask, self.cluster)
        rest = [n for n in self.order if n != node][: need - 1]
        return self.takes(ask, [node, *rest])

    def _refusal(self, ask: Ask, take: Take, room: int, nodes_short: int | None = None) -> UserError:
        where = f"{take.node} has the most room" if nodes_short is None else \
            f"{nodes_short} node(s) short for its {ask.topology}; {take.node} has the most room"
        short = (take.take_b or 0) - room
        return UserError(f"{ask.name} ({ask.recipe.key}) does not fit: it takes {gib(take.take_b)} per node "
                         f"({take.basis}); {where}, {gib(room)} free — {gib(short)} short",
                         field="recipe", fix="stop a workload, lower gpu_memory_utilization or max_model_len, "
                                             "or place it with --pack / --node elsewhere")


def _cpu_cap(recipe: Recipe, plan: Plan) -> int | None:
    """A CPU build's container cap in bytes (None on a GPU build, or with no cap)."""
    if not plan.cpu_build:
        return None
    from ..launch.lint_memory import size_gib
    cap = size_gib(recipe.container_settings.memory)
    return int(cap * GIB) if cap is not None else None


def _sum(estimates: Sequence[MemoryEstimate]) -> MemoryEstimate | None:
    """One node's servers of a plan as one estimate (a node runs one server of a plan; kept general)."""
    if not estimates:
        return None
    if len(estimates) == 1:
        return estimates[0]
    from dataclasses import replace

    def add(vals: list[int | None]) -> int | None:
        return None if any(v is None for v in vals) else sum(v or 0 for v in vals)
    first = estimates[0]
    return replace(first, weights_b=add([e.weights_b for e in estimates]), kv_b=add([e.kv_b for e in estimates]),
                   overhead_b=sum(e.overhead_b for e in estimates), claim_b=add([e.claim_b for e in estimates]))


def default_estimator() -> Estimator:
    from .estimate import estimate_plan
    return estimate_plan


def fit(asks: Sequence[Ask], cluster: ClusterConfig, budgets: Mapping[str, NodeBudget],
        running: Sequence[Running] = (), *, pack: bool = False, estimator: Estimator | None = None,
        offline: bool = False, taken: Mapping[str, Taken] | None = None) -> Placement:
    """Place `asks` on the cluster's nodes, largest first; raises UserError (one line) for the first that does not
    fit, for a workload name given twice or running already, and for a port the operator gave that is taken
    (slots.py). `taken`: what the nodes' workloads hold (slots.taken_on), none offline."""
    if not asks:
        raise UserError("no recipes to fit", field="recipe", fix="name one or more: sparkconsole recipe fit "
                                                                 "gpt-oss-120b llama-3.1-8b")
    check_names([a.name for a in asks], {r.workload for r in running})
    rooms = {n.name: NodeRoom(budgets[n.name]) for n in cluster.nodes}
    for r in running:
        if r.node in rooms:
            rooms[r.node].running.append(r)
    held = {k: Taken(dict(v.ports), dict(v.names)) for k, v in (taken or {}).items()}
    placer = Placer(cluster, rooms, estimator or default_estimator(), pack=pack, taken=held)
    placement = Placement(rooms, pack=pack, offline=offline)
    order = sorted(range(len(asks)), key=lambda i: (-placer.size(asks[i]), i))
    for i in order:
        placement.choices.append(placer.place(asks[i]))
    return placement
