"""The freeze early warning, wired: each node's ticks → nodes/forecast.py estimates → alerts (AlertEngine
.observe_exhaustion) → the opt-in guard action (stop the node's vLLM container before memory runs out).

    guardian = Guardian(cluster, alerts, recorder=rec, say=print)
    unsubscribe = monitor.subscribe(guardian.on_node)     # the console and `sparkconsole record` both do this

The action is off unless the cluster file says `protect: {stop_container_before_exhaustion_s: S}` (S > 0).
It runs `docker stop --time 2 CONTAINER` on that node through the node's transport, once per runaway, writes
it to the audit log first, and says so through `say` (the console's events pane, record's stdout). A replayed
node is never acted on (it says what it would have done); a simulated one is, and the message says SIMULATED.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import audit
from .alerts import AlertEngine
from .config import ClusterConfig
from .nodes.forecast import FIXES, Estimate, NodeForecaster, describe

if TYPE_CHECKING:
    from .nodes.monitor import NodeMonitor
    from .recorder.feed import Recorder

log = logging.getLogger(__name__)

ACT_AGAIN_AFTER_S = 60.0     # one stop per runaway: the same node is not acted on again within this long
STOP_GRACE_S = 2             # docker stop --time: vLLM gets this long to exit before SIGKILL


def stop_argv(container: str) -> list[str]:
    return ["docker", "stop", "--time", str(STOP_GRACE_S), container]


class Guardian:
    def __init__(self, cluster: ClusterConfig, alerts: AlertEngine, *, recorder: Recorder | None = None,
                 say: Callable[[str, str], None] = lambda text, severity: None, replay: bool = False) -> None:
        self.cluster = cluster
        self.alerts = alerts
        self.recorder = recorder
        self.say = say                      # say(text, severity): severity info | warn | bad
        self.replay = replay
        self.threshold_s = cluster.protect.stop_container_before_exhaustion_s
        self.forecasters: dict[str, NodeForecaster] = {}
        self.estimates: dict[str, list[Estimate]] = {}
        self.actions: list[dict[str, Any]] = []       # what the guard did (or would have done), newest last
        self._last_tick: dict[str, float] = {}
        self._acted: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def on_node(self, nm: NodeMonitor) -> None:
        tick = nm.last
        if tick is None or self._last_tick.get(nm.name) == tick.time:
            return
        self._last_tick[nm.name] = tick.time
        fc = self.forecasters.get(nm.name)
        if fc is None:
            fc = self.forecasters[nm.name] = NodeForecaster(nm.config.container)
        ests = fc.add(tick)
        if ests is None:
            return
        self.estimates[nm.name] = ests
        found = {}
        for e in ests:
            if e.severity:
                found[e.what] = (e.severity, describe(nm.name, e))
        for ev in self.alerts.observe_exhaustion(nm.name, found):   # (the recorder keeps alerts it is attached to)
            if ev.active:
                self.say(ev.message + " — fix: " + FIXES[0], ev.severity)
        if self.threshold_s > 0:
            due = [e for e in ests if e.seconds is not None and e.seconds <= self.threshold_s]
            if due:
                self._act(nm, min(due, key=lambda e: e.seconds or 0.0))     # (each has seconds: filtered above)

    def _act(self, nm: NodeMonitor, e: Estimate) -> None:
        now = time.monotonic()
        if now - self._acted.get(nm.name, float("-inf")) < ACT_AGAIN_AFTER_S:
            return
        self._acted[nm.name] = now
        container = nm.config.container
        why = describe(nm.name, e)
        record: dict[str, Any] = {"node": nm.name, "container": container, "estimate_s": round(e.seconds or 0, 1),
                                  "why": why, "time": time.time()}
        simulated = self.cluster.simulated or bool(nm.info and nm.info.simulated)
        if self.replay:
            record["result"] = "not run (REPLAY)"
            self._done(record, f"REPLAY: the guard would have stopped {container} on {nm.name} ({why})", "warn")
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self._stop(nm, container, record, simulated, why))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop(self, nm: NodeMonitor, container: str, record: dict[str, Any], simulated: bool, why: str) -> None:
        label = "SIMULATED: " if simulated else ""
        env = "".join(f"{k}={shlex.quote(v)} " for k, v in nm.config.env)   # e.g. DOCKER_HOST of a test engine
        cmd = env + shlex.join(stop_argv(container))
        transport = getattr(nm, "transport", None)
        if transport is None:
            record["result"] = "not run: no connection"
            self._done(record, f"{label}guard: could not stop {container} on {nm.name}: not connected", "bad")
            return
        audit.record("protect-stop", nm.name, cmd)
        self.say(f"{label}guard: stopping {container} on {nm.name} before memory runs out ({why})", "bad")
        try:
            r = await transport.run(cmd, timeout=30)
            ok, detail = r.rc == 0, " ".join((r.stderr or r.stdout).split())[:200]
        except Exception as exc:   # noqa: BLE001 — the transport's errors are one line; report, keep watching
            ok, detail = False, " ".join(str(exc).split())[:200]
        record["result"] = "stopped" if ok else f"failed: {detail}"
        self._done(record, f"{label}guard: {container} on {nm.name} " + ("stopped" if ok else f"NOT stopped: {detail}"),
                   "warn" if ok else "bad")

    def _done(self, record: dict[str, Any], text: str, severity: str) -> None:
        self.actions.append(record)
        if self.recorder is not None:
            self.recorder.note(record["node"], "protect", record)
        self.say(text, severity)

    async def wait_actions(self) -> None:
        """Until the stops under way have finished (tests; record before it exits)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
