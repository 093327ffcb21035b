"""The freeze early warning, wired: each node's ticks → nodes/forecast.py estimates → alerts (AlertEngine
.observe_exhaustion) → the guard action (stop the container whose memory grew before the node's memory runs out).

    guardian = Guardian(cluster, alerts, recorder=rec, say=print)
    unsubscribe = monitor.subscribe(guardian.on_node)     # the console and `sparkconsole record` both do this

What it stops: the workload the forecast names as having grown while MemAvailable fell (`Estimate.grower`: its
processes' GPU memory from NVML plus its cgroup, nodes/workload_memory.py) — on a GB10 a runaway in GPU memory is
invisible to the container's memory cap, so this is what contains it. Without per-process readings (an older
agent, NVML without the process list) it falls back to the node's configured container; a container's own cap
series (its CPU side nearing its cap) stops that container. A GPU process in no container is not stopped (docker
cannot): it is said, with earlyoom as the guard that can (nodes/guard.py).

On by default (`protect: {stop_container_before_exhaustion_s: 15}`; 0: off) for the containers this console
launched (their `sparkconsole.*` labels); `containers: any` for every container (config.ProtectSettings says why).
It runs `docker stop --time 2 CONTAINER` on that node through the node's transport, once per runaway, writes it to
the audit log first, and says so through `say` (the console's events pane, record's stdout). A replayed node is
never acted on (it says what it would have done); a simulated one is, and the message says SIMULATED.
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


def _gib(b: float) -> str:
    return f"{b / 2**30:.1f} GiB"


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

    def _target(self, nm: NodeMonitor, e: Estimate) -> tuple[str | None, str | None]:
        """(the container to stop, or None; why not, when None)."""
        if e.what != "node":
            return e.what, None                       # a container's own cap series: that container
        g = e.grower
        if g is None:
            # No per-process readings to say what grew (an older agent, NVML without its process list): the node's
            # vLLM container, as before them.
            return nm.config.container, None
        if g.container is None:
            return None, (f"{g.name} grew {_gib(g.total_b)} of GPU memory and is in no container: docker cannot "
                          "stop it — earlyoom preferring it can (its guard check says how)")
        return g.container, None

    def _launched(self, nm: NodeMonitor, container: str) -> bool:
        c = next((c for c in getattr(nm, "containers", ()) if c.name == container), None)
        return c is not None and any(k.startswith("sparkconsole.") for k, _ in c.labels)

    def _act(self, nm: NodeMonitor, e: Estimate) -> None:
        now = time.monotonic()
        if now - self._acted.get(nm.name, float("-inf")) < ACT_AGAIN_AFTER_S:
            return
        self._acted[nm.name] = now
        container, why_not = self._target(nm, e)
        why = describe(nm.name, e)
        record: dict[str, Any] = {"node": nm.name, "container": container, "estimate_s": round(e.seconds or 0, 1),
                                  "why": why, "time": time.time()}
        if e.grower is not None:
            record["grower"] = e.grower.words()
            record["pids"] = [[pid, comm] for pid, comm, _ in e.grower.procs[:4]]
        simulated = self.cluster.simulated or bool(nm.info and nm.info.simulated)
        label = "SIMULATED: " if simulated else ""
        if container is None:
            record["result"] = "not stopped: in no container"
            self._done(record, f"{label}guard: {nm.name}: {why_not} ({why})", "bad")
            return
        if self.cluster.protect.containers != "any" and not self._launched(nm, container):
            record["result"] = "not stopped: not launched by sparkconsole"
            self._done(record, f"{label}guard: {nm.name}: {container} is running out the node's memory but was not "
                               "launched by this console, so the guard leaves it (protect: {containers: any} lets it "
                               f"stop any container) ({why})", "bad")
            return
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
        self.say(f"{label}guard: stopping {container} on {nm.name} before the node's memory runs out ({why})", "bad")
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
