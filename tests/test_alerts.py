"""alerts: rules driven by recorded H100 readings (tests/fixtures/agent-h100-load.jsonl: the real agent's output
on an H100 going from idle into a matmul load) and by endpoint snapshots, raise → hold → clear."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkconsole.alerts import TEMP_HYSTERESIS_C, AlertEngine
from sparkconsole.config import NodeConfig, Thresholds
from sparkconsole.nodes.samples import REASON_BITS, ContainerInfo, NodeState, Tick
from sparkconsole.serving.endpoint import EndpointSnapshot

FIXTURES = Path(__file__).parent / "fixtures"


def recorded_ticks() -> list[Tick]:
    ticks = []
    for line in (FIXTURES / "agent-h100-load.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d.get("type") == "tick":
            ticks.append(Tick.from_json(d, received=d["time"]))
    return ticks


TICKS = recorded_ticks()
IDLE, HOT = TICKS[0], max(TICKS, key=lambda t: t.gpus[0].temp_c)


@dataclass
class RecordedNode:
    """What the alert engine reads from a NodeMonitor, filled from recorded ticks."""
    name: str = "spark1"
    state: NodeState = NodeState.LIVE
    last: Tick | None = None
    containers: tuple[ContainerInfo, ...] = ()
    config: NodeConfig = field(default_factory=lambda: NodeConfig(name="spark1", address="127.0.0.1"))
    last_error: str | None = None


def with_gpu(tick: Tick, **changes) -> Tick:
    return dataclasses.replace(tick, gpus=(dataclasses.replace(tick.gpus[0], **changes),))


def engine(**kw) -> tuple[AlertEngine, list]:
    eng = AlertEngine(Thresholds(**kw), clock=lambda: 1000.0)
    events: list = []
    eng.subscribe(events.append)
    return eng, events


# --- temperature -------------------------------------------------------------------------------------------
def test_temperature_alert_raised_once_along_the_recorded_ramp_and_cleared_on_cooldown():
    slowdown = HOT.gpus[0].slowdown_c
    margin = slowdown - HOT.gpus[0].temp_c + 1          # the hottest readings are inside the margin
    eng, events = engine(temp_margin_c=margin)
    node = RecordedNode()
    raised_at = cleared_at = None
    for i, t in enumerate(TICKS):
        node.last = t
        for e in eng.observe_node(node):
            if e.active:
                raised_at = i
            else:
                cleared_at = i
    # the recording wobbles by a degree around the line under load, then cools down when the load stops
    assert [(e.key, e.severity, e.active) for e in events] == [
        ("node:spark1:temp:gpu0", "warn", True), ("node:spark1:temp:gpu0", "warn", False)]
    temps = [t.gpus[0].temp_c for t in TICKS]
    assert raised_at == next(i for i, c in enumerate(temps) if slowdown - c <= margin)
    peak = temps.index(max(temps))
    assert cleared_at == next(i for i in range(peak, len(temps))
                              if slowdown - temps[i] > margin + TEMP_HYSTERESIS_C)
    assert f"{temps[raised_at]:g} °C" in events[0].message
    assert not eng.active


def test_temperature_hysteresis_does_not_flap():
    t_hot = HOT.gpus[0].temp_c
    eng, events = engine(temp_margin_c=HOT.gpus[0].slowdown_c - t_hot)
    node = RecordedNode(last=HOT)
    eng.observe_node(node)
    for temp in (t_hot - 1, t_hot, t_hot - 1.5, t_hot):   # wobbling just under the raise point
        node.last = with_gpu(HOT, temp_c=temp)
        eng.observe_node(node)
    assert len(events) == 1
    node.last = with_gpu(HOT, temp_c=t_hot - 3)
    assert [e.active for e in eng.observe_node(node)] == [False]


def test_past_slowdown_escalates_to_bad():
    eng, events = engine(temp_margin_c=30)
    node = RecordedNode(last=HOT)
    eng.observe_node(node)
    node.last = with_gpu(HOT, temp_c=HOT.gpus[0].slowdown_c)
    out = eng.observe_node(node)
    assert [(e.severity, e.active) for e in out] == [("bad", True)]
    assert [e.severity for e in events] == ["warn", "bad"]


# --- throttling --------------------------------------------------------------------------------------------
def test_power_cap_under_load_is_not_throttling():
    eng, events = engine()
    node = RecordedNode()
    for t in TICKS:                       # the recorded load sits at its power cap (sw_power_cap) throughout
        node.last = t
        eng.observe_node(node)
    assert any("sw_power_cap" in t.gpus[0].reasons for t in TICKS)
    assert not [e for e in events if ":throttle:" in e.key]


@pytest.mark.parametrize("reason", ["hw_thermal", "sw_thermal", "hw_power_brake", "hw_slowdown"])
def test_thermal_and_power_brake_throttling(reason):
    eng, _ = engine()
    mask = HOT.gpus[0].reasons_mask | REASON_BITS[reason]
    tick = Tick.from_json({"type": "tick", "time": HOT.time, "gpus": [{
        "index": 0, "temp_c": HOT.gpus[0].temp_c, "slowdown_c": HOT.gpus[0].slowdown_c, "reasons_mask": mask}]},
        received=HOT.time)
    out = eng.observe_node(RecordedNode(last=tick))
    assert [(e.key, e.severity) for e in out] == [("node:spark1:throttle:gpu0", "bad")]


# --- memory, guards, containers, state ---------------------------------------------------------------------
def test_headroom_floor():
    avail_gib = IDLE.mem.headroom_gib
    eng, _ = engine(headroom_floor_gib=avail_gib + 1)
    out = eng.observe_node(RecordedNode(last=IDLE))
    assert [e.key for e in out] == ["node:spark1:headroom"] and f"{avail_gib:.1f} GiB" in out[0].message
    eng2, _ = engine(headroom_floor_gib=avail_gib - 1)
    assert eng2.observe_node(RecordedNode(last=IDLE)) == []


@dataclass(frozen=True)
class Guard:   # the fields of nodes.guard.GuardResult the engine reads
    key: str
    title: str
    status: str
    reason: str
    fix: str | None = None


def test_guard_turning_bad_and_back():
    eng, _ = engine()
    node = RecordedNode(last=IDLE)
    ok = [Guard("swap", "Swap", "ok", "no swap")]
    bad = [Guard("swap", "Swap", "bad", "swap is on: /dev/sda2", "sudo swapoff -a")]
    assert eng.observe_node(node, ok) == []
    out = eng.observe_node(node, bad)
    assert [(e.key, e.severity, e.active) for e in out] == [("node:spark1:guard:swap", "bad", True)]
    assert eng.observe_node(node, bad) == []
    assert [e.active for e in eng.observe_node(node, ok)] == [False]


def test_real_guard_results_if_available():
    guard = pytest.importorskip("sparkconsole.nodes.guard")
    eng, _ = engine()
    results = guard.evaluate_guards(IDLE.guards, IDLE.mem, (), "vllm_node")
    out = eng.observe_node(RecordedNode(last=IDLE), results)
    bad = {r.key for r in results if r.status == "bad"}
    assert {e.key.rsplit(":", 1)[1] for e in out if ":guard:" in e.key} == bad


def test_container_oom_killed_and_stopped():
    eng, _ = engine()
    node = RecordedNode(last=IDLE, containers=(ContainerInfo(name="vllm_node", state="exited", oom_killed=True,
                                                             exit_code=137),
                                               ContainerInfo(name="other", state="exited")))
    out = eng.observe_node(node)
    assert [(e.key, e.severity) for e in out] == [("node:spark1:container:vllm_node", "bad")]
    node.containers = (ContainerInfo(name="vllm_node", state="running", health="healthy"),)
    assert [e.active for e in eng.observe_node(node)] == [False]


def test_stale_and_down_hold_the_data_alerts():
    eng, _ = engine(temp_margin_c=40)
    node = RecordedNode(last=HOT)
    eng.observe_node(node)
    assert "node:spark1:temp:gpu0" in eng.active
    node.state, node.last_error = NodeState.DOWN, "connection lost"
    out = eng.observe_node(node)
    assert [(e.key, e.severity) for e in out] == [("node:spark1:state", "bad")]
    assert "connection lost" in out[0].message
    assert "node:spark1:temp:gpu0" in eng.active           # held, not cleared on stale data
    node.state = NodeState.CONNECTING                      # reconnecting: still nothing new is known
    assert eng.observe_node(node) == [] and "node:spark1:state" in eng.active
    node.state, node.last = NodeState.LIVE, IDLE
    out = eng.observe_node(node)
    assert sorted((e.key, e.active) for e in out) == [("node:spark1:state", False), ("node:spark1:temp:gpu0", False)]


# --- endpoints ---------------------------------------------------------------------------------------------
def snap(t: float, *, healthy=True, running=2.0, gen=1000.0, prompt=5000.0, error=None, **kw) -> EndpointSnapshot:
    return EndpointSnapshot(name="spark1", url="http://127.0.0.1:8000", kind="vllm", time=t, healthy=healthy,
                            model="m", version=None, running=running, waiting=0.0, kv_usage=0.1, prefix_hit_rate=None,
                            prompt_tps=None, gen_tps=None, ttft_p50_s=None, ttft_p95_s=None, itl_p50_s=None,
                            itl_p95_s=None, error=error, generation_tokens=gen, prompt_tokens=prompt, **kw)


IDLE_POWER = IDLE.gpus[0].power_w          # recorded idle H100: ~73 W
LOAD_POWER = HOT.gpus[0].power_w           # recorded under load: ~700 W


def test_endpoint_down_and_back():
    eng, _ = engine()
    out = eng.observe_endpoint(snap(0, healthy=False, error="connection refused", failures=1))
    assert [(e.key, e.severity) for e in out] == [("endpoint:spark1:down", "warn")]    # one miss: a warning
    assert "connection refused" in out[0].message
    out = eng.observe_endpoint(snap(5, healthy=False, error="connection refused", failures=2))
    assert [(e.key, e.severity, e.active) for e in out] == [("endpoint:spark1:down", "bad", True)]
    assert eng.observe_endpoint(snap(10, healthy=False, error="connection refused", failures=3)) == []
    assert [e.active for e in eng.observe_endpoint(snap(15))] == [False]


def test_one_missed_poll_then_back_never_goes_bad():
    eng, events = engine()
    eng.observe_endpoint(snap(0, healthy=False, error="timed out after 2 s", failures=1))
    eng.observe_endpoint(snap(5))
    assert [(e.severity, e.active) for e in events] == [("warn", True), ("warn", False)]


def test_silent_stall_needs_time_running_requests_and_low_power():
    eng, _ = engine(stall_seconds=30, stall_power_w=IDLE_POWER + 10)
    for t in range(0, 30, 5):                      # tokens frozen, requests running, GPU idle — under 30 s
        assert eng.observe_endpoint(snap(t), IDLE_POWER) == []
    out = eng.observe_endpoint(snap(30), IDLE_POWER)
    assert [(e.key, e.severity) for e in out] == [("endpoint:spark1:stall", "bad")]
    assert "2 request(s) running" in out[0].message
    assert eng.observe_endpoint(snap(35), IDLE_POWER) == []           # held, not raised again
    out = eng.observe_endpoint(snap(40, gen=1001), IDLE_POWER)         # a token: cleared
    assert [e.active for e in out] == [False]


def test_no_stall_when_gpu_is_busy_or_nothing_runs_or_prefill_moves():
    eng, _ = engine(stall_seconds=10, stall_power_w=IDLE_POWER + 10)
    for t in range(0, 60, 5):
        assert eng.observe_endpoint(snap(t), LOAD_POWER) == []          # a long step at full power
    eng, _ = engine(stall_seconds=10, stall_power_w=IDLE_POWER + 10)
    for t in range(0, 60, 5):
        assert eng.observe_endpoint(snap(t, running=0), IDLE_POWER) == []
    eng, _ = engine(stall_seconds=10, stall_power_w=IDLE_POWER + 10)
    for i, t in enumerate(range(0, 60, 5)):                            # a long prompt being prefilled
        assert eng.observe_endpoint(snap(t, prompt=5000.0 + 2048 * i), IDLE_POWER) == []


def test_stall_time_counts_in_a_simulated_servers_seconds():
    eng, _ = engine(stall_seconds=30, stall_power_w=IDLE_POWER + 10)
    eng.observe_endpoint(snap(0, time_scale=10.0), IDLE_POWER)
    assert eng.observe_endpoint(snap(2, time_scale=10.0), IDLE_POWER) == []       # 20 simulated seconds
    out = eng.observe_endpoint(snap(3, time_scale=10.0), IDLE_POWER)               # 30
    assert [e.key for e in out] == ["endpoint:spark1:stall"]


def test_stall_with_unknown_power_is_a_warning():
    eng, _ = engine(stall_seconds=10)
    eng.observe_endpoint(snap(0))
    out = eng.observe_endpoint(snap(10))
    assert [(e.key, e.severity) for e in out] == [("endpoint:spark1:stall", "warn")]
    assert "power unknown" in out[0].message


def test_router_backends_down():
    eng, _ = engine()
    out = eng.observe_endpoint(snap(0, gen=None, running=None, backends_up=1, backends_total=2))
    assert [(e.key, e.severity) for e in out] == [("endpoint:spark1:backends", "warn")]
    out = eng.observe_endpoint(snap(1, gen=None, running=None, backends_up=0, backends_total=2))
    assert [(e.severity, e.active) for e in out] == [("bad", True)]
    out = eng.observe_endpoint(snap(2, gen=None, running=None, backends_up=2, backends_total=2))
    assert [e.active for e in out] == [False]


def test_a_server_loading_its_model_reads_loading_not_unhealthy():
    """A launch, a restart and every server of a roll: the endpoint refuses until the model is loaded (minutes on a
    GB10). Not answered since its container started, it is loading (info, never sent); once it has answered, a
    refusal is unhealthy again; a new start loads again; past LOAD_GRACE_S it is down."""
    from sparkconsole.alerts import LOAD_GRACE_S, LoadWatch
    eng, events = engine()
    loads = LoadWatch()

    def poll(t: float, healthy: bool, started: str | None, age: float | None):
        s = snap(t, healthy=healthy, error=None if healthy else "connection refused", failures=0 if healthy else 3)
        return eng.observe_endpoint(s, None, loads.loading_s(s.name, s.healthy, started, age))
    first = "2026-11-29T06:00:00.1Z"
    out = poll(0, False, first, 12.0) + poll(1, False, first, 75.0)
    assert [(a.key, a.severity, a.message) for a in out] == [
        ("endpoint:spark1:loading", "info", "spark1 loading: no answer yet, its container up 12s (connection refused)")]
    out = poll(2, True, first, 80.0)
    assert [(a.key, a.active) for a in out] == [("endpoint:spark1:loading", False)]
    out = poll(3, False, first, 90.0)                     # it answered since this start: down, not loading
    assert [(a.key, a.severity) for a in out] == [("endpoint:spark1:down", "bad")]
    again = "2026-11-29T06:02:00.5Z"                      # restarted (a roll): loading again, the down cleared
    out = poll(4, False, again, 3.0)
    assert {(a.key, a.severity, a.active) for a in out} == {("endpoint:spark1:loading", "info", True),
                                                             ("endpoint:spark1:down", "bad", False)}
    out = poll(5, False, again, LOAD_GRACE_S + 1)          # never answered, past the launch's own wait: down
    assert {(a.key, a.severity, a.active) for a in out} == {("endpoint:spark1:down", "bad", True),
                                                             ("endpoint:spark1:loading", "info", False)}
    assert loads.loading_s("spark1", False, None, None) is None       # nothing says when it started: the old rules


def test_a_refusing_server_on_a_node_that_lists_containers_is_judged_after_unsure_s():
    """A restart stops the server (docker waits 10 s before it kills), and the agent lists the new start up to 5 s
    later: judged at once, its refusals read unhealthy (BAD from the second poll) and then loading. They are judged
    after UNSURE_S; a start seen before that reads loading at once; a node that lists no containers, at once."""
    from sparkconsole.alerts import UNSURE_S, LoadWatch
    loads = LoadWatch()
    assert not loads.unsure("e", True, 100.0, 90.0)
    assert loads.unsure("e", False, 101.0, 90.0) and loads.unsure("e", False, 100.0 + UNSURE_S, 99.0)
    assert not loads.unsure("e", False, 101.0 + UNSURE_S, 99.0)
    assert not loads.unsure("f", False, 101.0, None)                 # lists no containers: nothing to wait for
    assert not loads.unsure("e", True, 200.0, 90.0) and loads.unsure("e", False, 201.0 + UNSURE_S, 90.0)  # new streak
    eng, _ = engine()
    refused = snap(0, healthy=False, error="refused", failures=2)
    assert eng.observe_endpoint(refused, None, None, True) == []
    assert [a.key for a in eng.observe_endpoint(refused, None, 3.0, True)] == ["endpoint:spark1:loading"]
    assert [a.key for a in eng.observe_endpoint(refused, None, None, False)] == ["endpoint:spark1:down",
                                                                                 "endpoint:spark1:loading"]


def test_a_line_beside_its_source_does_not_name_the_source_again():
    """The events pane and the toasts name the source beside the message: "router: router: 1 of 2 backends down"
    and "router: cleared: router: …" were on screen. The message itself keeps the name (a webhook sends it alone)."""
    from sparkconsole.tui.widgets.alert_log import AlertLog
    eng, _ = engine()
    raised = eng.observe_endpoint(snap(0, gen=None, running=None, backends_up=1, backends_total=2))
    cleared = eng.observe_endpoint(snap(1, gen=None, running=None, backends_up=2, backends_total=2))
    down = eng.observe_endpoint(snap(2, healthy=False, error="connection refused", failures=1))
    back = eng.observe_endpoint(snap(3))
    assert [a.message for a in raised + cleared] == ["spark1: 1 of 2 backends down", "cleared: spark1: 1 of 2 backends down"]
    log = AlertLog()
    for a in raised + cleared + down + back:
        log.add(a)
    assert [line[9:] for line in log.history] == [
        "WARN  spark1: 1 of 2 backends down", "CLEAR spark1: cleared: 1 of 2 backends down",
        "WARN  spark1: unhealthy: connection refused", "CLEAR spark1: cleared: unhealthy: connection refused"]


def test_unpolled_endpoint_says_nothing_and_node_and_endpoint_keys_do_not_collide():
    eng, events = engine(temp_margin_c=40)
    assert eng.observe_endpoint(snap(0, healthy=None)) == []
    eng.observe_node(RecordedNode(last=HOT))
    eng.observe_endpoint(snap(1, healthy=False, error="x", failures=2))
    eng.observe_endpoint(snap(2))                     # endpoint back: the node's alert stays
    assert list(eng.active) == ["node:spark1:temp:gpu0"]
    assert [e.source for e in events] == ["spark1"] * 3
    assert len(eng.history) == 3


def test_a_failing_subscriber_does_not_break_the_engine():
    eng, events = engine()
    eng.subscribe(lambda a: 1 / 0)
    eng.observe_endpoint(snap(0, healthy=False, error="x"))
    assert len(events) == 1 and eng.active
