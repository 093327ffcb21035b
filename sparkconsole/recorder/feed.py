"""Feeds a RecorderStore from a ClusterMonitor: each new tick, and what changed about a node (state, boot id,
containers) as events. Runs in the monitor's subscriber callback: it only queues rows (store.put_*).

    rec = Recorder.open(cluster)            # the cluster's file in the state dir, or None when recorder: off
    rec.attach(monitor)                     # subscribe; rec.close() unsubscribes and flushes
    rec.on_postmortem = lambda pm: ...      # when set: a post-mortem is built after each incident (DOWN,
                                            # reboot, the node's container leaving running) and passed here
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import paths
from ..config import ClusterConfig
from ..errors import UserError
from .store import RecorderStore
from .workloads import WorkloadLog

if TYPE_CHECKING:
    from ..alerts import AlertEngine
    from ..nodes.monitor import NodeMonitor
    from ..serving.endpoint import ServingMonitor

log = logging.getLogger(__name__)

POSTMORTEM_DELAY_S = 2.0


def _on_this_loop(cb: Callable[[str, str], None]) -> Callable[[str, str], None]:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return cb
    here = threading.get_ident()

    def hop(text: str, severity: str) -> None:
        if threading.get_ident() == here:
            cb(text, severity)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(cb, text, severity)
    return hop


def cluster_key(cluster: ClusterConfig) -> str:
    """<cluster file stem>-<hash of its full path>: what names the cluster's recorder file and its collector."""
    src = cluster.source
    stem = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in Path(src).stem)[:40] or "cluster"
    if cluster.simulated:
        stem = "SIMULATED-" + stem      # simulated history never mixes with a real cluster's
    digest = hashlib.sha256(str(Path(src).expanduser().resolve() if "<" not in src else src).encode()).hexdigest()[:10]
    return f"{stem}-{digest}"


def recorder_path(cluster: ClusterConfig) -> Path:
    """state_dir()/recorder/<cluster_key>.sqlite: one file per cluster file."""
    return paths.state_dir() / "recorder" / f"{cluster_key(cluster)}.sqlite"


def latest_demo_recording() -> Path | None:
    """The newest simulated cluster's recorder file (`sparkconsole demo --runaway …` writes one), or None."""
    try:
        found = list((paths.state_dir() / "recorder").glob("SIMULATED-*.sqlite"))
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


DEMO_RECORDINGS_KEPT = 5


def new_demo_recording(now: float | None = None) -> Path:
    """Where an interactive `sparkconsole demo` records: in the operator's state directory (not the demo's own,
    which goes at exit), one file per demo, so `postmortem --demo` and `console --at … --demo` find it after the
    demo ends (latest_demo_recording). The newest DEMO_RECORDINGS_KEPT are kept; older ones are removed."""
    import os
    import time as _time
    folder = paths.state_dir() / "recorder"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = _time.strftime("%Y%m%d-%H%M%S", _time.localtime(now))
    old = sorted(folder.glob("SIMULATED-demo-*.sqlite"), key=lambda p: p.stat().st_mtime)
    for gone in old[:max(len(old) - (DEMO_RECORDINGS_KEPT - 1), 0)]:
        for part in (gone, gone.with_name(gone.name + "-wal"), gone.with_name(gone.name + "-shm")):
            part.unlink(missing_ok=True)
    return folder / f"SIMULATED-demo-{stamp}-{os.getpid()}.sqlite"


class Recorder:
    def __init__(self, cluster: ClusterConfig, store: RecorderStore) -> None:
        self.cluster = cluster
        self.store = store
        self._seen: dict[str, tuple[Any, ...]] = {}      # node -> (last tick time, state, boot id, containers)
        self._ep_seen: dict[str, float] = {}
        self._guards: dict[str, object] = {}   # node -> the last GuardInputs recorded
        self._workloads = WorkloadLog()        # which per-process readings become `workloads` events
        self._unsub: list[Callable[[], None]] = []
        self.on_postmortem: Callable[[dict[str, Any]], None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def open(cls, cluster: ClusterConfig, path: str | Path | None = None, *,
             on_status: Callable[[str, str], None] | None = None, on_loop: bool = True) -> Recorder | None:
        """on_status(text, severity): the store's fault lines (recorder/health.py), called on the event loop this
        runs in (the writer's thread hops to it; on_loop=False: in the writer's thread, for a thread-safe one)."""
        if not cluster.recorder.enabled:
            return None
        if path is None:
            try:
                path = recorder_path(cluster)
            except OSError as exc:
                raise UserError(f"cannot make the state directory: {exc.strerror or exc}", file=exc.filename,
                                field="recorder", fix="make it writable, or set SPARKCONSOLE_STATE_DIR to a "
                                "directory of yours") from None
        store = RecorderStore(path, cluster.recorder,
                              on_status=_on_this_loop(on_status) if on_status and on_loop else on_status)
        store.put_event("*", "session", {"source": cluster.source, "simulated": cluster.simulated,
                                         "nodes": [n.name for n in cluster.nodes],
                                         "endpoints": {e.name: e.node for e in cluster.endpoints}})
        return cls(cluster, store)

    def attach(self, monitor: Any) -> None:
        self._unsub.append(monitor.subscribe(self.on_node))

    def attach_alerts(self, alerts: AlertEngine) -> None:
        """Every alert raised or cleared (node, endpoint, exhaustion) kept as an event: post-mortem evidence."""
        self._unsub.append(alerts.subscribe(lambda a: self.note(a.source, "alert", {
            "key": a.key, "severity": a.severity, "message": a.message, "active": a.active})))

    def attach_serving(self, serving: ServingMonitor) -> None:
        """Every endpoint poll (engine metrics, router figures) as one row of its non-empty fields."""
        self._unsub.append(serving.subscribe(self.on_endpoint))

    def on_endpoint(self, em: Any) -> None:
        snap = getattr(em, "latest", em)
        if snap is None or self._ep_seen.get(snap.name) == snap.time:
            return
        self._ep_seen[snap.name] = snap.time
        row = {k: v for k, v in asdict(snap).items() if v not in (None, (), "") and k not in ("name", "url", "time")}
        self.store.put_endpoint(snap.name, row, snap.time)

    def on_node(self, nm: NodeMonitor) -> None:
        prev = self._seen.get(nm.name, (None, None, None, None))
        tick = nm.last
        if tick is not None and tick.time != prev[0]:
            self.store.put_tick(nm.name, tick, nm.config.container)
            # The OOM-guard inputs, as an event when they change: a replay judges the guards as they were.
            if tick.guards is not None and tick.guards != self._guards.get(nm.name):
                self._guards[nm.name] = tick.guards
                self.store.put_event(nm.name, "guards", asdict(tick.guards), tick.time)
            # What each workload held (GPU memory per process, cgroup), when it moved: what a post-mortem names
            snap = self._workloads.due(nm.name, tick)
            if snap is not None:
                self.store.put_event(nm.name, "workloads", snap, tick.time)
        state = nm.state.value
        incident = False
        if state != prev[1]:
            self.store.put_event(nm.name, "state", {"state": state, "error": nm.last_error}, nm.since)
            incident |= state == "DOWN" and prev[1] is not None
        boot = nm.info.boot_id if nm.info else None
        if boot != prev[2] and boot is not None and nm.info is not None:      # (a boot id comes with the info)
            self.store.put_event(nm.name, "hello", asdict(nm.info))
            incident |= prev[2] is not None
        conts = nm.containers
        if conts != prev[3] and conts is not None:
            self.store.put_event(nm.name, "containers", [asdict(c) for c in conts])
            was = {c.name: c.state for c in prev[3] or ()}
            incident |= any(was.get(c.name) == "running" and c.state != "running" for c in conts
                            if c.name == nm.config.container)
        self._seen[nm.name] = (tick.time if tick else None, state, boot, conts)
        if incident and self.on_postmortem is not None:
            self._postmortem_later(nm.name)

    def _postmortem_later(self, node: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self._postmortem(node))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _postmortem(self, node: str) -> None:
        from .postmortem import build
        from .reader import RecorderReader

        def work() -> dict[str, Any]:
            self.store.flush()                  # the incident's own rows are committed first
            reader = RecorderReader(self.store.path)
            try:
                return build(reader, node)
            finally:
                reader.close()
        await asyncio.sleep(POSTMORTEM_DELAY_S)     # let the other nodes show whether they kept ticking
        try:
            pm = await asyncio.to_thread(work)
        except Exception:   # noqa: BLE001 — a post-mortem that cannot be built must not take the console down
            log.exception("post-mortem for %s", node)
            return
        self.store.put_event(node, "postmortem", {"verdict": pm["verdict"], "evidence": pm["evidence"],
                                                   "incident": pm["incident"]})
        if self.on_postmortem is not None:
            self.on_postmortem(pm)

    async def wait_postmortems(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def note(self, node: str, kind: str, data: Any) -> None:
        """An alert, a guard action, a post-mortem: anything the console decided, kept with the readings."""
        self.store.put_event(node, kind, data)

    def close(self) -> None:
        for u in self._unsub:
            u()
        self._unsub.clear()
        self.store.close()
