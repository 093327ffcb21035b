"""OOM guards for GB10 nodes: each check says ok / warn / bad / unknown, why, and the exact command that fixes it.
Its state is its severity everywhere (severity.py: bad refuses a launch, warn is said): the dashboard, `status`,
the recipes screen and `recipe lint` draw the same judgement.

Why these matter: a GB10's GPU shares the host's unified memory, and an OOM there does not kill a process —
it freezes the whole machine (no OOM kill, no panic; a power cycle is needed; see the published mitigations in
the seed posts and gb10-facts.md). The mitigations: no swap, vm.overcommit_memory=0, a 1.5 GiB free-memory
reserve, a memory cap on the vLLM container, dropping the page cache before a model load, and earlyoom.

What the container's cap contains: the container's CPU side (Python, compile workers, host buffers). It does not
contain GPU memory: CUDA allocations are not charged to the container's cgroup on a GB10 (graphistry/pygraphistry
pull request 1671: a container reached 8 GB under a 4 GB cap; Blackwellboy/model-serving-minefield issue 57: 12 GiB
of CUDA memory in a MemoryMax=8G scope, memory.current 5.7 → 409 MB, no OOM kill). A runaway in GPU memory is
stopped by the console's guard (protect.py, on the workload whose GPU memory grew) or by earlyoom, which acts on
MemAvailable, the figure that does fall — preferring vLLM/SGLang's processes, avoiding sshd, dockerd and the agent.
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

KEYS = ("swap", "overcommit", "min_free", "container_cap", "page_cache", "earlyoom")

# earlyoom as the guard check wants it (its --prefer/--avoid match a process's name, comm, 15 characters at most):
# SIGTERM at 3 GiB available (SIGKILL at half of it), never on swap alone; vLLM's and SGLang's processes first
# (`vllm serve`, VLLM::EngineCore / VLLM::Worker, sglang::scheduler …), never sshd, dockerd, containerd or the
# console's agent (it names itself `python3-scagent`).
EARLYOOM_PREFER = "(^|/)(vllm|VLLM::.*|sglang|sglang::.*)$"
EARLYOOM_AVOID = "(^|/)(sshd|dockerd|containerd|python3-scagent)$"
EARLYOOM_ARGS = f"-r 3600 -M 3145728 --prefer '{EARLYOOM_PREFER}' --avoid '{EARLYOOM_AVOID}'"
# process names (comm) each regex must match, and must not: what the check judges a running earlyoom's arguments by
PREFER_NAMES = ("vllm", "VLLM::EngineCor", "VLLM::Worker", "sglang::schedul")
AVOID_NAMES = ("sshd", "dockerd", "python3-scagent")
EARLYOOM_FIX = ("sudo apt-get install -y earlyoom && printf 'EARLYOOM_ARGS=\"%s\"\\n' "
                + shlex.quote(EARLYOOM_ARGS) + " | sudo tee /etc/default/earlyoom >/dev/null && "
                "sudo systemctl enable earlyoom && sudo systemctl restart earlyoom")


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
                           f"{container_name} has no memory cap: a runaway of its CPU side (Python, compile "
                           f"workers, host buffers) takes the host down instead of the container being killed; "
                           f"the cap does not hold its GPU memory ({WHY})", fix)
    cap_kb = c.memory_limit_b / 1024
    if mem is not None and mem.total_kb and cap_kb >= mem.total_kb:
        # as good as no cap (and preflight refuses a recipe's cap of that size): bad, as no cap is
        return GuardResult("container_cap", title, "bad",
                           f"cap {_gib(cap_kb)} is not below the host's {_gib(mem.total_kb)}: it cannot fire "
                           "before the host runs out", fix)
    return GuardResult("container_cap", title, "ok", f"capped at {_gib(cap_kb)}: holds its CPU side, not its GPU "
                                                     "memory")


def _regex_covers(args: Sequence[str], flag: str, names: Sequence[str]) -> bool | None:
    """Whether earlyoom's `flag` regex (its last one; --flag REGEX or --flag=REGEX) matches every name; None when
    the flag is absent or the regex is not one Python reads (POSIX ERE of these shapes reads the same)."""
    import re
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1:]
    if value is None:
        return None
    try:
        rx = re.compile(value)
    except re.error:
        return None
    return all(rx.search(n) for n in names)


def check_earlyoom(g: GuardInputs | None) -> GuardResult:
    """earlyoom: what stops a runaway in GPU memory that no container cap sees (it acts on MemAvailable)."""
    title = "earlyoom prefers vLLM/SGLang"
    eo = None if g is None else g.earlyoom
    if eo is None:
        return GuardResult("earlyoom", title, "unknown", "not read (the node's agent is older than this console)")
    why = ("a runaway in GPU memory is not stopped by a container's cap on a GB10 (CUDA memory is not charged to "
           "it): earlyoom, acting on MemAvailable, is what stops one the console's guard does not")
    if not eo.running:
        return GuardResult("earlyoom", title, "warn", ("installed but not running: " if eo.installed else
                                                       "not installed: ") + why, EARLYOOM_FIX)
    prefer = _regex_covers(eo.args, "--prefer", PREFER_NAMES)
    avoid = _regex_covers(eo.args, "--avoid", AVOID_NAMES)
    wrong = []
    if not prefer:
        wrong.append("its --prefer does not name vLLM's and SGLang's processes (" + ", ".join(PREFER_NAMES) + ")")
    if not avoid:
        wrong.append("its --avoid does not name " + ", ".join(AVOID_NAMES))
    if wrong:
        return GuardResult("earlyoom", title, "warn", f"running (PID {eo.pid}), but " + "; ".join(wrong)
                           + ": it kills the largest process, and CUDA memory is not in a process's RSS", EARLYOOM_FIX)
    return GuardResult("earlyoom", title, "ok", f"running (PID {eo.pid}), preferring vLLM/SGLang, avoiding "
                                                "sshd, dockerd and the agent")


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
            check_container_cap(containers, container_name, mem), check_page_cache(mem), check_earlyoom(guards)]
