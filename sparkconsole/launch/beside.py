"""A launch beside what runs: where it goes and what it takes there (placement/), and the two waits before it
starts on a node — until the node's previous launch has finished loading (memory peaks during a load: two loads
at once can pass the budget that each alone keeps), and, after a stop, until the node's memory has come back
(placement/recovery.py), refused with the measured figures when it does not.

Read from a ClusterMonitor over every node (one agent tick each: MemTotal, MemAvailable, vm.min_free_kbytes, each
container's memory and labels); `recipe launch`, `recipe fit` and the console use it alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx

from ..config import ClusterConfig
from ..errors import UserError
from ..nodes.launches import VLLM_ROLES, LaunchGroup, launch_groups
from ..placement.fit import Ask, Estimator, Placement, Running, fit, running_on
from ..placement.recovery import StopLog, StopRecord, judge
from ..placement.slots import Taken, taken_on

FACTS_TIMEOUT_S = 15.0
LOADED_TIMEOUT_S = 1800.0        # a 120B model loads in minutes (runner.READY_TIMEOUT_S)
RECOVER_TIMEOUT_S = 120.0
POLL_S = 1.0


class Readings:
    """What the nodes say now, for placement: each one's budget, what its workloads hold, what runs."""

    def __init__(self, cluster: ClusterConfig, monitors: Mapping[str, Any]) -> None:
        from ..nodes.workload_memory import workload_memory
        from ..placement.budget import node_budget, offline_budget
        floor = cluster.thresholds.headroom_floor_gib
        self.cluster = cluster
        self.monitors = dict(monitors)
        self.groups: list[LaunchGroup] = launch_groups(self.monitors.values())
        self.budgets = {}
        self.memory: dict[str, Mapping[str, Any]] = {}
        for n in cluster.nodes:
            nm = self.monitors.get(n.name)
            tick = getattr(nm, "last", None)
            if tick is None:
                why = getattr(nm, "last_error", None) or "no reading from the node"
                self.budgets[n.name] = offline_budget(n.name, headroom_floor_gib=floor,
                                                      reason=f"not read ({why}): a GB10 assumed, nothing held")
                continue
            self.budgets[n.name] = node_budget(n.name, tick, floor)
            self.memory[n.name] = workload_memory(tick)
        self.running: list[Running] = running_on(self.groups, self.memory)
        self.taken: dict[str, Taken] = taken_on(self.monitors.values(), self.groups)

    def available_b(self, node: str) -> int | None:
        nm = self.monitors.get(node)
        mem = getattr(getattr(nm, "last", None), "mem", None)
        return mem.available_kb * 1024 if mem is not None and mem.available_kb is not None else None


def place(readings: Readings, asks: Sequence[Ask], *, pack: bool = False,
          estimator: Estimator | None = None) -> Placement:
    return fit(asks, readings.cluster, readings.budgets, readings.running, pack=pack, estimator=estimator,
               taken=readings.taken)


def launch_options(placement: Placement, name: str) -> dict[str, Any]:
    """The plan options that launch `name` where the placement put it, its claims carried as labels."""
    c = placement.choice(name)
    return {**c.options, "claims": c.claims}


async def wait_loaded(groups: Iterable[LaunchGroup], nodes: Sequence[str], say: Callable[[str], None], *,
                      timeout: float = LOADED_TIMEOUT_S, poll: float = POLL_S, skip: str | None = None) -> None:
    """Until every vLLM server of the other workloads on `nodes` answers /health: still loading, it is still
    reaching for its memory. A server that is not running is not waited for (its launch failed or stopped)."""
    urls = {(m.url, g.name, m.node) for g in groups if g.name != skip for m in g.members
            if m.node in nodes and m.role in VLLM_ROLES and m.url and m.running}
    if not urls:
        return
    t0 = time.monotonic()
    told: set[str] = set()
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        left = set(urls)
        while left:
            for u in list(left):
                try:
                    ok = (await client.get(f"{u[0]}/health")).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    left.discard(u)
                elif u[1] not in told:
                    told.add(u[1])
                    say(f"waiting: {u[1]} on {u[2]} is still loading (memory peaks during a load)")
            if not left:
                return
            if time.monotonic() - t0 > timeout:
                u = sorted(left)[0]
                raise UserError(f"{u[1]} on {u[2]} has not finished loading after {timeout:g} s ({u[0]}/health "
                                "does not answer 200)", field="recipe",
                                fix=f"check it: sparkconsole recipe status {u[1]}; stop it or wait, then launch")
            await asyncio.sleep(poll)


async def wait_recovered(monitors: Mapping[str, Any], nodes: Sequence[str], log: StopLog,
                         say: Callable[[str], None], *, timeout: float = RECOVER_TIMEOUT_S,
                         poll: float = POLL_S) -> None:
    """After a stop on one of `nodes`: until its MemAvailable is back (recovery.judge), else refused in one line
    with the figures."""
    pending = {n: log.records(n) for n in nodes}
    pending = {n: r for n, r in pending.items() if r}
    if not pending:
        return
    t0 = time.monotonic()
    said: set[str] = set()
    while pending:
        for n in list(pending):
            mem = getattr(getattr(monitors.get(n), "last", None), "mem", None)
            avail = mem.available_kb * 1024 if mem is not None and mem.available_kb is not None else None
            back, words = judge(pending[n], avail)
            if back:
                say(f"{n}: memory back after the stop: {words}")
                del pending[n]
            elif n not in said:
                said.add(n)
                say(f"{n}: waiting for memory to come back after the stop: {words}")
        if not pending:
            return
        if time.monotonic() - t0 > timeout:
            n = sorted(pending)[0]
            mem = getattr(getattr(monitors.get(n), "last", None), "mem", None)
            avail = mem.available_kb * 1024 if mem is not None and mem.available_kb is not None else None
            _, words = judge(pending[n], avail)
            raise UserError(f"{n}: memory has not come back after {timeout:g} s: {words}", field="recipe",
                            fix="find what still holds it (sparkconsole status; docker ps -a; nvidia-smi), or "
                                "reboot the node before the next launch")
        await asyncio.sleep(poll)


def record_stop(log: StopLog, readings: Readings, group: LaunchGroup) -> list[StopRecord]:
    """Before a workload stops: what each of its nodes should get back (see placement/recovery.py)."""
    out = []
    for node in group.nodes:
        avail = readings.available_b(node)
        mine = next((r for r in readings.running if r.workload == group.name and r.node == node), None)
        if avail is None or mine is None:
            continue
        rec = StopRecord(node, group.name, time.time(), avail, mine.measured_b or mine.claim_b or 0)
        log.add(rec)
        out.append(rec)
    return out


async def start_monitor(cluster: ClusterConfig, **kwargs: Any) -> Any:
    """A ClusterMonitor over every node, once each node has said what runs on it (the caller stops it)."""
    from ..nodes.monitor import ClusterMonitor
    monitor = ClusterMonitor(cluster, history=8, **kwargs)
    await monitor.start()
    await monitor.wait_first_ticks(FACTS_TIMEOUT_S)
    await containers_read(monitor.nodes)
    return monitor


async def containers_read(monitors: Mapping[str, Any], timeout: float = FACTS_TIMEOUT_S) -> None:
    """Until every node that answers has sent its container list, and a tick after it (with each container's
    memory cgroup): the agent lists containers on a thread of its own, so its first ticks carry none, and a
    placement read then would see empty nodes."""
    def done(nm: Any) -> bool:
        if getattr(getattr(nm, "state", None), "value", None) == "DOWN" or getattr(nm, "transport", None) is None:
            return True
        ticks = list(getattr(nm, "history", ()))
        seen = next((t.seq for t in ticks if t.containers is not None), None)
        return seen is not None and ticks[-1].seq > seen
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(done(nm) for nm in monitors.values()):
        await asyncio.sleep(0.05)


async def estimator_for(recipe: Any, plan: Any, monitors: Mapping[str, Any]) -> Estimator:
    """The memory estimate with the model as a node's Hugging Face cache has it (the first node that has it), so a
    recipe without metadata still has its weights counted; the recipe's metadata and built-in figures otherwise."""
    return await estimator_for_all([(recipe, plan)], monitors)


async def estimator_for_all(planned: Sequence[tuple[Any, Any]], monitors: Mapping[str, Any]) -> Estimator:
    """estimator_for of several recipes (each with a plan of it): each model read once, from the first node that
    has it in its cache."""
    from ..placement.estimate import estimate_plan
    from ..placement.modelinfo import read_node
    from .lint import plan_model
    infos: dict[str, Any] = {}
    read: dict[str, Any] = {}
    for recipe, plan in planned:
        source = plan_model(plan)
        if not source:
            continue
        if source not in read:
            read[source] = None
            for name in (*plan.nodes, *(n for n in monitors if n not in plan.nodes)):
                t = getattr(monitors.get(name), "transport", None)
                if t is None:
                    continue
                read[source], _ = await read_node(t, source, getattr(recipe, "model_revision", None))
                if read[source] is not None:
                    break
        infos[recipe.key] = read[source]

    def estimate(r: Any, p: Any, totals: Mapping[str, int]) -> Sequence[Any]:
        return estimate_plan(r, p, totals, info=infos.get(r.key))
    return estimate
