"""What each workload held, kept by the flight recorder so a post-mortem can name what grew before an incident.

Kept as events of kind `workloads` (no new table: the recorder's events already have retention, salvage and
replay): one row per per-process reading that changed — a workload's GPU memory or cgroup usage moved by at least
RECORD_STEP_B, a workload or GPU process came or went — and at least every HEARTBEAT_S while the node ticks. A
steady node costs one row every HEARTBEAT_S; a runaway, one per reading (every 2 s).

    {"read_at": T, "w": {"vllm_node": [gpu_b, cgroup_b, cap_b], …},          # None where not measured
     "p": [[pid, used_b, comm, container or "" ], …]}                        # the GPU processes, largest first
"""

from __future__ import annotations

from typing import Any

from ..nodes.samples import Tick
from ..nodes.workload_memory import workload_memory

RECORD_STEP_B = 64 << 20
HEARTBEAT_S = 30.0
MAX_PROCS = 32


def snapshot(tick: Tick) -> dict[str, Any] | None:
    """The tick's workloads as a `workloads` event's data; None when it carries no per-process reading."""
    gp = tick.gpu_procs
    if gp is None:
        return None
    ws = workload_memory(tick)
    procs = sorted(gp.procs, key=lambda p: -(p.used_b or 0))[:MAX_PROCS]
    return {"read_at": gp.read_at, "reason": gp.reason,
            "w": {n: [w.gpu_b, w.cgroup_b, w.cap_b] for n, w in ws.items()},
            "p": [[p.pid, p.used_b, p.comm or "", p.container or p.where or ""] for p in procs]}


class WorkloadLog:
    """Decides, per node, which readings become `workloads` events."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, dict[str, Any]]] = {}

    def due(self, node: str, tick: Tick) -> dict[str, Any] | None:
        snap = snapshot(tick)
        if snap is None:
            return None
        last = self._last.get(node)
        if last is not None and last[1].get("read_at") == snap["read_at"] and tick.time - last[0] < HEARTBEAT_S:
            return None
        if last is not None and tick.time - last[0] < HEARTBEAT_S and not _moved(last[1], snap):
            return None
        self._last[node] = (tick.time, snap)
        return snap


def _moved(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if set(a["w"]) != set(b["w"]) or {p[0] for p in a["p"]} != {p[0] for p in b["p"]} or a.get("reason") != \
            b.get("reason"):
        return True
    for name, now in b["w"].items():
        for x, y in zip(a["w"][name], now, strict=False):
            if (x is None) != (y is None) or (x is not None and y is not None and abs(y - x) >= RECORD_STEP_B):
                return True
    return False


def growth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """From recorded `workloads` rows (oldest first), each workload that grew, from the first row it is in to its
    largest (a workload the guard stopped is gone from the last rows: its peak counts):
    [{"name", "gpu_b", "cgroup_b", "cap_b", "procs": [[pid, comm, grew_b], …]}], largest first. A GPU process in no
    container is its own entry, named by its PID."""
    if len(rows) < 2:
        return []
    first_w: dict[str, list[Any]] = {}
    peak_w: dict[str, list[Any]] = {}
    first_p: dict[int, int] = {}
    peak_p: dict[int, tuple[int, str, str]] = {}
    for row in rows:
        for name, w in (row.get("w") or {}).items():
            if not isinstance(w, list) or len(w) != 3:
                continue
            first_w.setdefault(name, w)
            top = peak_w.get(name)
            if top is None or (w[0] or 0) + (w[1] or 0) >= (top[0] or 0) + (top[1] or 0):
                peak_w[name] = w
        for p in row.get("p") or []:
            if not isinstance(p, list) or len(p) != 4:
                continue
            first_p.setdefault(p[0], p[1] or 0)
            if p[0] not in peak_p or (p[1] or 0) >= peak_p[p[0]][0]:
                peak_p[p[0]] = (p[1] or 0, p[2], p[3])
    grew = [(pid, comm, used - first_p[pid], where) for pid, (used, comm, where) in peak_p.items()
            if used - first_p[pid] > 0]
    out = []
    for name, (gpu, cg, cap) in peak_w.items():
        g0, c0, _ = first_w[name]
        dg = (gpu or 0) - (g0 or 0) if gpu is not None else 0
        dc = (cg or 0) - (c0 or 0) if cg is not None else 0
        out.append({"name": name, "gpu_b": dg, "cgroup_b": dc, "cap_b": cap,
                    "procs": [[pid, comm, d] for pid, comm, d, where in sorted(grew, key=lambda x: -x[2])
                              if where == name]})
    for pid, comm, d, where in grew:
        if where in ("host", "unlisted", "gone", ""):
            out.append({"name": f"PID {pid}" + (f" ({comm})" if comm else ""), "gpu_b": d, "cgroup_b": 0,
                        "cap_b": None, "procs": [[pid, comm, d]], "no_container": True})
    return sorted((g for g in out if g["gpu_b"] + g["cgroup_b"] > 0), key=lambda g: -(g["gpu_b"] + g["cgroup_b"]))


def words(g: dict[str, Any], span_s: float) -> str:
    """`vllm_node grew 38.0 GiB in 58 s: GPU memory +37.9 GiB (PID 4242 python3), its cgroup +0.1 GiB of a
    100.0 GiB cap — the cap did not fire: it holds the CPU side`."""
    gib = 2 ** 30
    who = ", ".join(f"PID {pid}" + (f" {comm}" if comm else "") for pid, comm, _ in g["procs"][:2])
    text = (f"{g['name']} grew {(g['gpu_b'] + g['cgroup_b']) / gib:.1f} GiB in {span_s:.0f} s: GPU memory "
            f"+{g['gpu_b'] / gib:.1f} GiB" + (f" ({who})" if who else ""))
    if not g.get("no_container"):
        text += f", its cgroup +{g['cgroup_b'] / gib:.1f} GiB"
        if g.get("cap_b"):
            text += (f" of a {g['cap_b'] / gib:.1f} GiB cap — the cap did not see the GPU memory"
                     if g["gpu_b"] > g["cgroup_b"] else f" of a {g['cap_b'] / gib:.1f} GiB cap")
    return text
