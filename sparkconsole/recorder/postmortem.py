"""Post-mortems from the flight recorder: why did a node go DOWN, reboot, or lose its container?

    pm = build(RecorderReader(path), "spark2", at=None)      # the latest incident; or at=T: the latest at or before T
    print(to_markdown(pm))                                    # or json.dumps(pm)

An incident is a DOWN state, a new boot id (reboot), or the node's container leaving `running` (exit code,
OOMKilled). The post-mortem gathers the LOOKBACK_S seconds before it: memory, PSI, swap, temperatures, power,
clock reasons, the container's cgroup and state, what each workload held (its processes' GPU memory and its
cgroup: recorder/workloads.py) and which one grew, the state changes, the audit log's commands on the node, and
whether the other nodes kept ticking. Verdicts, first match wins, each with its evidence:

  guard-stop           the console's guard stopped the container before the node's memory ran out (protect.py):
                       what grew (the process and the container), and that its cap did not see the GPU memory
  container-oom-kill   the container's last state says OOMKilled
  memory-exhaustion    MemAvailable ended under LOW_MEM_FRAC of MemTotal, or memory PSI full ≥ PSI_FULL_BAD,
                       or an exhaustion estimate was active when it happened (a GB10 freezes, then goes silent)
  thermal              the GPU reached its slowdown temperature or reported thermal / HW-slowdown clock reasons
  network-loss         memory and temperature were fine and another node kept ticking: the link or this node's
                       SSH went; the agent's stream either ended (closed) or hung (STALE before DOWN)
  unknown              none of the above (no readings, or everything went silent at once: the console's side)
"""

from __future__ import annotations

import time
from typing import Any

from .. import audit
from ..errors import UserError
from ..nodes.samples import REASON_BITS, reasons_from_mask
from .reader import RecorderReader
from .workloads import growth, words

LOOKBACK_S = 120.0
LOW_MEM_FRAC = 0.03
PSI_FULL_BAD = 10.0
THERMAL_BITS = REASON_BITS["sw_thermal"] | REASON_BITS["hw_thermal"] | REASON_BITS["hw_slowdown"]
AFTER_S = 10.0          # another node "kept ticking" when it ticked within this long after the incident


def incidents(r: RecorderReader, node: str, until: float) -> list[dict[str, Any]]:
    """Every incident of `node` up to `until`, oldest first: {t, kind, detail}."""
    out: list[dict[str, Any]] = []
    prev_boot = None
    prev_running: dict[str, str] = {}
    for e in r.events(node, 0, until, ("state", "hello", "containers")):
        d = e["data"] or {}
        if e["kind"] == "state" and d.get("state") == "DOWN":
            out.append({"t": e["t"], "kind": "down", "detail": d.get("error") or "connection lost"})
        elif e["kind"] == "hello":
            boot = d.get("boot_id")
            if prev_boot is not None and boot and boot != prev_boot:
                out.append({"t": e["t"], "kind": "reboot", "detail": f"boot id {prev_boot[:8]}… → {boot[:8]}…"})
            prev_boot = boot or prev_boot
        elif e["kind"] == "containers":
            for c in d:
                was = prev_running.get(c.get("name"))
                if was == "running" and c.get("state") != "running":
                    out.append({"t": e["t"], "kind": "container", "container": c.get("name"),
                                "detail": f"container {c.get('name')} {c.get('state')} (exit {c.get('exit_code')}"
                                          + (", OOM-killed)" if c.get("oom_killed") else ")"),
                                "oom_killed": bool(c.get("oom_killed")), "exit_code": c.get("exit_code")})
                prev_running[c.get("name")] = c.get("state")
    return out


def _series(rows: list[dict[str, Any]], col: str) -> dict[str, Any] | None:
    vals = [(x["t"], x[col]) for x in rows if x.get(col) is not None]
    if not vals:
        return None
    ys = [v for _, v in vals]
    return {"first": ys[0], "last": ys[-1], "min": min(ys), "max": max(ys), "n": len(ys)}


def build(r: RecorderReader, node: str, at: float | None = None, *, audit_entries: list[audit.AuditEntry] | None = None
          ) -> dict[str, Any]:
    if node not in r.nodes():
        raise UserError(f"no recorded node named {node!r}" + _partial(r), field="NODE",
                        fix="name one of: " + (", ".join(r.nodes()) or "(none recorded yet)"))
    until = time.time() + 1 if at is None else at
    found = incidents(r, node, until + 5)
    inc = next((i for i in reversed(found) if i["t"] <= until + 5), None)
    if inc is None:
        if at is None:
            raise UserError(f"{node} has no recorded incident (DOWN, reboot, container exit)" + _partial(r),
                            field="NODE", fix="pass --at TIME to look at a given moment anyway")
        inc = {"t": at, "kind": "asked", "detail": "no incident recorded; the moment asked for"}
    t = inc["t"]
    rows = r.ticks(node, t - LOOKBACK_S, t)
    last = rows[-1] if rows else None
    series = {c: _series(rows, c) for c in ("avail_kb", "cached_kb", "swap_free_kb", "psi_some", "psi_full", "temp_c",
                                              "power_w", "clock_mhz", "util_pct", "cg_cur_b")}
    reasons: set[str] = set()
    for x in rows:
        if x.get("reasons"):
            reasons.update(reasons_from_mask(int(x["reasons"])))
    states = [{"t": e["t"], **(e["data"] or {})} for e in r.events(node, t - LOOKBACK_S, t + 1, ("state",))]
    alerts = [e["data"] for e in r.events(node, t - LOOKBACK_S, t + 1, ("alert", "protect"))]
    cont = r.last_event_before(node, "containers", t + 1)
    # "Kept ticking": ticks from the other node after this one went silent (its last tick, not the DOWN,
    # which a hang reaches only seconds later).
    silent_from = last["t"] if last else t
    others = {}
    for other in r.nodes():
        if other != node:
            others[other] = len(r.ticks(other, silent_from + 0.001, t + AFTER_S)) >= 2
    session = r.last_event_before("*", "session", t + 1)
    eps = [e for e, n in ((session or {}).get("data") or {}).get("endpoints", {}).items() if n == node]
    engine = {}
    for ep in eps:
        samples = r.endpoint_samples(ep, t - LOOKBACK_S, t + 1)
        if samples:
            keep = ("healthy", "running", "waiting", "kv_usage", "gen_tps", "ttft_p95_s", "error")
            engine[ep] = {"samples": len(samples), "first": {k: samples[0].get(k) for k in keep},
                          "last": {k: samples[-1].get(k) for k in keep}}
    entries = audit_entries if audit_entries is not None else audit.read(200, node=node)
    commands = [{"t": e.time, "action": e.action, "command": e.command} for e in entries
                if t - 3600 <= e.time <= t + 1][-10:]
    base = r.last_event_before(node, "workloads", t - LOOKBACK_S)
    held = ([base["data"]] if base else []) + [e["data"] for e in r.events(node, t - LOOKBACK_S, t + 1, ("workloads",))]
    held = [h for h in held if isinstance(h, dict)]
    grew = growth(held)
    grew_span = (held[-1].get("read_at") or 0) - (held[0].get("read_at") or 0) if len(held) > 1 else 0.0
    verdict, evidence = _verdict(inc, last, series, reasons, states, alerts, others, rows)
    if grew and verdict in ("memory-exhaustion", "guard-stop", "container-oom-kill", "unknown"):
        evidence.insert(1 if verdict != "memory-exhaustion" else 0, words(grew[0], grew_span))
    return {"node": node, "time": t, "incident": inc, "verdict": verdict, "evidence": evidence,
            "unreadable": r.gap_texts(t - LOOKBACK_S, t + AFTER_S), "file": str(r.path),
            "lookback_s": LOOKBACK_S, "ticks": len(rows), "last_tick": last, "series": series,
            "clock_reasons": sorted(reasons), "states": states, "alerts": alerts,
            "containers": cont["data"] if cont else None, "engine": engine, "other_nodes_ticking": others,
            "commands": commands, "workloads_grew": grew, "workloads_span_s": grew_span}


def _partial(r: RecorderReader) -> str:
    """An answer from a damaged file says so, even when the answer is "nothing found"."""
    gaps = r.gap_texts()
    return f" in what is readable (the file is damaged: {gaps[0]}" + (f", and {len(gaps) - 1} more" if len(gaps) > 1
                                                                      else "") + ")" if gaps else ""


def _verdict(inc: dict[str, Any], last: dict[str, Any] | None, series: dict[str, dict[str, Any] | None],
             reasons: set[str], states: list[dict[str, Any]], alerts: list[Any], others: dict[str, bool],
             rows: list[dict[str, Any]]) -> tuple[str, list[str]]:
    ev: list[str] = []
    stopped = [a for a in alerts if isinstance(a, dict) and a.get("result") == "stopped"
               and a.get("container") == inc.get("container")]
    if inc["kind"] == "container" and stopped:
        ev.append(f"the guard stopped {inc.get('container')} ~{stopped[-1].get('estimate_s')} s before the node's "
                  f"memory was estimated to run out: {stopped[-1].get('why')}")
        ev.append(inc["detail"])
        return "guard-stop", ev
    if inc.get("oom_killed") or (inc["kind"] == "container" and inc.get("exit_code") == 137 and
                                 _near_cap(rows)):
        ev.append(inc["detail"])
        cg = series.get("cg_cur_b")
        if cg:
            ev.append(f"container memory rose {cg['first'] / 2**20:.0f} → {cg['max'] / 2**20:.0f} MiB"
                      + (f" of a {last['cg_max_b'] / 2**20:.0f} MiB cap" if last and last.get("cg_max_b") else ""))
        return "container-oom-kill", ev
    av, total = series.get("avail_kb"), (last or {}).get("total_kb")
    psi_full = series.get("psi_full")
    exhaust = [a for a in alerts if isinstance(a, dict) and str(a.get("key", "")).endswith(":node") and a.get("active")]
    if av and total and av["last"] < LOW_MEM_FRAC * total:
        ev.append(f"MemAvailable fell {av['first'] / 2**20:.1f} → {av['last'] / 2**20:.1f} GiB of "
                  f"{total / 2**20:.0f} GiB in the last {LOOKBACK_S:.0f} s")
    if psi_full and psi_full["max"] >= PSI_FULL_BAD:
        ev.append(f"memory PSI full peaked at {psi_full['max']:.0f}% (tasks stalled on reclaim)")
    if exhaust:
        ev.append("exhaustion warning was active: " + exhaust[-1].get("message", ""))
    sw = series.get("swap_free_kb")
    if ev and sw and sw["first"] - sw["last"] > 0:
        ev.append(f"swap used grew by {(sw['first'] - sw['last']) / 2**20:.1f} GiB")
    if ev:
        return "memory-exhaustion", ev + _stream(states)
    temp = series.get("temp_c")
    slowdown = (last or {}).get("slowdown_c")
    hot = sorted(reasons & {"sw_thermal", "hw_thermal", "hw_slowdown"})
    if temp and slowdown and temp["max"] >= slowdown:
        ev.append(f"GPU reached {temp['max']:.0f} °C (slowdown at {slowdown:.0f} °C), from {temp['first']:.0f} °C")
    if hot:
        ev.append("clock reasons: " + ", ".join(hot))
    if ev:
        return "thermal", ev + _stream(states)
    if inc["kind"] == "down" and any(others.values()):
        ok = [n for n, v in others.items() if v]
        ev.append(f"other node(s) kept ticking: {', '.join(ok)}")
        if av and total:
            ev.append(f"memory was fine: MemAvailable {av['last'] / 2**20:.1f} GiB of {total / 2**20:.0f} GiB")
        if temp:
            ev.append(f"temperature was fine: {temp['last']:.0f} °C")
        return "network-loss", ev + _stream(states)
    ev.append(inc["detail"])
    if inc["kind"] == "down" and others and not any(others.values()):
        ev.append("every node went silent at once: the console's own network or host, not the node")
    if not rows:
        ev.append("no readings recorded before it")
    return "unknown", ev + _stream(states)


def _near_cap(rows: list[dict[str, Any]]) -> bool:
    last = next((x for x in reversed(rows) if x.get("cg_cur_b") and x.get("cg_max_b")), None)
    return bool(last and last["cg_cur_b"] >= 0.9 * last["cg_max_b"])


def _stream(states: list[dict[str, Any]]) -> list[str]:
    """How the agent's stream ended: hung (STALE first: ticks stopped, connection still open) or closed."""
    names = [s.get("state") for s in states]
    if "DOWN" not in names:
        return []
    i = len(names) - 1 - names[::-1].index("DOWN")
    err = states[i].get("error") or ""
    if i > 0 and names[i - 1] == "STALE":
        return [f"the agent's stream hung (STALE, then DOWN: {err})"]
    return [f"the agent's stream ended ({err})"]


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def to_markdown(pm: dict[str, Any]) -> str:
    inc = pm["incident"]
    lines = [f"# Post-mortem: {pm['node']} — {inc['kind']} at {_when(pm['time'])}", "",
             f"**Verdict: {pm['verdict']}**", ""]
    lines += [f"- {e}" for e in pm["evidence"]]
    if pm.get("unreadable"):
        lines += ["", "**Partial: part of the recorder file is unreadable; everything below is only what could be "
                  "read, and the verdict may miss what was there.**", ""]
        lines += [f"- {g}" for g in pm["unreadable"]]
        lines += ["", f"The readable part can be copied into a new file: `sparkconsole record repair {pm['file']}`"]
    readable = " readable" if pm.get("unreadable") else ""
    lines += ["", f"## The last {pm['lookback_s']:.0f} s ({pm['ticks']} ticks{readable})", "",
              "| reading | first | min | max | last |", "|---|---|---|---|---|"]
    units = {"avail_kb": ("MemAvailable GiB", 2**20), "cached_kb": ("page cache GiB", 2**20),
             "swap_free_kb": ("swap free GiB", 2**20), "psi_some": ("PSI some %", 1), "psi_full": ("PSI full %", 1),
             "temp_c": ("GPU °C", 1), "power_w": ("GPU W", 1), "clock_mhz": ("SM MHz", 1), "util_pct": ("GPU util %", 1),
             "cg_cur_b": ("container MiB", 2**20)}
    for col, s in pm["series"].items():
        if s:
            name, div = units[col]
            lines.append(f"| {name} | " + " | ".join(f"{s[k] / div:.1f}" for k in ("first", "min", "max", "last")) + " |")
    if pm.get("workloads_grew"):
        lines += ["", "## What grew (GPU memory per process from NVML, each container's cgroup)", ""]
        lines += [f"- {words(g, pm.get('workloads_span_s') or 0)}" for g in pm["workloads_grew"][:5]]
    if pm["clock_reasons"]:
        lines += ["", "Clock reasons seen: " + ", ".join(pm["clock_reasons"])]
    if pm["containers"]:
        lines += ["", "## Containers", ""] + [
            f"- {c.get('name')}: {c.get('state')} exit {c.get('exit_code')}"
            + (" OOM-killed" if c.get("oom_killed") else "") for c in pm["containers"]]
    lines += ["", "## State changes", ""] + [f"- {_when(s['t'])} {s.get('state')}"
                                              + (f": {s['error']}" if s.get("error") else "") for s in pm["states"]]
    if pm["alerts"]:
        lines += ["", "## Alerts and guard actions", ""] + [
            f"- {a.get('message') or a.get('why') or a}" for a in pm["alerts"]]
    for ep, e in pm.get("engine", {}).items():
        f, last = e["first"], e["last"]
        lines += ["", f"Engine {ep} ({e['samples']} polls): running {f.get('running')} → {last.get('running')}, "
                  f"KV {f.get('kv_usage')} → {last.get('kv_usage')}, gen t/s {f.get('gen_tps')} → {last.get('gen_tps')}"
                  + (f", last error: {last['error']}" if last.get("error") else "")]
    if pm["other_nodes_ticking"]:
        lines += ["", "Other nodes after it: " + ", ".join(
            f"{n} {'kept ticking' if v else 'silent'}" for n, v in pm["other_nodes_ticking"].items())]
    lines += ["", "## Last commands the console ran on it", ""]
    lines += [f"- {_when(c['t'])} {c['action']}: `{c['command']}`" for c in pm["commands"]] or ["- none"]
    return "\n".join(lines) + "\n"


def one_line(pm: dict[str, Any]) -> str:
    partial = f" (partial: {len(pm['unreadable'])} part(s) of the recorder file unreadable)" if pm.get("unreadable") else ""
    return f"post-mortem {pm['node']}: {pm['verdict']}{partial} — " + "; ".join(pm["evidence"][:2])

