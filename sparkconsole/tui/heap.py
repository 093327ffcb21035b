"""When Python's cycle collector may pause the console.

A full collection walks every object the process holds: the imported modules, Textual's widgets and caches and the
node histories — 180k objects at start-up and as many again once 32 nodes' histories fill, 100–140 ms of CPU per
pass on this project's 2-core machine, landing on whatever key was pressed. Left to itself, Python runs one every
few seconds at 32 nodes × 2 Hz: Textual drops thousands of render strips a second that sit in reference cycles, and
only a collection frees them (docs/PERFORMANCE.md §4).

So the console decides when:
- the youngest generation is collected every YOUNG_THRESHOLD allocations (Python's default is 700): a frame's
  short-lived objects die before a pass sees them instead of being promoted and walked again;
- the oldest generation is never collected automatically. Every SETTLE_S, once no key has been pressed for IDLE_S
  (or after MAX_DEFER_S whatever happens), it is collected and what survives is frozen (`gc.freeze`): the next pass
  walks only what is newer, tens of milliseconds;
- every COLLECT_S, again only while idle, everything is unfrozen and collected once, for cycles that died after being
  frozen (a removed panel, a closed screen).
"""

from __future__ import annotations

import gc
import time

TICK_S = 1.0            # how often the app asks
SETTLE_S = 5.0
IDLE_S = 0.3
MAX_DEFER_S = 60.0
COLLECT_S = 600.0
YOUNG_THRESHOLD = 10_000
NEVER = 1 << 30         # an older-generation threshold no count reaches


def hold() -> None:
    """No collection at all until HeapKeeper.start(). Called before the console's modules are imported: its
    start-up (imports, the dashboard's widgets, Textual's caches) makes ~180k objects that live as long as it does,
    and Python's default thresholds walk them again and again before the first frame (a full pass and a dozen middle
    ones, ~0.1 s of a 0.7 s start on this project's machine)."""
    gc.disable()


def unhold() -> None:
    """hold() undone where no console follows (Textual missing: the demo prints its status instead)."""
    gc.enable()


class HeapKeeper:
    def __init__(self, *, settle_s: float = SETTLE_S, idle_s: float = IDLE_S, max_defer_s: float = MAX_DEFER_S,
                 collect_s: float = COLLECT_S) -> None:
        self.settle_s, self.idle_s, self.max_defer_s, self.collect_s = settle_s, idle_s, max_defer_s, collect_s
        now = time.monotonic()
        self.last_input = self.last_settle = self.last_full = now
        self.settles = 0
        self.collected = 0          # unreachable objects the passes found
        self._saved_threshold: tuple[int, ...] | None = None

    def start(self) -> None:
        """Once the console's start-up objects exist: the thresholds, and everything so far out of view."""
        if self._saved_threshold is None:
            self._saved_threshold = gc.get_threshold()
            gc.set_threshold(YOUNG_THRESHOLD, self._saved_threshold[1], NEVER)
        gc.freeze()
        gc.enable()             # after hold(): what start-up left is frozen, not walked

    def touched(self) -> None:
        """A key or a click: the operator is waiting for the screen now."""
        self.last_input = time.monotonic()

    def tick(self) -> None:
        """Called every TICK_S: collect and settle when it is due and nobody is waiting (or it is overdue)."""
        now = time.monotonic()
        idle = now - self.last_input >= self.idle_s
        if idle and now - self.last_full >= self.collect_s:
            gc.unfreeze()
            self.collected += gc.collect()
            gc.freeze()
            self.last_full = self.last_settle = now
            self.settles += 1
        elif now - self.last_settle >= self.settle_s and (idle or now - self.last_settle >= self.max_defer_s):
            self.collected += gc.collect()
            gc.freeze()
            self.last_settle = now
            self.settles += 1

    def release(self) -> None:
        gc.unfreeze()
        gc.enable()
        if self._saved_threshold is not None:
            gc.set_threshold(*self._saved_threshold)
            self._saved_threshold = None
