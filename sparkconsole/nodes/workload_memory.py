"""What each workload (a running container) measurably holds on its node: its processes' GPU memory plus its
memory cgroup's usage. Pure: one tick in, one figure per container out.

Why both: on a GB10 a container's memory cgroup (`memory.current`, what its `--memory` cap is judged against) does
not see CUDA allocations. Public measurements on DGX Spark: a container reached 8 GB under a 4 GB `docker --memory`
cap (graphistry/pygraphistry pull request 1671); inside a cgroup v2 scope with `MemoryMax=8G`, 12 GiB of CUDA memory
allocated in 1 GiB steps moved `memory.current` from 5.7 MB to 409 MB, with no OOM kill
(Blackwellboy/model-serving-minefield issue 57). NVML does report each process's GPU allocation there, from the
host (a serving vLLM worker: 89.3 GiB, Syllo/nvtop pull request 511), so the agent reads the process list and
maps each PID to its container (agent/containers.py, `gpu_procs` on the wire: nodes/samples.py).

A figure that cannot be measured is None with the reason, never a guess: NVML without per-process support, a
process that ended between the read and its mapping (its container unknown: every GPU figure of that read is
withheld), a container whose cgroup file could not be read (cgroup v1 without the memory controller).
"""

from __future__ import annotations

from dataclasses import dataclass

from .samples import GpuProcess, Tick

NO_PROCS_REASON = "the node's agent sent no per-process GPU reading (an agent before this one)"


@dataclass(frozen=True)
class WorkloadMemory:
    """One container on one node, bytes."""
    container: str
    gpu_b: int | None                 # Σ NVML used GPU memory of the container's processes; None: not measured
    cgroup_b: int | None              # the container's memory.current; None: not measured
    reason: str | None                # why a figure is not measured ("no per-process NVML", "cgroup v1 host", …)
    cap_b: int | None = None          # the cgroup's limit (--memory): it holds cgroup_b, not gpu_b, on a GB10
    procs: tuple[GpuProcess, ...] = ()   # the GPU processes found in it

    @property
    def total_b(self) -> int | None:
        """gpu + cgroup where measured (None when neither is); `reason` says which part is missing."""
        parts = [v for v in (self.gpu_b, self.cgroup_b) if v is not None]
        return sum(parts) if parts else None

    @property
    def measured(self) -> bool:
        """Both parts measured: total_b is the whole of it."""
        return self.gpu_b is not None and self.cgroup_b is not None


def _gpu_part(procs: list[GpuProcess], withheld: str | None) -> tuple[int | None, str | None]:
    if withheld:
        return None, withheld
    missing = [p.pid for p in procs if p.used_b is None]
    if missing:
        return None, f"NVML gave no memory figure for PID {missing[0]}"
    return sum(p.used_b or 0 for p in procs), None


def workload_memory(tick: Tick) -> dict[str, WorkloadMemory]:
    """Container name → its memory, for every running container the tick names (its cgroups, its GPU processes,
    and its container list when the tick carries one)."""
    names: dict[str, None] = {}
    if tick.containers is not None:
        names.update((c.name, None) for c in tick.containers if c.state == "running")
    cgroups = {c.name: c for c in tick.cgroups}
    names.update((n, None) for n in cgroups)
    gp = tick.gpu_procs
    by_container: dict[str, list[GpuProcess]] = {}
    withheld: str | None
    if gp is None:
        withheld = NO_PROCS_REASON
    elif not gp.measured:
        withheld = gp.reason or "no per-process GPU reading"
    else:
        withheld = None
        for p in gp.procs:
            if p.container:
                by_container.setdefault(p.container, []).append(p)
                names[p.container] = None
        gone = next((p for p in gp.procs if not p.container and p.where == "gone"), None)
        if gone is not None:
            # Its container is unknown: any container's sum could be short by its memory. Withheld until the next read.
            withheld = f"GPU process {gone.pid} ended before it could be mapped to a container"
    out = {}
    for name in names:
        procs = by_container.get(name, [])
        gpu_b, gpu_why = _gpu_part(procs, withheld)
        cg = cgroups.get(name)
        cgroup_b = cg.current_b if cg else None
        cg_why = None if cgroup_b is not None else (cg.reason if cg and cg.reason else "its memory cgroup was not read")
        why = "; ".join(f"{part}: {text}" for part, text in (("GPU", gpu_why), ("cgroup", cg_why)) if text)
        out[name] = WorkloadMemory(name, gpu_b, cgroup_b, why or None, cap_b=cg.max_b if cg else None,
                                   procs=tuple(procs))
    return out


def host_gpu_processes(tick: Tick) -> tuple[GpuProcess, ...]:
    """The GPU processes in no container of the node (a workload started by hand, a desktop): memory the node's
    budget must count too, though no container holds it."""
    gp = tick.gpu_procs
    if gp is None or not gp.measured:
        return ()
    return tuple(p for p in gp.procs if not p.container and p.where in ("host", "unlisted"))
