"""A simulated GB10 node: a state directory the REAL agent reads, and a thermal model that drives it.

Layout of a node directory (what the agent, the docker shim and the simulated servers share):

    <dir>/sim.json          node identity: name, address, speed, owner pid (written once; read by the shim)
    <dir>/gpu.json          the agent's `--gpu-source sim:FILE` input, rewritten atomically every update
    <dir>/proc/...          meminfo, swaps, pressure/memory, sys/vm/* for the agent's `--proc-root`; PID/cgroup and
                            PID/comm of each process holding GPU memory (a container's: Docker's cgroup v2 layout)
    <dir>/sys/fs/cgroup/... the agent's `--cgroup-root`: each running container's system.slice/docker-<id>.scope
                            (memory.current, memory.max), and earlyoom's unit on a hardened node
    <dir>/bin/docker        the docker CLI shim (sparkconsole/sim/dockershim.py)
    <dir>/containers/NAME/  one simulated container: container.json, log
    <dir>/load/*.json       what the node's simulated workloads draw: reserved memory and GPU busy fraction,
                            written by the simulated vLLM servers (a TP head also writes one on each worker)

Memory as a GB10 accounts for it: a workload's reserved (GPU) memory is its process's NVML figure, published in
gpu.json's `procs` for the REAL agent to read and map to its container through the node's /proc/PID/cgroup; the
container's cgroup is charged only its CPU side (Load.cpu_b) and ~2 MB of page tables per GiB of GPU memory
(Blackwellboy/model-serving-minefield issue 57), so a runaway in GPU memory never reaches its memory cap.

The GPU follows a first-order thermal model, dT/dt = (P·R + T_amb − T) / τ, driven by the power the
workloads draw; above the slowdown threshold the SM clock drops and `sw_thermal` is raised, which the
simulated servers read back (sm_clock_mhz / sm_clock_max_mhz) to slow their engines. At the HW slowdown
threshold (only a cooling fault gets there) the clock falls to its floor and `hw_slowdown` + `hw_thermal` are
raised.

Runaways (sim/runaway.py) hook into `update()`; a node that froze, powered off or lost its link is `silenced`:
it stops writing, and the files the agent reads become FIFOs nobody writes, so the agent's next read blocks
(sim/runaway.py says how a silenced node looks to the console).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from . import containers
from .dockershim import install
from .files import pid_alive, read_json, write_atomic

GIB = 1 << 30
KIB = 1024
PAGE_TABLES_PER_GIB = 2 << 20       # cgroup charge per GiB of CUDA memory: ~2 MB (model-serving-minefield issue 57)
EARLYOOM_PID = 1                     # earlyoom's PID in the simulated /proc (only this tree knows it)
# How long a silent node reads STALE before the console's connection to it drops (DOWN): the SSH transport's
# keepalive, 5 s × 3 (nodes/transport.py). The local transport has none, so a silenced node plays it.
KEEPALIVE_S = 15.0


@dataclass(frozen=True)
class GB10Spec:
    """What a GB10 reports and how it heats. Readings follow the reference notes (gb10-facts.md); the
    thermal constants are tuned so a sustained full load settles just past the SW-thermal threshold
    (published: 84–90 °C under c64, SW thermal slowdown at 91–92 °C) and idle sits in the mid-30s."""
    name: str = "NVIDIA GB10"
    mem_total_kb: int = int(121.7 * GIB / KIB)     # MemTotal on a GB10 (unified memory)
    os_used_kb: int = 5 * GIB // KIB               # OS, desktop, daemons
    page_cache_kb: int = 3 * GIB // KIB
    sm_clock_max_mhz: int = 3003                   # the GB10 SM clock rating
    sm_clock_min_mhz: int = 1200                   # floor the thermal controller drops to
    idle_power_w: float = 3.0                      # nvidia-smi on an idle GB10: 3 W at P8
    loaded_idle_power_w: float = 11.0              # a model resident, no requests
    # Dynamic power: streaming weights/KV (memory-bound decode) costs far less than matmul work (prefill,
    # large batches). Fitted so a c1 decode settles near 67 °C and a sustained c64 pp1024/tg128 run
    # (about half its GPU time in matmuls) near 90 °C.
    mem_power_w: float = 42.0                      # at 100% memory-bound busy time
    compute_power_w: float = 147.0                 # at 100% compute-bound busy time
    ambient_c: float = 34.0
    r_c_per_w: float = 0.56                        # thermal resistance: 100 W -> 34 + 56 = 90 °C steady
    tau_s: float = 90.0                            # time constant (simulated seconds)
    slowdown_c: float = 90.0                       # SW thermal slowdown threshold
    hw_slowdown_c: float = 94.0                    # HW slowdown (the simulator's choice, between slowdown and shutdown)
    shutdown_c: float = 97.0
    gpu_max_c: float = 88.0                        # target operating maximum
    clock_drop_per_c: float = 0.08                 # fraction of clock shed per °C over the threshold
    driver: str = "580.126.09"
    kernel: str = "6.11.0-1016-nvidia"


GB10 = GB10Spec()


def default_min_free_kbytes(mem_total_kb: int) -> int:
    """The kernel's own default: sqrt(lowmem_kbytes * 16), clamped to [128, 262144]."""
    return max(128, min(262144, int(math.sqrt(mem_total_kb * 16))))


@dataclass
class NodeTuning:
    """The OOM-guard settings the node starts with (the guards panel reads them through the agent)."""
    swap_kb: int = 0                                # 0: no active swap device
    overcommit_memory: int = 0
    min_free_kbytes: int | None = None              # None: the kernel's default for this memory size
    swappiness: int = 60
    earlyoom: bool = False                          # earlyoom running as the guard check's fix configures it

    @classmethod
    def hardened(cls) -> NodeTuning:
        """The published mitigations: swap off, overcommit 0, a 1.5 GiB free reserve, earlyoom preferring vLLM."""
        return cls(swap_kb=0, overcommit_memory=0, min_free_kbytes=1572864, swappiness=10, earlyoom=True)

    @classmethod
    def stock(cls) -> NodeTuning:
        """An untouched install: a swap file and the kernel's default reserve."""
        return cls(swap_kb=16 * GIB // KIB, overcommit_memory=0, min_free_kbytes=None, swappiness=60)


@dataclass
class Load:
    """One workload's draw, as read from <dir>/load/*.json."""
    reserved_b: int = 0
    gpu_busy: float = 0.0        # fraction of time the GPU works (utilization)
    compute_frac: float = 0.0    # the part of it spent in compute-bound work (the rest streams memory)
    loaded: bool = False         # a model is resident (raises idle power)
    pid: int = 0                 # the process holding it (its GPU memory, in NVML's per-process list)
    cpu_b: int = 0               # its CPU side: what its container's cgroup is charged (besides page tables)

    @property
    def charged_b(self) -> int:
        """What the process's cgroup sees: its CPU side and the page tables of its GPU memory."""
        return self.cpu_b + self.reserved_b // GIB * PAGE_TABLES_PER_GIB


def read_loads(node_dir: Path) -> list[Load]:
    out: list[Load] = []
    for p in sorted((node_dir / "load").glob("*.json")):
        d = read_json(p)
        if not isinstance(d, dict):
            continue
        if not pid_alive(d.get("pid")):
            # The workload died without cleaning up (SIGKILL): its memory is free again.
            with contextlib.suppress(OSError):
                p.unlink()
            continue
        out.append(Load(reserved_b=int(d.get("reserved_b") or 0), gpu_busy=float(d.get("gpu_busy") or 0.0),
                        compute_frac=float(d.get("compute_frac") or 0.0), loaded=bool(d.get("loaded")),
                        pid=int(d.get("pid") or 0), cpu_b=int(d.get("cpu_b") or 0)))
    return out


def write_load(node_dir: Path, key: str, *, pid: int, reserved_b: int, gpu_busy: float, loaded: bool,
               compute_frac: float = 0.0, phase: str = "", cpu_b: int = 0, **extra: Any) -> Path:
    """Publish a workload's draw on a node (used by the simulated servers, and by tests as a plain load):
    reserved_b is GPU memory (its process's NVML figure), cpu_b its CPU side (what its cgroup is charged)."""
    d = node_dir / "load"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{key}.json"
    write_atomic(p, json.dumps({"pid": pid, "reserved_b": int(reserved_b), "cpu_b": int(cpu_b),
                                "gpu_busy": round(float(gpu_busy), 4),
                                "compute_frac": round(float(compute_frac), 4), "loaded": loaded, "phase": phase,
                                "time": time.time(), **extra}))
    return p


@dataclass
class ThermalState:
    temp_c: float
    clock_mhz: float
    power_w: float = 0.0
    busy: float = 0.0
    sw_thermal_us: int = 0
    throttled: bool = False
    hw_thermal_us: int = 0
    hw_slowdown: bool = False


def thermal_step(spec: GB10Spec, st: ThermalState, busy: float, loaded: bool, dt: float,
                 compute: float = 0.0) -> ThermalState:
    """Advance the GPU by dt simulated seconds at a busy fraction and its compute-bound part (0..1 each)."""
    busy = max(0.0, min(1.0, busy))
    compute = max(0.0, min(busy, compute))
    clock_ratio = st.clock_mhz / spec.sm_clock_max_mhz
    base = spec.loaded_idle_power_w if loaded else spec.idle_power_w
    # Dynamic power scales with the kind of work and with the clock it runs at.
    power = base + (spec.mem_power_w * (busy - compute) + spec.compute_power_w * compute) * clock_ratio
    target = spec.ambient_c + power * spec.r_c_per_w
    # Exact solution of the first-order ODE over dt (stable for any dt).
    temp = target + (st.temp_c - target) * math.exp(-dt / spec.tau_s)
    over = temp - spec.slowdown_c
    # The GPU reads whole degrees; slowdown engages once the reading reaches the threshold.
    throttled = round(temp) >= spec.slowdown_c
    hw_slowdown = round(temp) >= spec.hw_slowdown_c
    want: float
    if hw_slowdown:
        want = spec.sm_clock_min_mhz                 # HW slowdown: the clock falls to its floor at once
    elif throttled:
        want = spec.sm_clock_max_mhz * max(spec.sm_clock_min_mhz / spec.sm_clock_max_mhz,
                                           1.0 - spec.clock_drop_per_c * max(over, 0.5))
    else:
        want = spec.sm_clock_max_mhz
    # The controller moves the clock within about a second, not instantly.
    k = 1.0 - math.exp(-dt / 1.0)
    clock = st.clock_mhz + (want - st.clock_mhz) * k
    return ThermalState(temp_c=temp, clock_mhz=clock, power_w=power, busy=busy,
                        sw_thermal_us=st.sw_thermal_us + (int(dt * 1e6) if throttled else 0), throttled=throttled,
                        hw_thermal_us=st.hw_thermal_us + (int(dt * 1e6) if hw_slowdown else 0),
                        hw_slowdown=hw_slowdown)


class NodeRunaway(Protocol):
    """What a node calls of a runaway under way on it (sim/runaway.Runaway) on each update."""

    @property
    def over(self) -> bool: ...

    def before(self, node: SimNode, dt_sim: float) -> None: ...

    def after(self, node: SimNode) -> None: ...


class NodeSilence(Protocol):
    """What a node calls of its silence once it froze, powered off or lost its link (sim/runaway.Silence)."""

    def tend(self) -> None: ...

    def end(self) -> None: ...


class SimNode:
    """One simulated GB10. `start()` lays out the directory and begins updating it; `stop()` ends that."""

    def __init__(self, name: str, address: str, root: Path, *, speed: float = 1.0, spec: GB10Spec = GB10,
                 tuning: NodeTuning | None = None, update_interval: float = 0.25, load_speedup: float = 1.0,
                 owner_pid: int | None = None, keepalive_s: float | None = None) -> None:
        self.name = name
        self.address = address
        self.dir = Path(root) / name
        self.speed = float(speed)
        self.spec = spec
        self.tuning = tuning or NodeTuning.hardened()
        self.update_interval = update_interval
        self.load_speedup = load_speedup
        self.owner_pid = owner_pid or os.getpid()
        self.uuid = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"sim.{name}.{address}"))
        self.thermal = ThermalState(temp_c=spec.ambient_c + spec.idle_power_w * spec.r_c_per_w,
                                    clock_mhz=spec.sm_clock_max_mhz)
        self.reserved_b = 0
        self.available_kb = 0                      # MemAvailable as last written
        self.swap_used_kb = 0                      # swap the kernel has used (only a memory runaway gets there)
        self.runaway: NodeRunaway | None = None    # a sim/runaway.Runaway under way on this node
        self.silence: NodeSilence | None = None    # a sim/runaway.Silence once it froze, powered off or lost its link
        self.keepalive_s = KEEPALIVE_S if keepalive_s is None else keepalive_s
        self._task: asyncio.Task[None] | None = None
        self._last = time.monotonic()

    # ---- paths -------------------------------------------------------------------------------------
    @property
    def gpu_json(self) -> Path:
        return self.dir / "gpu.json"

    @property
    def proc_root(self) -> Path:
        return containers.proc_root(self.dir)

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def cgroup_root(self) -> Path:
        return containers.cgroup_root(self.dir)

    def agent_args(self) -> tuple[str, ...]:
        return ("--gpu-source", f"sim:{self.gpu_json}", "--proc-root", str(self.proc_root), "--containers", "docker",
                "--cgroup-root", str(self.cgroup_root))

    def env(self) -> tuple[tuple[str, str], ...]:
        return (("PATH", f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"),)

    # ---- lifecycle ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the directory tree and write the first readings (no task needed)."""
        for sub in ("proc/sys/vm", "proc/pressure", "bin", "containers", "load", "sys/fs/cgroup"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / "sim.json", json.dumps({
            "name": self.name, "address": self.address, "speed": self.speed, "owner_pid": self.owner_pid,
            "load_speedup": self.load_speedup, "hw": self.spec.name, "simulated": True}))
        self._write_guards()
        install(self.dir)
        self.update(0.0)

    async def start(self) -> None:
        self.prepare()
        self._last = time.monotonic()
        self._task = asyncio.create_task(self._run(), name=f"simnode-{self.name}")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.silence is not None:
            self.silence.end()      # its agents are blocked on reads nobody will answer: end them

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.update_interval)
            now = time.monotonic()
            dt, self._last = now - self._last, now
            try:
                if self.silence is not None:
                    self.silence.tend()
                else:
                    self.update(dt * self.speed)
            except OSError:
                pass    # the directory is being removed at shutdown

    # ---- one update --------------------------------------------------------------------------------
    def update(self, dt_sim: float) -> None:
        if self.silence is not None:
            return
        runaway = self.runaway if self.runaway is not None and not self.runaway.over else None
        if runaway is not None:
            runaway.before(self, dt_sim)         # e.g. the leak published as the container's memory
        loads = read_loads(self.dir)
        busy = min(1.0, sum(ld.gpu_busy for ld in loads))
        compute = min(busy, sum(ld.compute_frac for ld in loads))
        loaded = any(ld.loaded for ld in loads)
        self.reserved_b = sum(ld.reserved_b + ld.cpu_b for ld in loads)
        self._write_processes(loads)
        if dt_sim > 0:
            self.thermal = thermal_step(self.spec, self.thermal, busy, loaded, dt_sim, compute)
        else:
            self.thermal = ThermalState(**{**self.thermal.__dict__, "busy": busy})
        self._write_gpu(loads)
        self._write_meminfo()
        if runaway is not None:
            runaway.after(self)                  # exhausted, at shutdown, cut: the node is silenced

    def _write_gpu(self, loads: Sequence[Load] = ()) -> None:
        t, s = self.thermal, self.spec
        from ..nodes.samples import REASON_BITS
        reasons = []
        if t.busy <= 0.001:
            reasons.append("idle")
        if t.throttled:
            reasons.append("sw_thermal")
        if t.hw_slowdown:
            reasons += ["hw_slowdown", "hw_thermal"]
        mask = 0
        for r in reasons:
            mask |= REASON_BITS[r]
        gpu = {
            "index": 0, "name": s.name, "uuid": self.uuid,
            "temp_c": round(t.temp_c), "slowdown_c": s.slowdown_c, "shutdown_c": s.shutdown_c, "gpu_max_c": s.gpu_max_c,
            "reasons_mask": mask, "reasons": reasons,
            "reason_us": {"sw_thermal": t.sw_thermal_us, "hw_thermal": t.hw_thermal_us, "sw_power_cap": 0,
                          "hw_power_brake": 0},
            # GB10: power reads, but there is no power cap ("N/A") and no framebuffer memory ("Not Supported").
            "power_w": round(t.power_w if t.power_w else s.idle_power_w, 1),
            "sm_clock_mhz": round(t.clock_mhz), "sm_clock_max_mhz": s.sm_clock_max_mhz,
            "util_pct": round(t.busy * 100), "mem_util_pct": 0, "unified": True,
        }
        hello = {"hostname": self.name, "driver": s.driver, "kernel": s.kernel,
                 "gpus": [{"index": 0, "name": s.name, "uuid": self.uuid}]}
        # NVML's per-process list, as a GB10 answers it (Syllo/nvtop pull request 511): each process's GPU memory
        used: dict[int, int] = {}
        for ld in loads:
            if ld.reserved_b > 0 and ld.pid > 0:
                used[ld.pid] = used.get(ld.pid, 0) + ld.reserved_b
        procs = [{"gpu": 0, "pid": pid, "used_b": b} for pid, b in sorted(used.items())]
        write_atomic(self.gpu_json, json.dumps({"gpus": [gpu], "hello": hello, "procs": procs}))

    def _write_meminfo(self) -> None:
        s, tn = self.spec, self.tuning
        total = s.mem_total_kb
        reserved_kb = self.reserved_b // KIB
        cached = s.page_cache_kb
        used = s.os_used_kb + reserved_kb
        free = max(64 * 1024, total - used - cached)
        # The kernel keeps part of the free reserve (its low watermark) out of MemAvailable.
        available = max(32 * 1024, total - used - tn_min_free(tn, total) // 2)
        swap_free = max(0, tn.swap_kb - self.swap_used_kb)
        lines = {
            "MemTotal": total, "MemFree": free, "MemAvailable": min(available, total), "Buffers": 81920,
            "Cached": cached, "SwapCached": 0, "Active": used // 2, "Inactive": cached,
            "Shmem": 262144, "SwapTotal": tn.swap_kb, "SwapFree": swap_free, "Dirty": 128, "Writeback": 0,
            "AnonPages": used, "Mapped": 524288, "Slab": 1048576, "SReclaimable": 524288, "SUnreclaim": 524288,
            "KernelStack": 32768, "PageTables": 65536, "CommitLimit": total // 2 + tn.swap_kb,
            "Committed_AS": used + 2 * 1048576, "VmallocTotal": 135288315904, "HugePages_Total": 0,
            "Hugepagesize": 2048,
        }
        text = "".join(f"{k + ':':<16}{v:>12}" + ("" if k.startswith("HugePages_") else " kB") + "\n"
                       for k, v in lines.items())
        write_atomic(self.proc_root / "meminfo", text)
        self.available_kb = lines["MemAvailable"]
        avail_frac = available / total
        # Reclaim stalls begin when free memory nears the reserve: PSI 'some' rises first, then 'full'.
        some = 0.0 if avail_frac > 0.06 else round(min(100.0, (0.06 - avail_frac) * 1500), 2)
        full = round(some * 0.4, 2)
        write_atomic(self.proc_root / "pressure" / "memory",
                     f"some avg10={some:.2f} avg60={some:.2f} avg300={some:.2f} total=0\n"
                     f"full avg10={full:.2f} avg60={full:.2f} avg300={full:.2f} total=0\n")

    def _write_processes(self, loads: Sequence[Load]) -> None:
        """Each process holding GPU memory as the agent finds it: /proc/PID/cgroup (its container's Docker scope, or
        a host session) and comm; each running container's cgroup, charged its processes' CPU side and page tables
        against its cap. Entries of what ended are removed."""
        conts = {}
        for path in (self.dir / "containers").glob("*/container.json"):
            rec = read_json(path)
            if isinstance(rec, dict) and rec.get("state") == "running" and rec.get("id"):
                pids = [p for p in [rec.get("pid"), *(rec.get("exec_pids") or [])] if isinstance(p, int) and p > 0]
                conts[rec["id"]] = (rec, pids)
        by_pid = {pid: cid for cid, (_, pids) in conts.items() for pid in pids}
        charged: dict[str, int] = {cid: 0 for cid in conts}
        keep = {str(EARLYOOM_PID)} if self.tuning.earlyoom else set()
        for ld in loads:
            if ld.pid <= 0 or (ld.pid == self.owner_pid and ld.reserved_b == 0):
                continue
            cid = by_pid.get(ld.pid)
            if cid is not None:
                charged[cid] += ld.charged_b
            keep.add(containers.write_proc_entry(self.proc_root, ld.pid, conts[cid][0] if cid else None, cid))
        for cid, (rec, pids) in conts.items():
            containers.write_cgroup_scope(self.cgroup_root, cid, rec, charged[cid])
            for pid in pids:                  # the container's init too (the agent finds its cgroup through it)
                keep.add(containers.write_proc_entry(self.proc_root, pid, rec, cid))
        for pdir in self.proc_root.iterdir():
            if pdir.name.isdigit() and pdir.name not in keep:
                shutil.rmtree(pdir, ignore_errors=True)
        scopes = self.cgroup_root / "system.slice"
        if scopes.is_dir():
            for d in scopes.glob("docker-*.scope"):
                if d.name[len("docker-"):-len(".scope")] not in conts:
                    shutil.rmtree(d, ignore_errors=True)

    def _write_guards(self) -> None:
        tn = self.tuning
        swaps = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
        if tn.swap_kb:
            swaps += f"/swap.img                               file\t\t{tn.swap_kb}\t0\t\t-2\n"
        write_atomic(self.proc_root / "swaps", swaps)
        vm = self.proc_root / "sys" / "vm"
        write_atomic(vm / "overcommit_memory", f"{tn.overcommit_memory}\n")
        write_atomic(vm / "min_free_kbytes", f"{tn_min_free(tn, self.spec.mem_total_kb)}\n")
        write_atomic(vm / "swappiness", f"{tn.swappiness}\n")
        write_atomic(vm / "drop_caches", "0\n")
        # earlyoom, as the guard check's fix configures it, on a hardened node: its systemd unit's cgroup names it
        unit = self.cgroup_root / "system.slice" / "earlyoom.service"
        pdir = self.proc_root / str(EARLYOOM_PID)
        if tn.earlyoom:
            from ..nodes.guard import EARLYOOM_ARGS
            unit.mkdir(parents=True, exist_ok=True)
            write_atomic(unit / "cgroup.procs", f"{EARLYOOM_PID}\n")
            pdir.mkdir(parents=True, exist_ok=True)
            write_atomic(pdir / "comm", "earlyoom\n")
            import shlex
            write_atomic(pdir / "cmdline", "\0".join(["/usr/bin/earlyoom", *shlex.split(EARLYOOM_ARGS)]) + "\0")
        else:
            shutil.rmtree(unit, ignore_errors=True)
            shutil.rmtree(pdir, ignore_errors=True)

    # ---- for tests and the demo --------------------------------------------------------------------
    def set_tuning(self, tuning: NodeTuning) -> None:
        self.tuning = tuning
        self._write_guards()


def tn_min_free(tn: NodeTuning, mem_total_kb: int) -> int:
    return tn.min_free_kbytes if tn.min_free_kbytes is not None else default_min_free_kbytes(mem_total_kb)
