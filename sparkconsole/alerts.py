"""Alert rules over node samples and endpoint snapshots: raised once, kept while true, cleared when over.

Node rules (thresholds from the cluster file): GPU within temp_margin_c of its slowdown temperature; thermal
or power-brake throttling (samples.THROTTLING); MemAvailable under headroom_floor_gib; an OOM guard that is
bad; the vLLM container not running or OOM-killed; the node STALE or DOWN; the node rebooted (a new boot id after a reconnect).
Endpoint rules: unhealthy (warn on the first failed poll, bad from the second), but loading (info) while the
container serving there has not answered since it started, and not judged for UNSURE_S where the node lists its
containers (LoadWatch: a launch, a restart, a roll's every server); router backends down; the silent stall —
requests running but no token produced (neither generated nor prefilled) for stall_seconds while the GPU draws less
than stall_power_w.

observe_node/observe_endpoint return the events that observation caused (a raise, a severity change, or a
clear with active=False); subscribers get the same events. Nodes are duck-typed (.name, .state, .last,
.containers, optional .config.container), so recorded ticks can drive the rules without a live monitor.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .config import Thresholds
from .nodes.samples import REASON_WORDS, NodeState
from .subscribers import Subscribers
from .timefmt import duration

# Hysteresis: a temperature alert clears only this far below its raise point, memory this far above the floor,
# so a reading that wobbles on the line does not raise and clear every tick.
TEMP_HYSTERESIS_C = 2.0
HEADROOM_HYSTERESIS_GIB = 0.5


@dataclass(frozen=True)
class Alert:
    key: str            # stable identity: "node:spark1:temp:gpu0", "endpoint:router:down", …
    severity: str       # info | warn | bad
    source: str         # node or endpoint name
    message: str        # one line
    time: float         # when raised (active) or cleared (inactive)
    active: bool

    @property
    def body(self) -> str:
        """The message without its source's name in front ("spark1 unhealthy: …", "router: 1 of 2 backends down",
        "cleared: router: …"), for a line or a toast that names the source beside it. The message keeps the name:
        a notification carries it alone."""
        cleared = "cleared: " if self.message.startswith("cleared: ") else ""
        rest = self.message[len(cleared):]
        for head in (self.source + ": ", self.source + " "):
            if rest.startswith(head):
                return cleared + rest[len(head):]
        return self.message


@dataclass
class _StallClock:
    tokens: float | None = None
    since: float | None = None       # when tokens last moved (or work started)


# A server that has not answered since its container started is loading its model, not down: a 120B model loads in
# minutes on a GB10 (seed 004: about seven with its warm-up). Past this, the launch's own wait for it, it is down.
LOAD_GRACE_S = 1800.0
# How long a server that stops answering, on a node that lists its containers, goes unjudged: a restart's stop
# (docker's 10 s before it kills) and the agent's next list of containers (every 5 s), which shows the new start.
UNSURE_S = 20.0


class LoadWatch:
    """Which endpoints are loading their model: the container that serves there started at a moment (docker's
    StartedAt, as its node reports it) the endpoint has not answered since, less than LOAD_GRACE_S ago on the node's
    own clock. A launch, a restart and a roll's every server then read "loading" (info, never sent) rather than
    unhealthy (a page per server for minutes). StartedAt is compared with itself only: no clock between node and
    console enters."""

    def __init__(self) -> None:
        self._answered: dict[str, str] = {}       # endpoint -> the StartedAt of the container that last answered
        self._down_since: dict[str, float] = {}   # endpoint -> the console's time of its first refused poll

    def unsure(self, name: str, healthy: bool | None, now: float, listed_rx: float | None) -> bool:
        """True while an endpoint has refused for less than UNSURE_S on a node that lists its containers
        (`listed_rx`: when its last list came; None, it lists none): a restart stops it first and is listed
        with its new start only later, so its refusals would otherwise read unhealthy (BAD from the second) for
        a restart that then reads loading."""
        if healthy is None or healthy:
            self._down_since.pop(name, None)
            return False
        since = self._down_since.setdefault(name, now)
        return listed_rx is not None and now - since < UNSURE_S

    def loading_s(self, name: str, healthy: bool | None, started_at: str | None, age_s: float | None) -> float | None:
        """Seconds the endpoint's container has been loading; None when it is not loading (it answered since
        its start, it is past the grace, or nothing says when it started)."""
        if started_at is None or age_s is None:
            return None
        if healthy:
            self._answered[name] = started_at
            return None
        if self._answered.get(name) == started_at or age_s >= LOAD_GRACE_S:
            return None
        return max(0.0, age_s)


class AlertEngine:
    def __init__(self, thresholds: Thresholds, *, clock: Callable[[], float] = time.time, history: int = 500) -> None:
        self.thresholds = thresholds
        self.clock = clock
        self.active: dict[str, Alert] = {}
        self.history: deque[Alert] = deque(maxlen=history)   # raise and clear events, newest last
        self._subs: Subscribers[Alert] = Subscribers("alert")
        self._stall: dict[str, _StallClock] = {}

    def subscribe(self, cb: Callable[[Alert], None]) -> Callable[[], None]:
        """cb(alert) for every raise, severity change and clear (active=False); returns unsubscribe."""
        return self._subs.add(cb)

    # --- bookkeeping ----------------------------------------------------------------------------------------
    def _settle(self, prefix: str, source: str, now: float, found: dict[str, tuple[str, str]],
                hold: Callable[[str], bool] = lambda key: False) -> list[Alert]:
        """Make the active set under `prefix` equal `found` ({key: (severity, message)}); return the changes.
        Keys for which hold(key) is true are left as they are (their data is not trustworthy right now)."""
        events: list[Alert] = []
        for key, (sev, msg) in found.items():
            cur = self.active.get(key)
            if cur is not None and cur.severity == sev:
                continue          # still true: raised once, not again
            alert = Alert(key, sev, source, msg, now, True)
            self.active[key] = alert
            events.append(alert)
        for key in [k for k in self.active if k.startswith(prefix) and k not in found and not hold(k)]:
            old = self.active.pop(key)
            events.append(Alert(key, old.severity, source, f"cleared: {old.message}", now, False))
        for e in events:
            self.history.append(e)
            self._subs.notify(e)
        return events

    def for_source(self, source: str) -> list[Alert]:
        return [a for a in self.active.values() if a.source == source]

    # --- nodes ----------------------------------------------------------------------------------------------
    def observe_launches(self, groups: Sequence[Any]) -> list[Alert]:
        """Multi-node launches (nodes/launches.py groups): a member down while the others run is one alert for
        the whole launch — a tensor-parallel head keeps running without its worker and would otherwise stall
        silently. `groups` are every labelled launch seen now; launches no longer seen clear."""
        found = {f"launch:{g.key}": ("bad", f"{g.recipe} × {g.topology} BROKEN: {g.reason}")
                 for g in groups if g.verdict == "BROKEN"}
        return self._settle("launch:", "launches", self.clock(), found)

    def observe_node(self, node: Any, guards: Sequence[Any] | None = ()) -> list[Alert]:
        name = str(node.name)
        prefix = f"node:{name}:"
        now = self.clock()
        found: dict[str, tuple[str, str]] = {}
        state = getattr(node, "state", None)
        state = state.value if isinstance(state, NodeState) else (str(state) if state is not None else None)
        if state == NodeState.CONNECTING.value:
            return []     # (re)connecting: nothing new is known; whatever is active stays as it is
        if state == NodeState.DOWN.value:
            err = getattr(node, "last_error", None)
            found[prefix + "state"] = ("bad", f"{name} DOWN" + (f": {err}" if err else ""))
        elif state == NodeState.STALE.value:
            found[prefix + "state"] = ("warn", f"{name} STALE: no samples for 3 ticks")
        if state in (NodeState.DOWN.value, NodeState.STALE.value):
            # The last samples are old: keep their alerts as they are until fresh data says otherwise.
            return self._settle(prefix, name, now, found, hold=lambda k: k != prefix + "state")

        reboots = getattr(node, "reboots", 0)
        if isinstance(reboots, int) and reboots > 0:
            # A new boot id after reconnecting: whatever ran there (containers, caches) started over unseen.
            found[prefix + "reboot"] = ("warn", f"{name} rebooted while watched (new boot id, {reboots}×): "
                                                "check its containers and the OOM guards")

        tick = getattr(node, "last", None)
        if tick is not None:
            self._gpu_findings(prefix, name, tick.gpus, found)
            self._headroom_finding(prefix, name, tick.mem, found)
        for r in guards or ():
            if getattr(r, "status", None) == "bad":
                found[f"{prefix}guard:{r.key}"] = ("bad", f"{name} {r.title}: {r.reason}")
        self._container_findings(prefix, name, node, found)
        return self._settle(prefix, name, now, found)

    def _gpu_findings(self, prefix: str, name: str, gpus: Sequence[Any], found: dict[str, tuple[str, str]]) -> None:
        """Each GPU's temperature against its slowdown temperature, and its throttling in words."""
        t = self.thresholds
        for g in gpus:
            gkey = f"{prefix}temp:gpu{g.index}"
            margin = g.slowdown_margin_c
            if margin is not None:
                limit = t.temp_margin_c + (TEMP_HYSTERESIS_C if gkey in self.active else 0.0)
                if margin <= 0:
                    found[gkey] = ("bad", f"{name} GPU{g.index} at {g.temp_c:g} °C: at or past its slowdown "
                                          f"temperature {g.slowdown_c:g} °C")
                elif margin <= limit:
                    found[gkey] = ("warn", f"{name} GPU{g.index} at {g.temp_c:g} °C: {margin:g} °C from its "
                                           f"slowdown temperature {g.slowdown_c:g} °C")
            throttling = g.throttling
            if throttling:
                words = ", ".join(REASON_WORDS.get(r, r) for r in throttling)
                found[f"{prefix}throttle:gpu{g.index}"] = ("bad", f"{name} GPU{g.index} throttling: {words}")

    def _headroom_finding(self, prefix: str, name: str, mem: Any, found: dict[str, tuple[str, str]]) -> None:
        """Unified memory's headroom under its floor (with hysteresis once raised)."""
        headroom = mem.headroom_gib if mem is not None else None
        if headroom is None:
            return
        t = self.thresholds
        hkey = prefix + "headroom"
        floor = t.headroom_floor_gib + (HEADROOM_HYSTERESIS_GIB if hkey in self.active else 0.0)
        if headroom < floor:
            found[hkey] = ("bad", f"{name} MemAvailable {headroom:.1f} GiB, under the "
                                  f"{t.headroom_floor_gib:g} GiB floor: OOM risk")

    @staticmethod
    def _container_findings(prefix: str, name: str, node: Any, found: dict[str, tuple[str, str]]) -> None:
        """The node's vLLM container OOM-killed, stopped or unhealthy."""
        cname = getattr(getattr(node, "config", None), "container", None)
        for c in getattr(node, "containers", ()) or ():
            if cname is not None and c.name != cname:
                continue
            ckey = f"{prefix}container:{c.name}"
            if c.oom_killed:
                found[ckey] = ("bad", f"{name} container {c.name} was OOM-killed (exit {c.exit_code})")
            elif c.state not in (None, "running"):
                found[ckey] = ("warn", f"{name} container {c.name} is {c.state}"
                                       + (f" (exit {c.exit_code})" if c.exit_code else ""))
            elif c.health == "unhealthy":
                found[ckey] = ("warn", f"{name} container {c.name} is unhealthy")

    # --- memory exhaustion forecasts (nodes/forecast.py) ----------------------------------------------------------
    def observe_exhaustion(self, name: str, found: dict[str, tuple[str, str]]) -> list[Alert]:
        """found: {series ("node" or a container's name): (severity, message)} for the series estimated to run
        out soon; the rest clear. Keys live under "exhaust:NAME:", apart from observe_node's, so each side
        settles only its own."""
        prefix = f"exhaust:{name}:"
        return self._settle(prefix, name, self.clock(), {prefix + k: v for k, v in found.items()})

    # --- endpoints ------------------------------------------------------------------------------------------
    def observe_endpoint(self, snap: Any, gpu_power_w: float | None = None,
                         loading_s: float | None = None, unsure: bool = False) -> list[Alert]:
        """`loading_s`: how long the container serving there has been loading its model (LoadWatch), None if not;
        `unsure`: refusing, but whether it restarted is not known yet (LoadWatch.unsure): nothing changes."""
        name = str(snap.name)
        prefix = f"endpoint:{name}:"
        when = getattr(snap, "time", None)
        now = float(when) if isinstance(when, (int, float)) else self.clock()
        found: dict[str, tuple[str, str]] = {}
        if snap.healthy is None:       # not polled yet: nothing to say
            return []
        if snap.healthy is False and loading_s is not None:
            found[prefix + "loading"] = ("info", f"{name} loading: no answer yet, its container up "
                                                 f"{duration(loading_s)} ({snap.error or 'no answer'})")
            return self._settle(prefix, name, now, found)
        if snap.healthy is False and unsure:
            return []
        if snap.healthy is False:
            # One failed poll is a warning (a busy server can miss one timeout); the second in a row is bad.
            failures = getattr(snap, "failures", None)
            sev = "warn" if failures == 1 else "bad"
            found[prefix + "down"] = (sev, f"{name} unhealthy: {snap.error or 'no answer'}")
            self._stall.pop(name, None)
            return self._settle(prefix, name, now, found)

        up, total = getattr(snap, "backends_up", None), getattr(snap, "backends_total", None)
        if up is not None and total and up < total:
            found[prefix + "backends"] = ("bad" if up == 0 else "warn", f"{name}: {total - up} of {total} backends down")

        stall = self._stall_message(name, snap, now, gpu_power_w)
        if stall:
            found[prefix + "stall"] = stall
        return self._settle(prefix, name, now, found)

    def _stall_message(self, name: str, snap: Any, now: float, power: float | None) -> tuple[str, str] | None:
        t = self.thresholds
        gen = getattr(snap, "generation_tokens", None)
        prompt = getattr(snap, "prompt_tokens", None)
        running = snap.running
        if gen is None or running is None:
            self._stall.pop(name, None)
            return None
        # Prefill advances the prompt counter: a long prompt being read is progress, not a stall.
        tokens = gen + (prompt or 0.0)
        clock = self._stall.setdefault(name, _StallClock())
        if running <= 0 or clock.tokens is None or tokens != clock.tokens:
            clock.tokens, clock.since = tokens, now
            return None
        # A simulated server running N× real time: its stall lasts N× the console's seconds.
        scale = getattr(snap, "time_scale", 1.0) or 1.0
        idle_for = (now - (clock.since if clock.since is not None else now)) * scale
        if idle_for < t.stall_seconds:
            return None
        if power is not None and power >= t.stall_power_w:
            return None           # the GPU is working: a slow step, not a silent stall
        power_txt = f"GPU at {power:.0f} W" if power is not None else "GPU power unknown"
        sev = "bad" if power is not None else "warn"
        return sev, (f"{name} silent stall: {running:g} request(s) running, no new tokens for {idle_for:.0f} s, "
                     f"{power_txt}")
