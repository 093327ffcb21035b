"""OOM guards for GB10 nodes: each check says ok / warn / bad / unknown, why, and the exact command that fixes it.
Its state is its severity everywhere (severity.py: bad refuses a launch, warn is said): the dashboard, `status`,
the recipes screen and `recipe lint` draw the same judgement.

Why these matter: a GB10's GPU shares the host's unified memory, and an OOM there does not kill a process —
it freezes the whole machine (no OOM kill, no panic; a power cycle is needed; see the published mitigations in
the seed posts and gb10-facts.md). The mitigations: no swap, vm.overcommit_memory=0, a 1.5 GiB free-memory
reserve, a hard memory cap on the vLLM container, and dropping the page cache before a model load.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from .samples import ContainerInfo, GuardInputs, HostMemory

MIN_FREE_KBYTES = 1572864              # 1.5 GiB reserve
PAGE_CACHE_WARN_FRAC = 0.10            # page cache above this share of MemTotal is worth dropping before a load
CONTAINER_CAP = "100g"
WHY = "GB10 unified memory: an OOM freezes the whole machine"

KEYS = ("swap", "overcommit", "min_free", "container_cap", "page_cache")


@dataclass(frozen=True)
class GuardResult:
    key: str
    title: str
    status: str           # ok | warn | bad | unknown
    reason: str
    fix: str | None = None


def _gib(kb: float) -> str:
    return f"{kb / 1048576:.1f} GiB"


def check_swap(g: GuardInputs | None, mem: HostMemory | None) -> GuardResult:
    title = "Swap off"
    if g is None or g.swaps is None:
        return GuardResult("swap", title, "unknown", "could not read /proc/swaps")
    if not g.swaps:
        return GuardResult("swap", title, "ok", "no swap active")
    return GuardResult("swap", title, "bad",
                       f"swap active ({', '.join(g.swaps[:3])}): swapping unified memory is a death spiral, "
                       f"not graceful degradation ({WHY})",
                       "sudo swapoff -a && sudo sed -i.bak '/^[^#].*\\sswap\\s/s/^/#/' /etc/fstab")


def check_overcommit(g: GuardInputs | None) -> GuardResult:
    title = "vm.overcommit_memory=0"
    v = None if g is None else g.overcommit_memory
    fix = "sudo sysctl -w vm.overcommit_memory=0"
    if v is None:
        return GuardResult("overcommit", title, "unknown", "could not read /proc/sys/vm/overcommit_memory")
    if v == 0:
        return GuardResult("overcommit", title, "ok", "heuristic overcommit: a huge allocation fails at once")
    if v == 1:
        return GuardResult("overcommit", title, "bad",
                           f"vm.overcommit_memory=1 (never 1): every allocation succeeds until memory runs out, "
                           f"then the machine freezes instead of malloc failing ({WHY})", fix)
    return GuardResult("overcommit", title, "warn",
                       f"vm.overcommit_memory={v}: strict accounting can refuse the large virtual reservations "
                       "CUDA makes; 0 is the setting the published runs used", fix)


def check_min_free(g: GuardInputs | None) -> GuardResult:
    title = "vm.min_free_kbytes ≥ 1.5 GiB"
    v = None if g is None else g.min_free_kbytes
    if v is None:
        return GuardResult("min_free", title, "unknown", "could not read /proc/sys/vm/min_free_kbytes")
    if v >= MIN_FREE_KBYTES:
        return GuardResult("min_free", title, "ok", f"kernel keeps {_gib(v)} free")
    return GuardResult("min_free", title, "warn",
                       f"vm.min_free_kbytes={v} ({_gib(v)}): a 1.5 GiB reserve keeps the kernel able to reclaim "
                       f"under pressure ({WHY})", f"sudo sysctl -w vm.min_free_kbytes={MIN_FREE_KBYTES}")


def check_container_cap(containers: Sequence[ContainerInfo], container_name: str,
                        mem: HostMemory | None) -> GuardResult:
    title = f"Memory cap on {container_name}"
    c = next((c for c in containers if c.name == container_name), None)
    fix = f"docker update --memory {CONTAINER_CAP} --memory-swap {CONTAINER_CAP} {shlex.quote(container_name)}"
    if c is None:
        return GuardResult("container_cap", title, "unknown", f"no container named {container_name} on this node")
    if not c.memory_limit_b:
        return GuardResult("container_cap", title, "bad",
                           f"{container_name} has no memory cap: a runaway load takes the host down instead of "
                           f"the container being killed ({WHY})", fix)
    cap_kb = c.memory_limit_b / 1024
    if mem is not None and mem.total_kb and cap_kb >= mem.total_kb:
        # as good as no cap (and preflight refuses a recipe's cap of that size): bad, as no cap is
        return GuardResult("container_cap", title, "bad",
                           f"cap {_gib(cap_kb)} is not below the host's {_gib(mem.total_kb)}: it cannot fire "
                           "before the host runs out", fix)
    return GuardResult("container_cap", title, "ok", f"capped at {_gib(cap_kb)}")


def check_page_cache(mem: HostMemory | None) -> GuardResult:
    title = "Page cache dropped before load"
    if mem is None or mem.cached_kb is None or not mem.total_kb:
        return GuardResult("page_cache", title, "unknown", "could not read Cached from /proc/meminfo")
    if mem.cached_kb > PAGE_CACHE_WARN_FRAC * mem.total_kb:
        return GuardResult("page_cache", title, "warn",
                           f"{_gib(mem.cached_kb)} of page cache: drop it before a model load so the load sees "
                           f"the memory that is really free ({WHY})",
                           "sync && echo 3 | sudo tee /proc/sys/vm/drop_caches")
    return GuardResult("page_cache", title, "ok", f"page cache {_gib(mem.cached_kb)}")


def evaluate_guards(guards: GuardInputs | None, mem: HostMemory | None, containers: Sequence[ContainerInfo],
                    container_name: str) -> list[GuardResult]:
    """Every guard, in KEYS order."""
    return [check_swap(guards, mem), check_overcommit(guards), check_min_free(guards),
            check_container_cap(containers, container_name, mem), check_page_cache(mem)]
