"""`sparkconsole status`: connect to every node, wait for its first tick, print one snapshot.

    sparkconsole status [--json] [--watch] [--timeout S]

Without a cluster file this machine is the one node (no SSH). Exit code 1 when any node is DOWN or sent
nothing within the timeout; a bad cluster file is a one-line error (exit 2).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:      # imported inside the functions: `status --bad` and `--help` answer at interpreter speed
    from ..config import ClusterConfig
    from ..nodes.monitor import ClusterMonitor, NodeMonitor

STOP_S = 10.0              # at most this long to stop the node monitors once the command ends (Ctrl-C included)
CONTAINER_WAIT_S = 2.0     # containers come at a slower cadence than ticks: give the first reading a moment


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("status", help="one snapshot of every node (GPU, memory, OOM guards, containers)",
                              description="Connect to every node of the cluster file, wait for the first "
                              "reading of each, and print it. Exit code 1 if any node is DOWN.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    p.add_argument("--timeout", type=float, default=15.0, metavar="S",
                   help="seconds to wait for each node's first reading (default 15)")
    p.set_defaults(func=run)


def load(args: argparse.Namespace) -> ClusterConfig:
    from ..clusterfile import cluster_for
    return cluster_for(args)


def is_down(nm: NodeMonitor) -> bool:
    from ..nodes.samples import NodeState

    return nm.state == NodeState.DOWN or nm.last is None


def node_record(nm: NodeMonitor) -> dict[str, Any]:
    from dataclasses import asdict

    from ..nodes.guard import evaluate_guards
    from ..nodes.samples import NodeState
    from ..nodes.workload_memory import workload_memory

    t = nm.last
    guards = evaluate_guards(t.guards if t else None, t.mem if t else None, nm.containers, nm.config.container) \
        if t else []
    from .. import severity
    return {
        "name": nm.name, "address": nm.config.address, "local": nm.config.local,
        "state": nm.state.value if nm.last is not None or nm.state == NodeState.DOWN else NodeState.DOWN.value,
        "since": nm.since, "error": nm.last_error or (None if t else "no reading within the timeout"),
        "bad_lines": nm.bad_lines, "reboots": nm.reboots,
        "info": asdict(nm.info) if nm.info else None,
        "tick": None if t is None else {
            "seq": t.seq, "time": t.time, "age_s": round(time.time() - t.received, 3),
            "gpus": [asdict(g) for g in t.gpus], "mem": asdict(t.mem) if t.mem else None,
            "pressure": asdict(t.pressure) if t.pressure else None, "guards_in": asdict(t.guards) if t.guards else None,
            "gpu_procs": asdict(t.gpu_procs) if t.gpu_procs else None, "errors": list(t.errors)},
        "containers": [asdict(c) for c in nm.containers],
        # each guard with the severity every view draws (severity.py) and the fix every view says
        "guards": [{**asdict(g), "severity": severity.of_guard(g).name, "fix": severity.guard_fix(g)}
                   for g in guards],
        # what each running container measurably holds: its processes' GPU memory (NVML) + its cgroup's usage;
        # a part not measured is null, with the reason
        "workloads": {} if t is None else {
            name: {"gpu_b": w.gpu_b, "cgroup_b": w.cgroup_b, "cap_b": w.cap_b, "total_b": w.total_b,
                   "measured": w.measured, "reason": w.reason,
                   "procs": [{"pid": p.pid, "gpu": p.gpu, "used_b": p.used_b, "comm": p.comm} for p in w.procs]}
            for name, w in workload_memory(t).items()},
    }


def _fmt(v: float | None, unit: str = "", nd: int = 0) -> str:
    if v is None:
        return "—"
    return f"{v:.{nd}f}{unit}"


def render_table(records: list[dict[str, Any]]) -> str:
    from .. import severity
    from ..nodes.samples import REASON_WORDS, NodeState

    head = ("NODE", "STATE", "GPU", "TEMP °C", "POWER W", "SM MHz", "UTIL", "REASONS", "HOST MEM", "GUARDS")
    rows = []
    notes = []
    for r in records:
        t = r["tick"]
        gpus = (t or {}).get("gpus") or []
        g = gpus[0] if gpus else {}
        names = (r["info"] or {}).get("gpu_names") or ()
        gpu = (names[0] if names else "none") + (f" ×{len(gpus)}" if len(gpus) > 1 else "")
        if r["info"] and r["info"].get("simulated"):
            gpu += " (sim)"
        temp = _fmt(g.get("temp_c")) + (f"/{_fmt(g.get('slowdown_c'))}" if g.get("slowdown_c") is not None else "")
        power = _fmt(g.get("power_w")) + (f"/{_fmt(g.get('power_limit_w'))}" if g.get("power_limit_w") else "")
        clock = _fmt(g.get("sm_clock_mhz")) + (f"/{_fmt(g.get('sm_clock_max_mhz'))}" if g.get("sm_clock_max_mhz") else "")
        reasons = ",".join(REASON_WORDS.get(x, x) for x in g.get("reasons", ())) or ("—" if not g else "none")
        mem = (t or {}).get("mem") or {}
        host_mem = "—"
        if mem.get("total_kb"):
            host_mem = f"{_fmt((mem.get('available_kb') or 0) / 1048576, nd=1)}/{_fmt(mem['total_kb'] / 1048576, nd=1)} GiB free"
            if g.get("unified"):
                host_mem += " (unified)"
        bad = [x for x in r["guards"] if severity.named(x["severity"]).rank >= severity.WARN.rank]
        guards = "—" if not r["guards"] else ("ok" if not bad else
                                             ", ".join(f"{severity.named(x['severity']).mark} {x['key']}"
                                                       for x in bad))
        rows.append((r["name"], r["state"], gpu, temp, power, clock, _fmt(g.get("util_pct"), "%"), reasons,
                     host_mem, guards))
        if r["error"] and r["state"] != NodeState.LIVE.value:
            notes.append(f"{r['name']}: {r['error']}")
        # What the agent could not read (docker refused, a /proc file missing): as --json has it under tick.errors.
        for err in dict.fromkeys((t or {}).get("errors") or ()):
            notes.append(f"{r['name']}: {' '.join(str(err).split())[:300]}")
        for c in r["containers"]:
            cap = f"cap {c['memory_limit_b'] / 2**30:.0f} GiB" if c.get("memory_limit_b") else "no memory cap"
            notes.append(f"{r['name']}: container {c['name']} {c.get('state') or '?'}"
                         + (f" ({c['health']})" if c.get("health") else "") + f", {cap}"
                         + (", OOM-killed" if c.get("oom_killed") else ""))
        for name, w in (r.get("workloads") or {}).items():
            notes.append(f"{r['name']}: workload {name}: " + workload_words(w))
        for x in bad:
            sev = severity.named(x["severity"])
            notes.append(f"{r['name']}: {sev.mark} {x['title']} — {sev.says}: {x['reason']}" +
                         (f"\n    fix: {x['fix']}" if x["fix"] else ""))
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in (head, *rows)]
    return "\n".join(lines + ([""] + notes if notes else []))


def workload_words(w: dict[str, Any]) -> str:
    """`GPU 89.3 GiB (PID 4242) + cgroup 5.1 GiB of a 100 GiB cap = 94.4 GiB`, or what is not measured and why."""
    def gib(b: float) -> str:
        return f"{b / 2**30:.1f} GiB"
    gpu = f"GPU {gib(w['gpu_b'])}" if w["gpu_b"] is not None else "GPU not measured"
    if w["procs"]:
        gpu += " (PID " + ", ".join(str(p["pid"]) for p in w["procs"][:3]) + ")"
    cg = f"cgroup {gib(w['cgroup_b'])}" if w["cgroup_b"] is not None else "cgroup not measured"
    if w["cap_b"]:
        cg += f" of a {gib(w['cap_b'])} cap"
    text = f"{gpu} + {cg}" + (f" = {gib(w['total_b'])}" if w["measured"] else "")
    return text + (f" ({w['reason']})" if w["reason"] else "")


async def _wait_containers(mon: ClusterMonitor, timeout: float) -> None:
    import asyncio

    from ..nodes.samples import NodeState

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = [nm for nm in mon.nodes.values() if nm.state == NodeState.LIVE and not _containers_known(nm)]
        if not waiting:
            return
        await asyncio.sleep(0.05)


def _containers_known(nm: NodeMonitor) -> bool:
    return any(t.containers is not None or any(e.startswith("docker") for e in t.errors) for t in nm.history)


async def run(args: argparse.Namespace) -> int:
    from ..collector.attach import AttachedMonitor

    cluster = load(args)
    # Attached to the cluster's collector when one runs (its readings at once, no agent of our own); else ours.
    mon = AttachedMonitor(cluster, history=16)
    mon.subscribe_status(lambda text, severity: print(f"sparkconsole status: {text}", file=sys.stderr, flush=True))
    await mon.start()
    try:
        return await _report(args, cluster, mon)   # `status | head`: the reader leaving is cli.main's (exit 141)
    finally:
        # Ctrl-C must end the command: a stop that hangs is cut after STOP_S; a local agent then ends on its stdin's
        # end-of-file as we exit.

        from ..nodes.transport import bounded
        try:
            await bounded(mon.stop(), STOP_S)
        except TimeoutError:
            print(f"sparkconsole: the node monitors did not stop within {STOP_S:g} s; leaving", file=sys.stderr)


async def _report(args: argparse.Namespace, cluster: ClusterConfig, mon: ClusterMonitor) -> int:
    import asyncio
    import json

    await mon.wait_first_ticks(args.timeout)
    await _wait_containers(mon, min(CONTAINER_WAIT_S, args.timeout))
    while True:
        records = [node_record(nm) for nm in mon.nodes.values()]
        if args.json:
            print(json.dumps({"cluster": cluster.source, "time": time.time(), "nodes": records}), flush=True)
        else:
            if args.watch and sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")
            print(f"{cluster.source} — {time.strftime('%H:%M:%S')}")
            print(render_table(records), flush=True)
        if not args.watch:
            return 1 if any(is_down(nm) for nm in mon.nodes.values()) else 0
        await asyncio.sleep(max(cluster.agent_interval_s, 1.0))
