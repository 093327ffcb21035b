"""Thermal facts read from the nodes' ticks: the hottest GPU with the clock-event reasons active across nodes (what a
benchmark level notes beside its figures), and how long each reason has been active on a node (what the node panel
shows). Below the TUI so the console and the headless `bench` commands compute them the same way."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .samples import Tick

# Clock-event reasons worth noting beside a benchmark figure: the power cap and every real throttle.
NOTED_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
# A node whose last tick is older than this says nothing about the level being measured now.
FRESH_TICK_S = 10.0


@dataclass(frozen=True)
class ThermalReading:
    max_temp_c: float | None
    throttle_reasons: tuple[str, ...]      # "node:reason", first seen first


def reading_from_ticks(ticks: Iterable[tuple[str, Tick | None]], now: float | None = None) -> ThermalReading | None:
    """(node name, last Tick) pairs -> the hottest GPU and 'node:reason' for each noted reason; None when no
    node has a fresh tick with anything to say."""
    now = time.time() if now is None else now
    temps: list[float] = []
    reasons: list[str] = []
    for name, tick in ticks:
        if tick is None or now - tick.received > FRESH_TICK_S:
            continue
        for g in tick.gpus:
            if g.temp_c is not None:
                temps.append(g.temp_c)
            reasons += [f"{name}:{r}" for r in g.reasons if r in NOTED_REASONS]
    if not temps and not reasons:
        return None
    return ThermalReading(max(temps) if temps else None, tuple(dict.fromkeys(reasons)))


class Watched(Protocol):
    """What `cluster_reading` reads of a node (nodes/monitor.NodeMonitor has both)."""

    @property
    def name(self) -> str: ...

    @property
    def last(self) -> Tick | None: ...


def cluster_reading(nodes: Iterable[Watched], now: float | None = None) -> ThermalReading | None:
    """The same from NodeMonitor objects (anything with `.name` and `.last`)."""
    return reading_from_ticks(((nm.name, nm.last) for nm in nodes), now)


def reason_of(noted: str) -> str:
    """'spark1:hw_slowdown' -> 'hw_slowdown' (a bare reason stays as it is)."""
    return noted.rpartition(":")[2]


def reason_durations(history: Sequence[Tick], last: Tick) -> dict[str, float]:
    """For each clock-event reason active on GPU 0 in `last`: seconds (agent clock) it has been active without a
    break, counted back through `history` (oldest first)."""
    if not last.gpus:
        return {}
    active = {r: last.time for r in last.gpus[0].reasons}
    pending = set(active)
    for tick in reversed(history):
        if not pending:
            break
        now = set(tick.gpus[0].reasons) if tick.gpus else set()
        for r in list(pending):
            if r in now:
                active[r] = tick.time
            else:
                pending.discard(r)
    return {r: last.time - t for r, t in active.items()}
