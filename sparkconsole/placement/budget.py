"""A node's memory budget: what a new workload may claim there. Pure: a tick in, a NodeBudget out.

    budget = node_budget("spark1", nm.last, cluster.thresholds.headroom_floor_gib, exclude={"vllm_node"})
    budget.free_b        # MemTotal − (headroom floor + vm.min_free_kbytes) − what the other workloads hold

On a GB10 the GPU's memory is the host's (MemTotal ~121.7 GiB, gb10-facts.md), and a container's memory cap does
not contain it: CUDA allocations are not charged to the container's cgroup (graphistry/pygraphistry pull request
1671; Blackwellboy/model-serving-minefield issue 57). So the budget is the node's, never the cap: its total, less
the reserve the kernel and the console keep (the headroom floor the alerts use, and the `vm.min_free_kbytes` the
kernel holds back), less what every other workload measurably holds (its processes' GPU memory from NVML plus its
cgroup's usage: nodes/workload_memory.py), GPU processes in no container included.

A node whose memory could not be read gets an estimate (a GB10's MemTotal, nothing held), marked `measured=False`
with the reason; `offline_budget` is that estimate for a node never asked.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ..nodes.samples import Tick
from ..nodes.workload_memory import WorkloadMemory, host_gpu_processes, workload_memory

GIB = 1 << 30
GB10_MEMTOTAL_B = int(121.7 * GIB)         # what a GB10 reports as MemTotal (gb10-facts.md)
MIN_FREE_B = 1572864 * 1024                # vm.min_free_kbytes the published mitigations set (seed 004), when unread
HOST_PROCESSES = "(GPU processes in no container)"


@dataclass(frozen=True)
class NodeBudget:
    node: str
    total_b: int | None               # MemTotal
    reserve_b: int                    # the headroom floor + vm.min_free_kbytes
    held: tuple[WorkloadMemory, ...]  # what other workloads measurably hold
    available_b: int | None           # MemAvailable now
    measured: bool                    # False: the node's memory could not be read (estimate only, marked as such)
    reason: str | None = None

    @property
    def held_b(self) -> int:
        """Σ of what the other workloads hold, where measured (`unmeasured` names the ones that are not)."""
        return sum(w.total_b or 0 for w in self.held)

    @property
    def unmeasured(self) -> tuple[WorkloadMemory, ...]:
        """Held workloads whose figure is partial or missing: the budget may be smaller than free_b says."""
        return tuple(w for w in self.held if w.container != HOST_PROCESSES and not w.measured)

    @property
    def free_b(self) -> int | None:
        """total − reserve − Σ held (None when the total is unknown)."""
        if self.total_b is None:
            return None
        return self.total_b - self.reserve_b - self.held_b


def _reserve_b(headroom_floor_gib: float, min_free_kbytes: int | None) -> int:
    return int(headroom_floor_gib * GIB) + (min_free_kbytes * 1024 if min_free_kbytes is not None else MIN_FREE_B)


def offline_budget(node: str, total_b: int = GB10_MEMTOTAL_B, *, headroom_floor_gib: float = 8.0,
                   reason: str = "not read from the node: a GB10 assumed, nothing held") -> NodeBudget:
    """The estimate for a node whose memory is not known: a GB10's MemTotal, the recommended reserve, nothing held."""
    return NodeBudget(node, total_b, _reserve_b(headroom_floor_gib, None), (), None, False, reason)


def node_budget(node: str, tick: Tick | None, headroom_floor_gib: float, *,
                exclude: Collection[str] = ()) -> NodeBudget:
    """The node's budget from its latest tick; `exclude`: containers not to count as held (the workload being
    judged, when it already runs and is being replaced)."""
    mem = tick.mem if tick is not None else None
    if tick is None or mem is None or not mem.total_kb:
        why = "no reading from the node" if tick is None else "the node's /proc/meminfo was not read"
        return offline_budget(node, headroom_floor_gib=headroom_floor_gib, reason=f"{why}: a GB10 assumed")
    held = [w for name, w in workload_memory(tick).items() if name not in exclude]
    loose = host_gpu_processes(tick)
    if loose:
        pids = ", ".join(str(p.pid) for p in loose[:4]) + (" …" if len(loose) > 4 else "")
        held.append(WorkloadMemory(HOST_PROCESSES, sum(p.used_b or 0 for p in loose), None,
                                   f"PID {pids}: no container, so no cgroup figure", procs=loose))
    min_free = tick.guards.min_free_kbytes if tick.guards is not None else None
    reasons = [f"{w.container}: {w.reason}" for w in held if w.container != HOST_PROCESSES and not w.measured]
    return NodeBudget(node, mem.total_kb * 1024, _reserve_b(headroom_floor_gib, min_free), tuple(held),
                      mem.available_kb * 1024 if mem.available_kb is not None else None, True,
                      "; ".join(reasons) or None)
