"""Feeds a RecorderStore from a ClusterMonitor: each new tick, and what changed about a node (state, boot id,
containers) as events. Runs in the monitor's subscriber callback: it only queues rows (store.put_*).

    rec = Recorder.open(cluster)            # the cluster's file in the state dir, or None when recorder: off
    rec.attach(monitor)                     # subscribe; rec.close() unsubscribes and flushes
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from .. import paths
from ..config import ClusterConfig
from .store import RecorderStore


def recorder_path(cluster: ClusterConfig) -> Path:
    """state_dir()/recorder/<cluster file stem>-<hash of its full path>.sqlite: one file per cluster file."""
    src = cluster.source
    stem = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in Path(src).stem)[:40] or "cluster"
    if cluster.simulated:
        stem = "SIMULATED-" + stem      # simulated history never mixes with a real cluster's
    digest = hashlib.sha256(str(Path(src).expanduser().resolve() if "<" not in src else src).encode()).hexdigest()[:10]
    return paths.state_dir() / "recorder" / f"{stem}-{digest}.sqlite"


class Recorder:
    def __init__(self, cluster: ClusterConfig, store: RecorderStore) -> None:
        self.cluster = cluster
        self.store = store
        self._seen: dict[str, tuple] = {}      # node -> (last tick time, state, boot id, containers)
        self._unsub: list[Callable[[], None]] = []

    @classmethod
    def open(cls, cluster: ClusterConfig, path: str | Path | None = None) -> "Recorder | None":
        if not cluster.recorder.enabled:
            return None
        store = RecorderStore(path or recorder_path(cluster), cluster.recorder)
        store.put_event("*", "session", {"source": cluster.source, "simulated": cluster.simulated,
                                         "nodes": [n.name for n in cluster.nodes]})
        return cls(cluster, store)

    def attach(self, monitor) -> None:
        self._unsub.append(monitor.subscribe(self.on_node))

    def on_node(self, nm) -> None:
        prev = self._seen.get(nm.name, (None, None, None, None))
        tick = nm.last
        if tick is not None and tick.time != prev[0]:
            self.store.put_tick(nm.name, tick, nm.config.container)
        state = nm.state.value
        if state != prev[1]:
            self.store.put_event(nm.name, "state", {"state": state, "error": nm.last_error}, nm.since)
        boot = nm.info.boot_id if nm.info else None
        if boot != prev[2] and boot is not None:
            self.store.put_event(nm.name, "hello", asdict(nm.info))
        conts = nm.containers
        if conts != prev[3] and conts is not None:
            self.store.put_event(nm.name, "containers", [asdict(c) for c in conts])
        self._seen[nm.name] = (tick.time if tick else None, state, boot, conts)

    def note(self, node: str, kind: str, data) -> None:
        """An alert, a guard action, a post-mortem: anything the console decided, kept with the readings."""
        self.store.put_event(node, kind, data)

    def close(self) -> None:
        for u in self._unsub:
            u()
        self._unsub.clear()
        self.store.close()
