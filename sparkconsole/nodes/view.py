"""What a node's panel shows, decided: its state and how long, the GPU's readings and their severities, the clock-event
reasons with how long each has been active, each OOM guard with its severity (severity.py), and the vLLM container's
row. Pure: the console's node panel (tui/widgets/node_panel.py) only formats a NodeView; anything else that wants
the same judgement (a text view, a test) reads it here.

A recorded moment (REPLAY) is judged at its own time: ages and the container's uptime are counted to the replayed
tick, not to the wall clock.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import severity
from ..config import Thresholds
from .samples import REASON_SEVERITY, REASON_WORDS, NodeState
from .thermal import reason_durations

# A clock-event reason's severity (samples.REASON_SEVERITY) as the colour every view draws it in.
REASON_COLOUR = {"bad": "bold red", "warn": "yellow", "dim": "dim", "info": "cyan"}
STATE_COLOUR = {"LIVE": "green", "REPLAY": "bold magenta", "CONNECTING": "yellow", "STALE": "bold yellow",
                "DOWN": "bold red"}
_REASON_ORDER = ("bad", "warn", "info", "dim")


def seconds_since(stamp: str | None, at: float) -> float | None:
    """Seconds from a Docker timestamp (RFC 3339, nanoseconds) to `at`; None when unreadable or never set."""
    if not stamp or stamp.startswith("0001-"):
        return None
    s = stamp.rstrip("Z")
    if "." in s:
        head, frac = s.split(".", 1)
        digits = "".join(ch for ch in frac if ch.isdigit())[:6]
        s = f"{head}.{digits}" if digits else head
    try:
        t = _dt.datetime.fromisoformat(s).replace(tzinfo=_dt.UTC)
    except ValueError:
        return None
    return at - t.timestamp()


@dataclass(frozen=True)
class StateView:
    label: str                    # LIVE | REPLAY | CONNECTING | STALE | DOWN
    colour: str
    for_s: float | None           # how long in this state (None while LIVE: the subtitle then stays still)
    error: str | None             # why DOWN
    last_tick_age_s: float | None  # a node that stopped ticking: since its last tick

    @property
    def stale(self) -> bool:
        return self.label in ("STALE", "DOWN")


@dataclass(frozen=True)
class Reason:
    word: str
    colour: str
    active_s: float | None


@dataclass(frozen=True)
class GpuView:
    temp_c: float | None
    temp_bad: bool                # within the temperature margin of its slowdown threshold
    slowdown_c: float | None
    margin_c: float | None
    shutdown_c: float | None
    count: int                    # GPUs on the node (the panel shows GPU 0)
    power_w: float | None
    power_limit_w: float | None
    sm_mhz: float | None
    sm_max_mhz: float | None
    util_pct: float | None
    reasons: tuple[Reason, ...] | None   # None: not read


@dataclass(frozen=True)
class ContainerView:
    name: str
    state: str | None
    state_colour: str
    health: str | None
    health_colour: str
    up_s: float | None            # running: since it started, at the moment shown
    restarts: int | None
    cap_b: int | None
    oom_killed: bool
    exit_code: int | None
    launch: str | None            # "recipe × topology role" of a launch's container


@dataclass(frozen=True)
class NodeView:
    state: StateView
    gpu_name: str | None
    simulated: bool
    gpu: GpuView | None
    no_gpu: str | None            # what the GPU row says without readings (waiting, or no source)
    gpu_error: str | None
    guards: tuple[tuple[Any, severity.Severity], ...]    # (GuardResult, its severity)
    container_name: str
    container: ContainerView | None   # None: not reported on the node
    at: float                     # the moment shown: now, or the replayed tick's time
    workloads: tuple[Any, ...] = ()       # WorkloadMemory of each running container, largest first
    loose: tuple[Any, ...] = ()           # GPU processes in no container
    read: bool = False                    # a tick has been read (else nothing is known of the workloads)


def node_view(nm: Any, guards: Sequence[Any], now: float, thresholds: Thresholds, *, replay: bool = False) -> NodeView:
    """A NodeMonitor's latest state, judged. `replay`: the node plays a recorded moment."""
    state = nm.state.value if isinstance(nm.state, NodeState) else str(nm.state)
    last = nm.last
    at = last.time if replay and last is not None else now
    label = "REPLAY" if state == "LIVE" and replay else state
    sv = StateView(label, STATE_COLOUR.get(label, ""), None if state == "LIVE" else now - nm.since,
                   (nm.last_error or None) if state == "DOWN" else None,
                   now - last.received if last is not None and state != "LIVE" else None)
    info = nm.info
    gpu = last.gpus[0] if last and last.gpus else None
    no_gpu = error = None
    if gpu is None:
        no_gpu = "waiting for the agent…" if last is None else \
            f"no GPU readings (source: {info.gpu_source if info and info.gpu_source else '?'})"
        error = last.errors[0][:80] if last is not None and last.errors else None
    from .workload_memory import host_gpu_processes, workload_memory
    works = tuple(sorted(workload_memory(last).values(), key=lambda w: -(w.total_b or 0))) if last else ()
    return NodeView(
        workloads=works, loose=tuple(host_gpu_processes(last)) if last else (), read=last is not None,
        state=sv, gpu_name=info.gpu_names[0] if info and info.gpu_names else None,
        simulated=bool(info and info.simulated), gpu=_gpu(nm, gpu, thresholds) if gpu is not None else None,
        no_gpu=no_gpu, gpu_error=error, guards=tuple((g, severity.of_guard(g)) for g in guards),
        container_name=nm.config.container if getattr(nm, "config", None) else "",
        container=_container(nm.containers, nm.config.container, at) if getattr(nm, "config", None) else None, at=at)


def _gpu(nm: Any, gpu: Any, thresholds: Thresholds) -> GpuView:
    last = nm.last
    margin = gpu.slowdown_margin_c
    reasons: tuple[Reason, ...] | None
    if gpu.reasons_mask is None and not gpu.reasons:
        reasons = None
    else:
        spans = reason_durations(nm.history, last) if gpu.reasons else {}
        ordered = sorted(gpu.reasons, key=lambda r: _REASON_ORDER.index(REASON_SEVERITY.get(r, "info")))
        reasons = tuple(Reason(REASON_WORDS.get(r, r), REASON_COLOUR.get(REASON_SEVERITY.get(r, ""), ""),
                               spans.get(r)) for r in ordered)
    return GpuView(gpu.temp_c, margin is not None and margin <= thresholds.temp_margin_c, gpu.slowdown_c, margin,
                   gpu.shutdown_c, len(last.gpus), gpu.power_w, gpu.power_limit_w, gpu.sm_clock_mhz,
                   gpu.sm_clock_max_mhz, gpu.util_pct, reasons)


def _container(containers: Sequence[Any], name: str, at: float) -> ContainerView | None:
    c = next((c for c in containers if c.name == name), None)
    if c is None:
        return None
    labels = dict(c.labels)
    launch = (f"{labels.get('sparkconsole.recipe', '?')} × {labels['sparkconsole.topology']} "
              f"{labels.get('sparkconsole.role', '')}") if labels.get("sparkconsole.topology") else None
    return ContainerView(
        c.name, c.state, "green" if c.state == "running" else "red", c.health,
        {"healthy": "green", "unhealthy": "red"}.get(c.health or "", "yellow"),
        seconds_since(c.started_at, at) if c.state == "running" else None, c.restart_count, c.memory_limit_b,
        bool(c.oom_killed), c.exit_code, launch)


def fix_wanted(guards: Sequence[Any]) -> Any | None:
    """The guard `f` (or Enter on a node) offers to fix: the worst with a fix, else the first not ok."""
    judged = [(severity.of_guard(g), g) for g in guards]
    with_fix = [(s, g) for s, g in judged if s.rank >= severity.WARN.rank and getattr(g, "fix", None)]
    if with_fix:
        return max(with_fix, key=lambda sg: sg[0].rank)[1]
    return next((g for s, g in judged if s is not severity.OK), None)
