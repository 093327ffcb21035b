"""Load-balancing policies of the routers in front of several engines (LiteLLM, vllm-router).

Used by the headless experiment (sim/experiment.py) and by the simulated HTTP router alike:
`policy.choose(backends_inflight)` returns the index of the backend for the next request, given the
in-flight counts *as the router currently sees them*.

LiteLLM's least-busy keeps its in-flight counts in its router cache: a request is counted by a
pre-call hook that runs after the routing decision (and after an await or two), and uncounted by the
success callback when its stream ends. Requests arriving within that lag of each other all see the
same stale counts and go to the same backend (ties go to the first).

The headless experiment gets that lateness from its model of the proxy's event loop (routing and the
counting hook queue behind each other; experiment.ProxyProfile), so it uses a tracker with no lag.
A router that does not model its event loop can use `make_tracker("least-busy", n)`: the same
lateness as a fixed lag, and feed `tracker.view(now)` to the policy instead of the true counts.
"""

from __future__ import annotations

import abc
import heapq
import random
from collections.abc import Sequence

from sparkconsole.errors import UserError

# LiteLLM least-busy as a fixed lag: time from the routing decision until the pre-call hook's increment
# is visible. Not fitted directly: with the fitted proxy (2 ms routing + 2 ms counting per request on one
# event loop) a c16-c64 burst is routed over ~30-130 ms before its counts settle; 50 ms is in that range.
LEAST_BUSY_UPDATE_LAG_S = 0.05
# ... and from the end of a stream until the success callback's decrement is visible.
LEAST_BUSY_RELEASE_LAG_S = 0.0


class RoutingPolicy(abc.ABC):
    name: str = ""

    @abc.abstractmethod
    def choose(self, backends_inflight: Sequence[int]) -> int:
        """Index of the backend for the next request."""


class SimpleShuffle(RoutingPolicy):
    """LiteLLM simple-shuffle: stateless weighted random (equal weights here)."""

    name = "simple-shuffle"

    def __init__(self, seed: int | None = None, weights: Sequence[float] | None = None) -> None:
        self._rng = random.Random(seed)
        self._weights = list(weights) if weights else None

    def choose(self, backends_inflight: Sequence[int]) -> int:
        n = len(backends_inflight)
        if n == 0:
            raise ValueError("no backends to choose from")
        if self._weights:
            return self._rng.choices(range(n), weights=self._weights[:n])[0]
        return self._rng.randrange(n)


class LeastBusy(RoutingPolicy):
    """LiteLLM least-busy: the backend with the fewest in-flight requests; ties go to the first listed."""

    name = "least-busy"

    def choose(self, backends_inflight: Sequence[int]) -> int:
        if not backends_inflight:
            raise ValueError("no backends to choose from")
        best = 0
        for i, count in enumerate(backends_inflight):
            if count < backends_inflight[best]:
                best = i
        return best


class RoundRobin(RoutingPolicy):
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, backends_inflight: Sequence[int]) -> int:
        n = len(backends_inflight)
        if n == 0:
            raise ValueError("no backends to choose from")
        i = self._next % n
        self._next = i + 1
        return i


POLICIES = ("simple-shuffle", "least-busy", "round-robin")


def make_policy(name: str, *, seed: int | None = None) -> RoutingPolicy:
    if name == "simple-shuffle":
        return SimpleShuffle(seed)
    if name == "least-busy":
        return LeastBusy()
    if name == "round-robin":
        return RoundRobin()
    raise UserError(f"unknown routing policy {name!r}", field="routing", fix="use one of " + ", ".join(POLICIES))


def make_tracker(name: str, backends: int) -> InflightTracker:
    """The in-flight view a router using policy `name` works from (late for LiteLLM least-busy)."""
    if name == "least-busy":
        return InflightTracker(backends, LEAST_BUSY_UPDATE_LAG_S, LEAST_BUSY_RELEASE_LAG_S)
    return InflightTracker(backends)


class InflightTracker:
    """In-flight counts per backend as a router sees them.

    `true` is what is really in flight; `view(now)` is what the router's cache says: a start is counted
    `update_lag_s` after the routing decision, a finish `release_lag_s` after the stream ended.
    """

    def __init__(self, backends: int, update_lag_s: float = 0.0, release_lag_s: float = 0.0) -> None:
        self.true = [0] * backends
        self._seen = [0] * backends
        self._pending: list[tuple[float, int, int, int]] = []   # (visible at, seq, backend, delta)
        self._seq = 0
        self.lag = update_lag_s
        self.release_lag = release_lag_s

    def _settle(self, now: float) -> None:
        while self._pending and self._pending[0][0] <= now:
            _, _, b, delta = heapq.heappop(self._pending)
            self._seen[b] += delta

    def _note(self, backend: int, delta: int, at: float) -> None:
        self._seq += 1
        heapq.heappush(self._pending, (at, self._seq, backend, delta))

    def view(self, now: float) -> list[int]:
        self._settle(now)
        return list(self._seen)

    def started(self, backend: int, now: float) -> None:
        self.true[backend] += 1
        self._note(backend, +1, now + self.lag)
        self._settle(now)

    def finished(self, backend: int, now: float) -> None:
        self.true[backend] -= 1
        self._note(backend, -1, now + self.release_lag)
        self._settle(now)
