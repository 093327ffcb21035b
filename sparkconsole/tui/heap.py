"""When Python's cycle collector may pause the console.

A full collection walks every object the process holds: the imported modules, Textual's widget caches and the
node histories (32 nodes × 600 ticks) — 180k objects at start-up and as many again once the histories fill, 140 ms
of CPU per pass on this project's 2-core machine, landing on whatever key was pressed (docs/PERFORMANCE.md §4).
Objects that have lived a minute are almost all long-lived (modules, widgets, history ticks, which are freed by
reference counting when their ring drops them, not by the collector), so every SETTLE_S they are moved out of its
view (`gc.freeze`) and the automatic passes only walk what is newer. Cycles that die after being frozen would be
kept, so every COLLECT_S a full pass runs over everything — only once no key has been pressed for IDLE_S, so the
pause lands where nobody waits for the screen.
"""

from __future__ import annotations

import gc
import time

SETTLE_S = 60.0
COLLECT_S = 600.0
IDLE_S = 5.0


class HeapKeeper:
    def __init__(self, *, settle_s: float = SETTLE_S, collect_s: float = COLLECT_S, idle_s: float = IDLE_S) -> None:
        self.settle_s, self.collect_s, self.idle_s = settle_s, collect_s, idle_s
        now = time.monotonic()
        self.last_input = now
        self.last_collect = now
        self.collected = 0          # unreachable objects the full passes found (what freezing alone would keep)

    def touched(self) -> None:
        """A key or a click: the operator is waiting for the screen now."""
        self.last_input = time.monotonic()

    def settle(self) -> None:
        """Called every settle_s (and once after start-up): freeze the survivors, or run the full pass if due."""
        now = time.monotonic()
        if now - self.last_collect >= self.collect_s and now - self.last_input >= self.idle_s:
            gc.unfreeze()
            self.collected += gc.collect()
            self.last_collect = now
        gc.freeze()

    def release(self) -> None:
        gc.unfreeze()
