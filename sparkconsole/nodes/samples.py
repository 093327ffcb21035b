"""Typed samples: the agent's JSON lines parsed into dataclasses, the contract between the layers.

Wire format (one JSON object per line on the agent's stdout; see sparkconsole/agent/):

  {"type": "hello", "agent_version": "0.1.0", "hostname": "spark1", "kernel": "6.11.0-1016-nvidia",
   "boot_id": "…", "driver": "580.95.05", "nvml_version": "13.580.95", "gpu_source": "nvml",
   "simulated": false, "interval_s": 0.5, "time": 1763830000.1,
   "gpus": [{"index": 0, "name": "NVIDIA GB10", "uuid": "GPU-…"}]}

  {"type": "tick", "seq": 12, "time": 1763830006.1,
   "gpus": [{"index": 0, "temp_c": 61, "slowdown_c": 89, "shutdown_c": 95, "gpu_max_c": 87,
             "reasons_mask": 4, "reasons": ["sw_power_cap"], "reason_us": {"sw_power_cap": 123456},
             "power_w": 126.1, "power_limit_w": 700.0, "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980,
             "util_pct": 98, "mem_util_pct": 40,
             "mem_total_b": 85520809984, "mem_used_b": 503316480,   # absent where NVML says NOT_SUPPORTED
             "unified": false}],
   "mem": {"total_kb": 131981020, "available_kb": 131456992, "cached_kb": 947512,
           "swap_total_kb": 0, "swap_free_kb": 0},
   "pressure": {"some_avg10": 0.0, "full_avg10": 0.0},                 # absent without /proc/pressure
   "guards": {"swaps": [], "overcommit_memory": 0, "min_free_kbytes": 1572864, "swappiness": 60,
              "earlyoom": {"installed": true, "pid": 812, "args": ["-M", "3145728", "--prefer", "…"]}},
   "containers": [{"name": "vllm_node", "image": "vllm-node", "state": "running", "health": "healthy",
                   "started_at": "2026-…Z", "restart_count": 0, "memory_limit_b": 107374182400,
                   "oom_killed": false, "exit_code": 0}],               # only on container ticks (slower cadence)
   "cgroups": [{"name": "vllm_node", "current_b": 5368709120, "max_b": 107374182400},  # running containers'
               {"name": "other", "reason": "no memory cgroup file"}],  # memory cgroup, every tick; max_b absent: no
                                                                       # cap; reason instead of current_b: not read
   "gpu_procs": {"read_at": 1763830005.6,                              # node time of the process list (read every
                 "procs": [{"pid": 4242, "gpu": 0, "used_b": 95864520704, "comm": "python3",   # few ticks, repeated
                            "container": "vllm_node"},                 # between); container: mapped through
                           {"pid": 901, "gpu": 0, "used_b": 524288000, "where": "host"}]},   # /proc/PID/cgroup;
                                                                       # where: host | gone | unlisted; used_b absent:
                                                                       # NVML gave none. {"reason": …} instead of
                                                                       # read_at/procs: per-process memory not measured
   "errors": ["nvml: …"]}                                              # optional, one short text per failing source

Readings a source cannot give are ABSENT (None here), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

# NVML clock-event reason bits (nvmlClocksEventReason*), as read from a real driver (fixtures/nvidia-h100/probe.json).
REASON_BITS: dict[str, int] = {
    "idle": 0x1,
    "app_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clock": 0x100,
}
REASON_WORDS: dict[str, str] = {
    "idle": "Idle",
    "app_clocks": "App clocks",
    "sw_power_cap": "SW power cap",
    "hw_slowdown": "HW slowdown",
    "sync_boost": "Sync boost",
    "sw_thermal": "SW thermal",
    "hw_thermal": "HW thermal",
    "hw_power_brake": "HW power brake",
    "display_clock": "Display clock",
}
# Severity for colouring and alerts: thermal and power brake are red, power cap amber, idle dim.
REASON_SEVERITY: dict[str, str] = {
    "idle": "dim", "app_clocks": "info", "display_clock": "info", "sync_boost": "info",
    "sw_power_cap": "warn", "hw_slowdown": "bad", "sw_thermal": "bad", "hw_thermal": "bad", "hw_power_brake": "bad",
}
THROTTLING = frozenset({"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})


def reasons_from_mask(mask: int) -> list[str]:
    return [name for name, bit in REASON_BITS.items() if mask & bit]


class NodeState(str, Enum):  # noqa: UP042 — StrEnum would change str(state), which the wire and the screens print
    CONNECTING = "CONNECTING"
    LIVE = "LIVE"
    STALE = "STALE"    # connected, but 3 ticks missed
    DOWN = "DOWN"      # connection lost; reconnecting with back-off


def _f(d: dict[str, Any], k: str) -> float | None:
    v = d.get(k)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _i(d: dict[str, Any], k: str) -> int | None:
    v = d.get(k)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return int(v)


def _s(d: dict[str, Any], k: str) -> str | None:
    v = d.get(k)
    return v if isinstance(v, str) else None


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    name: str | None = None
    temp_c: float | None = None
    slowdown_c: float | None = None
    shutdown_c: float | None = None
    gpu_max_c: float | None = None
    reasons_mask: int | None = None
    reasons: tuple[str, ...] = ()
    reason_us: dict[str, int] = field(default_factory=dict)
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_total_b: int | None = None
    mem_used_b: int | None = None
    unified: bool = False

    @property
    def throttling(self) -> tuple[str, ...]:
        return tuple(r for r in self.reasons if r in THROTTLING)

    @property
    def slowdown_margin_c(self) -> float | None:
        if self.temp_c is None or self.slowdown_c is None:
            return None
        return self.slowdown_c - self.temp_c

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuSample:
        mask = _i(d, "reasons_mask")
        reasons = d.get("reasons")
        if isinstance(reasons, list):
            rs = tuple(r for r in reasons if isinstance(r, str) and r in REASON_BITS)
        elif mask is not None:
            rs = tuple(reasons_from_mask(mask))
        else:
            rs = ()
        rus = d.get("reason_us")
        return cls(
            index=_i(d, "index") or 0, name=_s(d, "name"), temp_c=_f(d, "temp_c"), slowdown_c=_f(d, "slowdown_c"),
            shutdown_c=_f(d, "shutdown_c"), gpu_max_c=_f(d, "gpu_max_c"), reasons_mask=mask, reasons=rs,
            reason_us={k: int(v) for k, v in rus.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if isinstance(rus, dict) else {},
            power_w=_f(d, "power_w"), power_limit_w=_f(d, "power_limit_w"), sm_clock_mhz=_f(d, "sm_clock_mhz"),
            sm_clock_max_mhz=_f(d, "sm_clock_max_mhz"), util_pct=_f(d, "util_pct"), mem_util_pct=_f(d, "mem_util_pct"),
            mem_total_b=_i(d, "mem_total_b"), mem_used_b=_i(d, "mem_used_b"), unified=d.get("unified") is True,
        )


@dataclass(frozen=True, slots=True)
class HostMemory:
    total_kb: int | None = None
    available_kb: int | None = None
    cached_kb: int | None = None
    swap_total_kb: int | None = None
    swap_free_kb: int | None = None

    @property
    def headroom_gib(self) -> float | None:
        return None if self.available_kb is None else self.available_kb / 1048576

    @property
    def available_frac(self) -> float | None:
        if not self.total_kb or self.available_kb is None:
            return None
        return self.available_kb / self.total_kb

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HostMemory:
        return cls(**{k: _i(d, k) for k in ("total_kb", "available_kb", "cached_kb", "swap_total_kb", "swap_free_kb")})


@dataclass(frozen=True, slots=True)
class Pressure:
    some_avg10: float | None = None
    full_avg10: float | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Pressure:
        return cls(some_avg10=_f(d, "some_avg10"), full_avg10=_f(d, "full_avg10"))


@dataclass(frozen=True, slots=True)
class EarlyOom:
    """earlyoom on the node: installed (None: not known), running (its PID), and the arguments it runs with."""
    installed: bool | None = None
    pid: int | None = None
    args: tuple[str, ...] = ()

    @property
    def running(self) -> bool:
        return self.pid is not None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EarlyOom:
        inst, args = d.get("installed"), d.get("args")
        return cls(installed=inst if isinstance(inst, bool) else None, pid=_i(d, "pid"),
                   args=tuple(str(a)[:300] for a in args[:32]) if isinstance(args, list) else ())


@dataclass(frozen=True, slots=True)
class GuardInputs:
    swaps: tuple[str, ...] | None = None           # active swap devices (None: could not read /proc/swaps)
    overcommit_memory: int | None = None
    min_free_kbytes: int | None = None
    swappiness: int | None = None
    earlyoom: EarlyOom | None = None               # None: not read (an agent before this one)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GuardInputs:
        sw, eo = d.get("swaps"), d.get("earlyoom")
        return cls(swaps=tuple(str(s) for s in sw) if isinstance(sw, list) else None,
                   overcommit_memory=_i(d, "overcommit_memory"), min_free_kbytes=_i(d, "min_free_kbytes"),
                   swappiness=_i(d, "swappiness"), earlyoom=EarlyOom.from_json(eo) if isinstance(eo, dict) else None)


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    name: str
    image: str | None = None
    state: str | None = None          # running | exited | restarting | created | paused | dead
    health: str | None = None         # healthy | unhealthy | starting | None (no healthcheck)
    started_at: str | None = None
    restart_count: int | None = None
    memory_limit_b: int | None = None  # 0 or None: no cap
    oom_killed: bool | None = None
    exit_code: int | None = None
    labels: tuple[tuple[str, str], ...] = ()  # sparkconsole.* labels: the launch it belongs to (nodes/launches.py)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ContainerInfo:
        ok = d.get("oom_killed")
        raw = d.get("labels")
        labels = (tuple((str(k)[:64], v[:128]) for k, v in list(raw.items())[:16] if isinstance(v, str))
                  if isinstance(raw, dict) else ())
        return cls(name=_s(d, "name") or "?", image=_s(d, "image"), state=_s(d, "state"), health=_s(d, "health"),
                   started_at=_s(d, "started_at"), restart_count=_i(d, "restart_count"),
                   memory_limit_b=_i(d, "memory_limit_b"), oom_killed=ok if isinstance(ok, bool) else None,
                   exit_code=_i(d, "exit_code"), labels=labels)


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    """A running container's memory cgroup: usage (memory.current / usage_in_bytes) against its cap. On a GB10 the
    usage holds the container's CPU side only: CUDA allocations are not charged to it (docs/RECORDER.md)."""
    name: str
    current_b: int | None = None
    max_b: int | None = None          # None: no cap
    reason: str | None = None         # why current_b is absent (no memory cgroup file for it, …)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CgroupMemory:
        reason = _s(d, "reason")
        return cls(name=_s(d, "name") or "?", current_b=_i(d, "current_b"), max_b=_i(d, "max_b"),
                   reason=reason[:160] if reason else None)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process holding GPU memory, as NVML lists it (nvmlDeviceGetComputeRunningProcesses), and the container
    the agent found it in (/proc/PID/cgroup). used_b None: NVML gave no figure for it."""
    pid: int
    gpu: int = 0
    used_b: int | None = None
    comm: str | None = None
    container: str | None = None
    where: str | None = None          # no container: "host" (not in one), "gone" (ended before it was mapped),
                                      # "unlisted" (a container cgroup the agent's docker poll does not list)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuProcess:
        comm, cont, where = _s(d, "comm"), _s(d, "container"), _s(d, "where")
        return cls(pid=_i(d, "pid") or 0, gpu=_i(d, "gpu") or 0, used_b=_i(d, "used_b"),
                   comm=comm[:32] if comm else None, container=cont[:128] if cont else None,
                   where=where[:16] if where else None)


@dataclass(frozen=True, slots=True)
class GpuProcesses:
    """The node's per-process GPU memory reading: the processes, or why there is none (reason)."""
    read_at: float | None = None      # node clock when the list was read (ticks between reads repeat it)
    procs: tuple[GpuProcess, ...] = ()
    reason: str | None = None         # not measured: NVML without per-process support, no GPU source, …

    @property
    def measured(self) -> bool:
        return self.reason is None and self.read_at is not None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuProcesses:
        reason = _s(d, "reason")
        procs = d.get("procs")
        return cls(read_at=_f(d, "read_at"), reason=reason[:200] if reason else None,
                   procs=tuple(GpuProcess.from_json(p) for p in procs[:256] if isinstance(p, dict))
                   if isinstance(procs, list) else ())


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """The agent's first line: what the node is."""
    hostname: str | None = None
    kernel: str | None = None
    boot_id: str | None = None
    driver: str | None = None
    nvml_version: str | None = None
    agent_version: str | None = None
    gpu_source: str | None = None     # nvml | nvidia-smi | replay | sim | none
    simulated: bool = False
    interval_s: float | None = None
    gpu_names: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeInfo:
        gpus = d.get("gpus")
        names = tuple(_s(g, "name") or "?" for g in gpus if isinstance(g, dict)) if isinstance(gpus, list) else ()
        return cls(hostname=_s(d, "hostname"), kernel=_s(d, "kernel"), boot_id=_s(d, "boot_id"), driver=_s(d, "driver"),
                   nvml_version=_s(d, "nvml_version"), agent_version=_s(d, "agent_version"),
                   gpu_source=_s(d, "gpu_source"), simulated=d.get("simulated") is True,
                   interval_s=_f(d, "interval_s"), gpu_names=names)


@dataclass(frozen=True, slots=True)
class Tick:
    seq: int
    time: float                         # node clock, epoch seconds, when sampled
    received: float                     # console clock (time.time()) when parsed
    gpus: tuple[GpuSample, ...] = ()
    mem: HostMemory | None = None
    pressure: Pressure | None = None
    guards: GuardInputs | None = None
    containers: tuple[ContainerInfo, ...] | None = None   # None: not sampled on this tick (keep the last)
    errors: tuple[str, ...] = ()
    cgroups: tuple[CgroupMemory, ...] = ()                 # agents before 0.2 never send it
    gpu_procs: GpuProcesses | None = None                  # None: the agent sent no per-process reading (older)

    @classmethod
    def from_json(cls, d: dict[str, Any], received: float) -> Tick:
        """Raises ValueError on a line that is not a tick (the monitor counts and drops it)."""
        if not isinstance(d, dict) or d.get("type") != "tick":
            raise ValueError("not a tick")
        t = _f(d, "time")
        if t is None:
            raise ValueError("tick without time")
        gpus = d.get("gpus")
        conts = d.get("containers")
        errs = d.get("errors")
        return cls(
            seq=_i(d, "seq") or 0, time=t, received=received,
            gpus=tuple(GpuSample.from_json(g) for g in gpus if isinstance(g, dict)) if isinstance(gpus, list) else (),
            mem=HostMemory.from_json(d["mem"]) if isinstance(d.get("mem"), dict) else None,
            pressure=Pressure.from_json(d["pressure"]) if isinstance(d.get("pressure"), dict) else None,
            guards=GuardInputs.from_json(d["guards"]) if isinstance(d.get("guards"), dict) else None,
            containers=tuple(ContainerInfo.from_json(c) for c in conts if isinstance(c, dict))
            if isinstance(conts, list) else None,
            errors=tuple(str(e)[:200] for e in errs[:16]) if isinstance(errs, list) else (),
            cgroups=tuple(CgroupMemory.from_json(c) for c in d["cgroups"][:64] if isinstance(c, dict))
            if isinstance(d.get("cgroups"), list) else (),
            gpu_procs=GpuProcesses.from_json(d["gpu_procs"]) if isinstance(d.get("gpu_procs"), dict) else None,
        )
