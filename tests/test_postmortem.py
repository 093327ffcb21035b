"""Post-mortems: each verdict from recorder data in a real SQLite file, and the real path over the sshd test nodes
(a silent partition then a cut connection; the agent killed), written by the Recorder as the incidents happen."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.nodes.samples import NodeState, Tick
from sparkconsole.recorder.feed import Recorder
from sparkconsole.recorder.postmortem import build, one_line, to_markdown
from sparkconsole.recorder.reader import RecorderReader, parse_at
from sparkconsole.recorder.store import RecorderStore
from tests.helpers import until

GIB_KB = 1 << 20
T0 = 1_700_000_000.0
ROOT = Path(__file__).resolve().parent.parent


def tick(t, *, avail_gib=100.0, temp=60.0, reasons=0, psi_full=0.0, swap_free_gib=0.0, cg=None):
    d = {"type": "tick", "seq": int((t - T0) * 2), "time": t,
         "gpus": [{"index": 0, "temp_c": temp, "slowdown_c": 89, "power_w": 90, "reasons_mask": reasons}],
         "mem": {"total_kb": 128 * GIB_KB, "available_kb": int(avail_gib * GIB_KB), "cached_kb": 2 * GIB_KB,
                 "swap_total_kb": 16 * GIB_KB, "swap_free_kb": int(swap_free_gib * GIB_KB)},
         "pressure": {"some_avg10": psi_full * 2, "full_avg10": psi_full}}
    if cg:
        d["cgroups"] = [{"name": "vllm_node", "current_b": cg[0], "max_b": cg[1]}]
    return Tick.from_json(d, t)


def scenario(tmp_path, shape, *, incident=("state", {"state": "DOWN", "error": "no tick for 9.0 s"}),
             other_ticks=True, stale_first=True, containers=None) -> dict:
    from sparkconsole.config import RecorderSettings
    path = tmp_path / "r.sqlite"
    # rows stamped in 2023 (T0): retention, which runs after the writer's first batch, must keep them
    store = RecorderStore(path, RecorderSettings(full_rate_hours=1e6, keep_days=1e5))
    store.put_event("*", "session", {"endpoints": {"spark1-vllm": "spark1"}}, T0 - 1)
    store.put_event("spark1", "state", {"state": "LIVE"}, T0)
    for i in range(100):
        store.put_endpoint("spark1-vllm", {"healthy": True, "running": 4 + i // 10, "kv_usage": i / 100}, T0 + 20 + i)
    if containers:
        store.put_event("spark1", "containers", containers[0], T0)
    for i in range(240):                                  # 2 minutes at 2 Hz, then the incident
        t = T0 + i / 2
        store.put_tick("spark1", tick(t, **shape(i / 2)), container="vllm_node")
        store.put_tick("spark2", tick(t), container="vllm_node")
    if stale_first:
        store.put_event("spark1", "state", {"state": "STALE", "error": "no tick for 1.6 s"}, T0 + 121)
    store.put_event("spark1", *incident, T0 + 125)
    if other_ticks:
        for i in range(10):
            store.put_tick("spark2", tick(T0 + 125 + i / 2))
    store.close()
    r = RecorderReader(path)
    return build(r, "spark1", audit_entries=[])


def test_memory_exhaustion_verdict(tmp_path):
    pm = scenario(tmp_path, lambda t: {"avail_gib": max(60 - t / 2, 1.5), "psi_full": min(t / 4, 40),
                                       "swap_free_gib": max(16 - t / 10, 0)})
    assert pm["verdict"] == "memory-exhaustion"
    ev = " | ".join(pm["evidence"])
    assert "MemAvailable fell 57.5 → 1.5 GiB" in ev and "PSI full peaked at 30%" in ev and "swap used grew" in ev
    assert "hung (STALE, then DOWN" in ev
    md = to_markdown(pm)
    assert md.startswith("# Post-mortem: spark1 — down at") and "**Verdict: memory-exhaustion**" in md
    assert "| MemAvailable GiB | 57.5 |" in md
    assert pm["engine"]["spark1-vllm"]["last"]["running"] == 13 and "Engine spark1-vllm (100 polls)" in md


def test_thermal_verdict(tmp_path):
    pm = scenario(tmp_path, lambda t: {"temp": min(60 + t / 3, 92), "reasons": 0x40 if t > 100 else 0})
    assert pm["verdict"] == "thermal"
    assert any("GPU reached 92 °C (slowdown at 89 °C)" in e for e in pm["evidence"])
    assert pm["clock_reasons"] == ["hw_thermal"]


def test_container_oom_kill_verdict(tmp_path):
    running = [{"name": "vllm_node", "state": "running", "oom_killed": False, "exit_code": 0}]
    dead = [{"name": "vllm_node", "state": "exited", "oom_killed": True, "exit_code": 137}]
    pm = scenario(tmp_path, lambda t: {"cg": (int((1 + t / 10) * 2**30), 13 * 2**30)},
                  incident=("containers", dead), containers=(running,), stale_first=False)
    assert pm["verdict"] == "container-oom-kill"
    assert pm["evidence"][0] == "container vllm_node exited (exit 137, OOM-killed)"
    assert "container memory rose 1536 → 13261 MiB of a 13312 MiB cap" in pm["evidence"][1]


def test_network_loss_and_unknown_verdicts(tmp_path):
    pm = scenario(tmp_path, lambda t: {})
    assert pm["verdict"] == "network-loss"
    assert pm["evidence"][0] == "other node(s) kept ticking: spark2" and "hung" in pm["evidence"][-1]
    (tmp_path / "r.sqlite").unlink()
    pm = scenario(tmp_path, lambda t: {}, other_ticks=False, stale_first=False,
                  incident=("state", {"state": "DOWN", "error": "agent ended (exit 0)"}))
    assert pm["verdict"] == "unknown"
    assert any("every node went silent at once" in e for e in pm["evidence"])
    assert "the agent's stream ended (agent ended (exit 0))" in pm["evidence"]


def test_postmortem_command_md_and_json_and_bad_input(tmp_path):
    scenario(tmp_path, lambda t: {"avail_gib": max(60 - t / 2, 1.5)})
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")}
    run = lambda *a: subprocess.run([sys.executable, "-m", "sparkconsole", *a], capture_output=True, text=True,
                                    cwd=ROOT, env=env, timeout=60)
    r = run("postmortem", "spark1", "--file", str(tmp_path / "r.sqlite"))
    assert r.returncode == 0 and "**Verdict: memory-exhaustion**" in r.stdout, r.stderr
    r = run("postmortem", "spark1", "--file", str(tmp_path / "r.sqlite"), "--format", "json")
    assert json.loads(r.stdout)["verdict"] == "memory-exhaustion"
    r = run("postmortem", "spark9", "--file", str(tmp_path / "r.sqlite"))
    assert r.returncode == 2 and "spark9" in r.stderr and "spark1" in r.stderr and "Traceback" not in r.stderr
    r = run("postmortem", "spark1", "--file", str(tmp_path / "r.sqlite"), "--at", "yesterday-ish")
    assert r.returncode == 2 and "--at" in r.stderr and "-15m" in r.stderr
    assert parse_at("-15m", now=1000.0) == 100.0


def agent_pids(sshd_node) -> list[int]:
    return [p for p in sshd_node.session_pids()
            if "--watch-stdin" not in " ".join(psutil.Process(p).cmdline()) and "agent" in " ".join(
                psutil.Process(p).cmdline())] or [p for p in sshd_node.session_pids()
                                                   if psutil.Process(p).name().startswith("python")]


@pytest.mark.sshd
async def test_real_incidents_over_sshd_get_network_loss_post_mortems(sshd_live, tmp_path):
    cluster = sshd_live.cluster_config(interval_s=0.25)
    rec = Recorder.open(cluster, tmp_path / "r.sqlite")
    pms: list[dict] = []
    rec.on_postmortem = pms.append
    mon = ClusterMonitor(cluster)
    rec.attach(mon)
    await mon.start()
    try:
        n1, n2 = mon.nodes["node1"], mon.nodes["node2"]
        await until(lambda: len(n1.history) > 8 and len(n2.history) > 8, 30, "both nodes ticking")
        # 1) a silent partition, then the connection cut: the stream hung, node2 kept ticking
        sshd_live[0].freeze()
        await until(lambda: n1.state == NodeState.STALE, 30, "node1 STALE")
        sshd_live[0].kill()
        await until(lambda: pms, 30, "a post-mortem for node1")
        first = pms[0]
        assert first["node"] == "node1" and first["verdict"] == "network-loss", first
        assert any("hung (STALE, then DOWN" in e for e in first["evidence"])
        assert first["other_nodes_ticking"] == {"node2": True}
        # 2) the agent on node2 killed: its stream ended
        for pid in agent_pids(sshd_live[1]):
            os.kill(pid, signal.SIGKILL)
        await until(lambda: len(pms) >= 2, 30, "a post-mortem for node2")
        second = pms[1]
        assert second["node"] == "node2" and second["incident"]["kind"] == "down"
        assert any("stream ended" in e for e in second["evidence"]), second["evidence"]
        assert one_line(second).startswith("post-mortem node2: ")
    finally:
        await mon.stop()
        await rec.wait_postmortems()
        rec.close()
    kinds = [e["kind"] for e in RecorderReader(tmp_path / "r.sqlite").events(None, 0, 2e9)]
    assert kinds.count("postmortem") >= 2


# ---------------------------------------------------------------- what grew (issue 37 item 3)

def gpu_tick(t, grown_gib):
    """A GB10-shaped tick: PID 4242's GPU memory grows, its container's cgroup (the part its cap sees) stays flat."""
    d = json.loads(json.dumps({"type": "tick", "seq": int((t - T0) * 2), "time": t,
                               "mem": {"total_kb": 128 * GIB_KB, "available_kb": int((60 - grown_gib) * GIB_KB)},
                               "gpu_procs": {"read_at": T0 + int((t - T0) / 2) * 2, "procs": [
                                   {"pid": 4242, "used_b": int((40 + grown_gib) * 2**30), "comm": "python3",
                                    "container": "vllm_node"},
                                   {"pid": 77, "used_b": 6 * 2**30, "comm": "python3", "container": "embedder"}]},
                               "cgroups": [{"name": "vllm_node", "current_b": 5 * 2**30, "max_b": 100 * 2**30},
                                           {"name": "embedder", "current_b": 2**30}]}))
    return Tick.from_json(d, t)


def record_gpu_runaway(tmp_path, incident, extra=()):
    from sparkconsole.config import RecorderSettings
    from sparkconsole.recorder.workloads import WorkloadLog
    path = tmp_path / "r.sqlite"
    # rows stamped in 2023 (T0): retention, which runs after the writer's first batch, must keep them
    store, log = RecorderStore(path, RecorderSettings(full_rate_hours=1e6, keep_days=1e5)), WorkloadLog()
    store.put_event("spark1", "state", {"state": "LIVE"}, T0)
    store.put_event("spark1", "containers", [{"name": "vllm_node", "state": "running", "exit_code": 0}], T0)
    n = 0
    for i in range(240):
        t = T0 + i / 2
        tk = gpu_tick(t, max(0.0, (t - T0 - 60) * 0.97))
        store.put_tick("spark1", tk, container="vllm_node")
        store.put_tick("spark2", tick(t), container="vllm_node")
        snap = log.due("spark1", tk)
        if snap is not None:
            n += 1
            store.put_event("spark1", "workloads", snap, t)
    for kind, data, at in extra:
        store.put_event("spark1", kind, data, at)
    store.put_event("spark1", *incident, T0 + 121)
    store.close()
    return build(RecorderReader(path), "spark1", audit_entries=[]), n


def test_a_gpu_runaway_names_the_process_and_the_container_and_the_cap_that_did_not_fire(tmp_path):
    pm, n = record_gpu_runaway(tmp_path, ("state", {"state": "DOWN", "error": "no tick for 9.0 s"}))
    assert pm["verdict"] == "memory-exhaustion"
    assert pm["evidence"][0].startswith("vllm_node grew 5") and "GPU memory +5" in pm["evidence"][0]
    assert "(PID 4242 python3), its cgroup +0.0 GiB of a 100.0 GiB cap — the cap did not see the GPU memory" in \
        pm["evidence"][0]
    assert [g["name"] for g in pm["workloads_grew"]] == ["vllm_node"]       # the embedder held steady
    assert "## What grew" in to_markdown(pm)
    # recorded when it moved (every 2-s reading of the minute it grew), not every tick: far fewer rows than ticks
    assert 25 <= n <= 40, n


def test_the_guard_s_stop_is_its_own_verdict_naming_what_grew(tmp_path):
    stop = {"node": "spark1", "container": "vllm_node", "estimate_s": 12.5, "result": "stopped",
            "why": "spark1: unified memory exhausted in ~12 s at the current rate (…)"}
    dead = [{"name": "vllm_node", "state": "exited", "oom_killed": False, "exit_code": 137}]
    pm, _ = record_gpu_runaway(tmp_path, ("containers", dead), extra=[("protect", stop, T0 + 119)])
    assert pm["verdict"] == "guard-stop"
    assert pm["evidence"][0].startswith("the guard stopped vllm_node ~12.5 s before the node's memory")
    assert pm["evidence"][1].startswith("vllm_node grew") and "PID 4242 python3" in pm["evidence"][1]
    assert "guard-stop" in one_line(pm) and "PID 4242" in one_line(pm)


def test_a_replay_plays_each_workload_s_memory_back(tmp_path):
    from sparkconsole.nodes.workload_memory import workload_memory
    from sparkconsole.recorder.replay import agent_lines
    record_gpu_runaway(tmp_path, ("state", {"state": "DOWN", "error": "no tick for 9.0 s"}))
    lines = agent_lines(RecorderReader(tmp_path / "r.sqlite"), "spark1", T0, T0 + 120)
    w = workload_memory(Tick.from_json(json.loads(lines[-1]), 0))
    assert w["vllm_node"].gpu_b > 90 * 2**30 and w["vllm_node"].cgroup_b == 5 * 2**30
    assert w["vllm_node"].cap_b == 100 * 2**30 and w["embedder"].gpu_b == 6 * 2**30
    assert w["vllm_node"].procs[0].pid == 4242 and w["vllm_node"].procs[0].comm == "python3"


def test_what_grew_counts_a_stopped_workload_at_its_peak():
    """The guard stopped it: the last readings no longer have the container, its peak is what it grew to."""
    from sparkconsole.recorder.workloads import growth
    g = 2**30
    rows = [{"read_at": 0, "w": {"vllm_node": [40 * g, 5 * g, 100 * g]}, "p": [[4242, 40 * g, "vllm", "vllm_node"]]},
            {"read_at": 30, "w": {"vllm_node": [90 * g, 5 * g, 100 * g]}, "p": [[4242, 90 * g, "vllm", "vllm_node"]]},
            {"read_at": 32, "w": {}, "p": []}]
    (top,) = growth(rows)
    assert (top["name"], top["gpu_b"], top["cgroup_b"], top["procs"]) == ("vllm_node", 50 * g, 0,
                                                                           [[4242, "vllm", 50 * g]])
