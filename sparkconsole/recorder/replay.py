"""Replays the flight recorder as live nodes: `sparkconsole console --at T` opens the dashboard as it was.

Each node's recorded rows from T on are turned back into agent lines (a hello, then ticks with their recorded
times) and played through nodes/replay.py's ReplayTransport in real time: not re-stamped (the console shows
the recorded time, labelled REPLAY), not looped, and refusing every command (a replayed node is never acted on).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import ClusterConfig
from ..errors import UserError
from .reader import RecorderReader

if TYPE_CHECKING:
    from ..nodes.monitor import ClusterMonitor

REPLAY_SPAN_S = 3600.0      # how much is played from T on


def agent_lines(r: RecorderReader, node: str, since: float, until: float) -> list[str]:
    hello_ev = r.last_event_before(node, "hello", since) or next(iter(r.events(node, since, until, ("hello",))), None)
    hello = {"type": "hello", "interval_s": 0.5, "gpu_source": "replay", "time": since}
    if hello_ev and isinstance(hello_ev["data"], dict):
        d = hello_ev["data"]
        hello.update({k: d[k] for k in ("hostname", "kernel", "boot_id", "driver", "agent_version", "interval_s",
                                        "simulated") if d.get(k) is not None})
        hello["gpus"] = [{"index": i, "name": n} for i, n in enumerate(d.get("gpu_names") or ())]
    hello["gpu_source"] = "replay"
    rows = r.ticks(node, since, until)
    if rows:
        hello["time"] = rows[0]["t"]      # paced by recorded time: the first tick plays at once
    lines = [json.dumps(hello)]
    states = _StateEvents(r, node, since, until)
    for x in rows:
        t = {"type": "tick", "seq": x["seq"] or 0, "time": x["t"], **states.at(x["t"])}
        g = {k: x[c] for k, c in (("temp_c", "temp_c"), ("slowdown_c", "slowdown_c"), ("power_w", "power_w"),
                                  ("sm_clock_mhz", "clock_mhz"), ("util_pct", "util_pct"), ("reasons_mask", "reasons"))
             if x[c] is not None}
        if g:
            t["gpus"] = [{"index": 0, **g}]
        mem = {k: x[k] for k in ("total_kb", "cached_kb", "swap_free_kb", "swap_total_kb") if x[k] is not None}
        if x["avail_kb"] is not None:
            mem["available_kb"] = x["avail_kb"]
        if mem:
            t["mem"] = mem
        if x["psi_some"] is not None:
            t["pressure"] = {"some_avg10": x["psi_some"], "full_avg10": x["psi_full"]}
        lines.append(json.dumps(t))
    return lines


class _StateEvents:
    """A node's recorded guard inputs and containers (events, kept when they change), as the agent's tick fields at
    each replayed time: a replay judges the OOM guards and shows the containers as they were, not as unknown."""

    KINDS = ("guards", "containers", "workloads")

    def __init__(self, r: RecorderReader, node: str, since: float, until: float) -> None:
        before = [r.last_event_before(node, kind, since) for kind in self.KINDS]
        self.events = [e for e in before if e] + r.events(node, since, until, self.KINDS)
        self.events.sort(key=lambda e: e["t"])
        self.i = 0
        self.now: dict[str, Any] = {}

    def at(self, t: float) -> dict[str, Any]:
        while self.i < len(self.events) and self.events[self.i]["t"] <= t:
            e = self.events[self.i]
            self.i += 1
            if e["kind"] == "guards" and isinstance(e["data"], dict):
                self.now["guards"] = e["data"]
            elif e["kind"] == "containers" and isinstance(e["data"], list):
                self.now["containers"] = [{**c, "labels": dict(c.get("labels") or ())}
                                          for c in e["data"] if isinstance(c, dict)]
            elif e["kind"] == "workloads" and isinstance(e["data"], dict):
                self.now.update(_workload_fields(e["data"]))
        return dict(self.now)


def replay_monitor_factory(path: str | Path, at: float) -> Callable[[ClusterConfig], ClusterMonitor]:
    """A monitor_factory for the console: every node of the cluster plays its recorded rows from `at`. The file is
    open only while it is read (an open reader would keep the writer's -wal and -shm files behind)."""
    r = RecorderReader(path)
    try:
        span = r.span()
    finally:
        r.close()
    if span is None or at > span[1]:
        raise UserError("nothing recorded at or after that time", field="--at",
                        fix="pick a time the recorder covers" + (f" (it has ticks up to {span[1]:.0f})" if span else ""))

    def factory(cluster: ClusterConfig) -> ClusterMonitor:
        from ..nodes.monitor import ClusterMonitor
        from ..nodes.replay import replay_factory
        r = RecorderReader(path)
        try:
            lines = {n.name: agent_lines(r, n.name, at, at + REPLAY_SPAN_S) for n in cluster.nodes}
            notes = replay_notes(r, at)
        finally:
            r.close()
        mon = ClusterMonitor(cluster, transport_factory=replay_factory(
            lines, speed=1.0, loop=False, retime=False, runs_commands=False))
        mon.notes = notes
        return mon
    return factory


class EndpointReplay:
    """The recorded endpoint polls (recorder/feed.py: each poll's non-empty fields) around a replayed moment, as the
    console's endpoint panels show them: `at(t)` gives each endpoint's last poll at or before t, none older than
    STALE_S. Read once, from LOOKBACK_S before `at` to REPLAY_SPAN_S after it; the file is closed again."""

    LOOKBACK_S = 120.0
    STALE_S = 60.0

    def __init__(self, path: str | Path, at: float) -> None:
        r = RecorderReader(path)
        try:
            self.samples = {name: r.endpoint_samples(name, at - self.LOOKBACK_S, at + REPLAY_SPAN_S)
                            for name in r.endpoint_names()}
        finally:
            r.close()

    def at(self, t: float) -> dict[str, Any]:
        """name → EndpointSnapshot of its last recorded poll at or before t (none for an endpoint not polled then)."""
        out = {}
        for name, rows in self.samples.items():
            row = next((x for x in reversed(rows) if x["t"] <= t), None)
            if row is not None and t - row["t"] <= self.STALE_S:
                out[name] = snapshot_of(name, row)
        return out


def snapshot_of(name: str, row: dict[str, Any]) -> Any:
    """An EndpointSnapshot back from its recorded row (the fields left out were empty: None, or () for lists)."""
    import dataclasses

    from ..serving.endpoint import EndpointSnapshot
    values: dict[str, Any] = {}
    for f in dataclasses.fields(EndpointSnapshot):
        v = row.get(f.name)
        if isinstance(v, list):
            v = tuple(tuple(x) if isinstance(x, list) else x for x in v)
        if v is None and f.default is dataclasses.MISSING:
            v = {"name": name, "url": "", "kind": "vllm", "time": row["t"]}.get(f.name)
        if v is not None or f.default is dataclasses.MISSING:
            values[f.name] = v
    values.update(name=name, time=row["t"])
    return EndpointSnapshot(**values)


def recording_for(cluster: ClusterConfig, *, file: str | None, demo: bool, cluster_given: bool,
                  node: str | None = None) -> tuple[ClusterConfig, Path, str | None]:
    """Which recorder file `console --at` / `postmortem` read, for which cluster: --file; --demo (the latest demo
    recording); else the cluster's own, or — when no cluster file was given and this machine's recording does not
    exist or hold `node` — the latest demo recording. Returns (cluster, path, a line saying which was chosen)."""
    from .feed import latest_demo_recording, recorder_path
    if file:
        return cluster, Path(file).expanduser(), None
    own = None if demo else recorder_path(cluster)
    if own is not None and (cluster_given or (own.is_file() and (node is None or _holds(own, node)))):
        return cluster, own, None
    found = latest_demo_recording()
    if found is None or (node is not None and not demo and not _holds(found, node)):
        if own is None:             # --demo: no recording of the cluster's own to fall back on
            raise UserError("no demo recording yet", field="--demo",
                            fix="run `sparkconsole demo --runaway memory` first (its recording is kept)")
        return cluster, own, None
    return recorded_cluster(found), found, f"reading the demo's recording {found} (SIMULATED)"


def _holds(path: Path, node: str) -> bool:
    try:
        r = RecorderReader(path)
    except UserError:
        return False
    try:
        return node in r.nodes()
    finally:
        r.close()


def recorded_cluster(path: Path) -> ClusterConfig:
    """A simulated cluster of the nodes a recording names (its session event): what `console --at --demo` shows."""
    from ..config import NodeConfig
    r = RecorderReader(path)
    try:
        session = r.last_event_before("*", "session", 1e11)
        names = ((session or {}).get("data") or {}).get("nodes") or r.nodes()
    finally:
        r.close()
    return ClusterConfig(nodes=tuple(NodeConfig(name=str(n), address="127.0.0.1", local=True) for n in names),
                         endpoints=(), source="<simulated>", simulated=True)


def replay_notes(r: RecorderReader, at: float) -> list[str]:
    """What the replay cannot show, one line each, for the console to say: a damaged file's unreadable parts
    play as a pause in the ticks (the node turns STALE there), which must not read as the node's own silence."""
    return [f"recorder file damaged: {g} — the replay has a gap there (STALE is the file, not the node); "
            f"`sparkconsole record repair {r.path}` copies the readable part" for g in r.gap_texts(at, at + REPLAY_SPAN_S)]


def _workload_fields(d: dict[str, Any]) -> dict[str, Any]:
    """A recorded `workloads` event (recorder/workloads.py) as the agent's `gpu_procs` and `cgroups` tick fields."""
    if d.get("reason"):
        gp: dict[str, Any] = {"reason": d["reason"]}
    else:
        gp = {"read_at": d.get("read_at"), "procs": [
            {"pid": p[0], "used_b": p[1], "comm": p[2] or None,
             **({"container": p[3]} if p[3] not in ("host", "gone", "unlisted", "") else {"where": p[3] or "host"})}
            for p in d.get("p") or [] if isinstance(p, list) and len(p) == 4]}
    cgroups = [{"name": n, "current_b": w[1], "max_b": w[2]} for n, w in (d.get("w") or {}).items()
               if isinstance(w, list) and len(w) == 3 and w[1] is not None]
    return {"gpu_procs": gp, "cgroups": cgroups}
