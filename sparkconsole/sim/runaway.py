"""Runaways a simulated node goes through, so the demo shows them and the tests check each post-mortem verdict.
Everything here is SIMULATED; the console reads it through the real agent, as it would read a GB10.

    rw = sim.runaway("spark2", "memory")        # SimCluster.runaway: on one node while the cluster runs
    await rw.done.wait(); rw.outcome, rw.ended_at   # "frozen" | "averted" | "shutdown" | "cut", wall time

  memory   the vLLM process's GPU memory grows at an accelerating rate (exponential, over `duration_s` simulated
           seconds from what is free to nothing), as NVML's per-process figure; its container's cgroup sees only
           page tables, so its memory cap never fires (sim/node.py): MemAvailable falls, memory PSI rises, swap
           (where there is some) fills. At exhaustion the node FREEZES as a GB10 does (no OOM kill): nothing on it
           answers. Stopping the container first (the console's guard, on by default) takes the leak with it:
           "averted".
  thermal  the node's cooling fails: the GPU climbs past its slowdown temperature (sw_thermal, the clock drops),
           past HW slowdown (hw_slowdown + hw_thermal, the clock at its floor) to shutdown; the node powers off.
  link     the node's link is cut: it runs on, but nothing of it reaches the console and its endpoint stops
           answering; the other nodes stay reachable.

How a node that froze, powered off or lost its link looks to the console (`Silence`): the node stops writing,
and gpu.json, /proc/meminfo and /proc/pressure/memory become FIFOs nobody writes, so the real agent's next read
blocks — its stream HANGS (STALE), it does not end — and every reconnect blocks the same way before its hello.
The local transport has no SSH keepalive, so the node plays it: an agent silent for `keepalive_s` (SSH's
5 s × 3 by default) is killed, which ends its stream (DOWN), as the keepalive would drop the connection.
Its containers are stopped (SIGSTOP: connections to its endpoint hang). A node that powers off kills its
containers and its agent at once instead: the stream ENDS (DOWN without STALE), reconnects hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from .files import pid_alive, read_json
from .node import GIB, KIB, SimNode, write_load

KINDS = ("memory", "thermal", "link")
MEMORY_S = 60.0              # simulated seconds from the start of a memory runaway to exhaustion
THERMAL_S = 40.0             # simulated seconds from the start of a cooling failure to shutdown
GROWTH_K = 2.0               # memory: leak(x) ∝ e^(K·x) − 1 over x = elapsed / duration (the rate grows e^K-fold)
HEAT_K = 1.5                 # thermal: the temperature's rise, the same shape
FREEZE_AVAIL_KB = (512 << 20) // KIB   # MemAvailable at which the node freezes (the kernel stalls before 0)
SWAP_FROM_FRAC = 0.10        # a node with swap starts using it when MemAvailable falls under this share of MemTotal
HOLD_S = 1.0                 # real seconds a node stays exhausted / at shutdown before it goes (the agent reads it)
REAP_EVERY_S = 0.5           # how often a silent node looks for agents to drop


def _curve(x: float, k: float) -> float:
    """0 at x=0, 1 at x=1, steeper and steeper (and on past 1)."""
    return (math.exp(k * x) - 1.0) / (math.exp(k) - 1.0)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)          # containers run in sessions of their own (containers.spawn)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def container_pids(node: SimNode) -> list[int]:
    """The processes of the node's running containers (never this process: it owns every node)."""
    pids = []
    for path in sorted((node.dir / "containers").glob("*/container.json")):
        rec = read_json(path)
        if isinstance(rec, dict) and rec.get("state") == "running":
            pids += [p for p in [rec.get("pid"), *(rec.get("exec_pids") or [])] if isinstance(p, int) and p > 0]
    return [p for p in pids if p not in (os.getpid(), node.owner_pid)]


def container_pid(node: SimNode, name: str) -> int | None:
    rec = read_json(node.dir / "containers" / name / "container.json")
    if isinstance(rec, dict) and rec.get("state") == "running" and pid_alive(rec.get("pid")):
        return int(rec["pid"])
    return None


class Silence:
    """A node that no longer answers (see the module's docstring). `tend()` runs in the node's loop."""

    def __init__(self, node: SimNode, why: str, *, power_off: bool) -> None:
        self.node = node
        self.why = why
        self.power_off = power_off
        self.at = time.time()
        self.dropped = 0             # agents ended (keepalive drops, or the power going)
        self._next = 0.0
        for f in (node.gpu_json, node.proc_root / "meminfo", node.proc_root / "pressure" / "memory"):
            tmp = f.with_name(f".{f.name}.fifo")
            tmp.unlink(missing_ok=True)
            os.mkfifo(tmp)
            os.replace(tmp, f)
        for pid in container_pids(node):
            _signal_group(pid, signal.SIGKILL if power_off else signal.SIGSTOP)
        if power_off:
            self._drop(0.0)

    def agents(self) -> list[Any]:
        """The real agents reading this node (their command line names its gpu.json)."""
        import psutil
        mark = f"sim:{self.node.gpu_json}"
        found = []
        for p in psutil.process_iter(["cmdline", "create_time"]):
            try:
                if mark in (p.info["cmdline"] or []) and p.pid != os.getpid():
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def _drop(self, after_s: float) -> None:
        now = time.time()
        for p in self.agents():
            if now - max(p.info["create_time"] or 0.0, self.at) >= after_s:
                _signal_group(p.pid, signal.SIGKILL)
                self.dropped += 1

    def tend(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + REAP_EVERY_S
            self._drop(self.node.keepalive_s)

    def end(self) -> None:
        """The cluster is stopping: no agent stays blocked on a read nobody will answer."""
        self._drop(0.0)


class Runaway:
    """One runaway on one node. SimNode.update calls before() and after() on each update (simulated seconds)."""

    kind = ""

    def __init__(self, node: str, *, duration_s: float, say: Callable[[str], None] | None = None) -> None:
        if not duration_s > 0:
            raise ValueError(f"duration_s must be positive, got {duration_s}")
        self.node = node
        self.duration_s = float(duration_s)
        self.elapsed_s = 0.0
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.outcome: str | None = None
        self.notes: list[tuple[float, str]] = []
        self.done = asyncio.Event()
        self._say = say
        self._hold_until: float | None = None

    @property
    def over(self) -> bool:
        return self.outcome is not None

    def note(self, text: str) -> None:
        self.notes.append((time.time(), text))
        if self._say is not None:
            with contextlib.suppress(Exception):  # a listener's failure must not stop the node
                self._say(text)

    def before(self, node: SimNode, dt_sim: float) -> None:
        self.elapsed_s += dt_sim

    def after(self, node: SimNode) -> None:
        pass

    def _held(self) -> bool:
        """True once the node has stayed HOLD_S in its last state (starts the hold on the first call)."""
        now = time.monotonic()
        if self._hold_until is None:
            self._hold_until = now + HOLD_S
        return now >= self._hold_until

    def _end(self, node: SimNode, outcome: str, text: str, *, silence: bool = True, power_off: bool = False) -> None:
        if silence:
            node.silence = Silence(node, f"{self.kind} runaway: {outcome}", power_off=power_off)
        self.outcome = outcome
        self.ended_at = time.time()
        self.note(text)
        self.done.set()


class MemoryRunaway(Runaway):
    kind = "memory"

    def __init__(self, node: str, *, duration_s: float = MEMORY_S, container: str = "vllm_node",
                 say: Callable[[str], None] | None = None) -> None:
        super().__init__(node, duration_s=duration_s, say=say)
        self.container = container
        self.pid: int | None = None          # the container whose memory grows (None: a process of the node's own)
        self.leak_kb = 0.0
        self._span_kb: float | None = None

    def before(self, node: SimNode, dt_sim: float) -> None:
        super().before(node, dt_sim)
        if self._span_kb is None:
            # From what is free now to past the freeze, in duration_s.
            self._span_kb = max(node.available_kb - FREEZE_AVAIL_KB + (256 << 20) // KIB, GIB // KIB)
            self.pid = container_pid(node, self.container)
            who = f"the {self.container} container's memory" if self.pid else "a process's memory"
            self.note(f"{self.node}: memory runaway — {who} grows faster and faster; "
                      f"{node.available_kb / (GIB // KIB):.0f} GiB free (SIMULATED)")
        if self.pid is not None and not pid_alive(self.pid):
            # The container was stopped (the console's guard, or an operator): the leak went with it.
            node.swap_used_kb = 0
            self._end(node, "averted", f"{self.node}: {self.container} stopped, its memory freed: the node is "
                                       "safe (SIMULATED)", silence=False)
            return
        self.leak_kb = self._span_kb * _curve(self.elapsed_s / self.duration_s, GROWTH_K)
        write_load(node.dir, f"{self.container}-runaway", pid=self.pid or node.owner_pid,
                   reserved_b=int(self.leak_kb * KIB), gpu_busy=0.0, loaded=False, phase="runaway")

    def after(self, node: SimNode) -> None:
        total = node.spec.mem_total_kb
        if node.tuning.swap_kb:
            frac = node.available_kb / total
            node.swap_used_kb = int(node.tuning.swap_kb * min(1.0, max(0.0, (SWAP_FROM_FRAC - frac) / SWAP_FROM_FRAC)))
        if node.available_kb <= FREEZE_AVAIL_KB and self._held():
            self._end(node, "frozen", f"{self.node}: unified memory exhausted — the node froze: no agent, no "
                                      "endpoint, no SSH until a power cycle (SIMULATED)")


class ThermalRunaway(Runaway):
    kind = "thermal"

    def __init__(self, node: str, *, duration_s: float = THERMAL_S, say: Callable[[str], None] | None = None) -> None:
        super().__init__(node, duration_s=duration_s, say=say)
        self.start_c: float | None = None
        self._said: set[str] = set()

    def before(self, node: SimNode, dt_sim: float) -> None:
        super().before(node, dt_sim)
        spec = node.spec
        if self.start_c is None:
            self.start_c = node.thermal.temp_c
            self.note(f"{self.node}: cooling failure — the GPU heats whatever its clock does; "
                      f"{self.start_c:.0f} °C now, shutdown at {spec.shutdown_c:.0f} °C (SIMULATED)")
        top = spec.shutdown_c + 1.0       # where it stays until the node goes (HOLD_S)
        floor = min(top, self.start_c + (top - self.start_c) * _curve(self.elapsed_s / self.duration_s, HEAT_K))
        if node.thermal.temp_c < floor:
            node.thermal = dataclasses.replace(node.thermal, temp_c=floor)

    def after(self, node: SimNode) -> None:
        t, spec = node.thermal, node.spec
        for name, hot, text in (("sw", t.throttled, f"SW thermal slowdown at {spec.slowdown_c:.0f} °C"),
                                ("hw", t.hw_slowdown, f"HW slowdown at {spec.hw_slowdown_c:.0f} °C, clock at its floor")):
            if hot and name not in self._said:
                self._said.add(name)
                self.note(f"{self.node}: GPU {t.temp_c:.0f} °C — {text} (SIMULATED)")
        if round(t.temp_c) >= spec.shutdown_c and self._held():
            self._end(node, "shutdown", f"{self.node}: GPU reached {t.temp_c:.0f} °C — thermal shutdown, the node "
                                        "powered off (SIMULATED)", power_off=True)


class LinkCut(Runaway):
    kind = "link"

    def __init__(self, node: str, *, duration_s: float = 1.0, say: Callable[[str], None] | None = None) -> None:
        super().__init__(node, duration_s=duration_s, say=say)

    def after(self, node: SimNode) -> None:
        self._end(node, "cut", f"{self.node}: link cut — the node runs on, unreachable: its agent's stream hangs, "
                               "its endpoint stops answering (SIMULATED)")


def make(kind: str, node: str, *, duration_s: float | None = None, container: str = "vllm_node",
         say: Callable[[str], None] | None = None) -> Runaway:
    opts = {} if duration_s is None else {"duration_s": duration_s}
    if kind == "memory":
        return MemoryRunaway(node, container=container, say=say, **opts)
    if kind == "thermal":
        return ThermalRunaway(node, say=say, **opts)
    if kind == "link":
        return LinkCut(node, say=say, **opts)
    raise ValueError(f"unknown runaway {kind!r}: one of {', '.join(KINDS)}")
