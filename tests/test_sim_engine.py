"""The simulated vLLM engine honours the scheduler and memory limits a real engine has."""

from __future__ import annotations

import pytest

from sparkconsole.errors import UserError
from sparkconsole.sim.engine import EngineArgs, RequestRejected, SimEngine, step_time
from sparkconsole.sim.profiles import GB10, MODELS
from sparkconsole.sim.routing import InflightTracker, LeastBusy, RoundRobin, SimpleShuffle, make_policy

GPT = MODELS["gpt-oss-120b"]


def drain(engine: SimEngine, limit: int = 100000):
    steps = []
    while engine.has_work() and len(steps) < limit:
        steps.append(engine.step())
    return steps


def test_every_request_gets_exactly_its_tokens_first_then_finished():
    e = SimEngine(GPT, EngineArgs())
    for i in range(5):
        e.add_request(f"r{i}", 100 + 50 * i, 7 + i)
    got: dict[str, list] = {}
    for st in drain(e):
        assert st.duration_s > 0
        for ev in st.events:
            got.setdefault(ev.req_id, []).append(ev)
    for i in range(5):
        evs = got[f"r{i}"]
        assert sum(ev.new_tokens for ev in evs) == 7 + i
        assert evs[0].first and not any(ev.first for ev in evs[1:])
        assert evs[-1].finished and not any(ev.finished for ev in evs[:-1])
    assert e.running == 0 and e.waiting == 0 and e.kv_usage == 0.0
    assert e.counters.generation_tokens == sum(7 + i for i in range(5))


def test_max_num_batched_tokens_caps_each_step_and_chunks_long_prefills():
    e = SimEngine(GPT, EngineArgs(max_num_batched_tokens=512, max_model_len=4096))
    e.add_request("long", 2000, 4)
    e.add_request("short", 100, 4)
    steps = drain(e)
    assert all(s.prefill_tokens + s.decode_tokens <= 512 for s in steps)
    # 2000 prompt tokens at 512 per step: the first token cannot come before the 4th step
    first_step = next(i for i, s in enumerate(steps) if any(ev.first and ev.req_id == "long" for ev in s.events))
    assert first_step == 3


def test_max_num_seqs_caps_running_requests():
    e = SimEngine(GPT, EngineArgs(max_num_seqs=3))
    for i in range(10):
        e.add_request(f"r{i}", 50, 5)
    seen_max = 0
    while e.has_work():
        st = e.step()
        seen_max = max(seen_max, st.num_seqs, e.running)
        assert e.running <= 3
    assert seen_max == 3


def test_max_model_len_refuses_long_requests_with_vllm_message():
    e = SimEngine(GPT, EngineArgs(max_model_len=1024))
    with pytest.raises(RequestRejected, match="maximum context length is 1024"):
        e.add_request("x", 1000, 100)
    e.add_request("ok", 900, 100)
    assert e.waiting == 1


def test_gpu_memory_utilization_sets_kv_capacity_and_overflow_preempts():
    small = SimEngine(GPT, EngineArgs(gpu_memory_utilization=0.62, kv_cache_dtype="fp8"))
    big = SimEngine(GPT, EngineArgs(gpu_memory_utilization=0.80, kv_cache_dtype="fp8"))
    assert big.kv_capacity_tokens > small.kv_capacity_tokens > 0
    # the difference is exactly the extra memory divided by the KV bytes per token
    extra = (0.80 - 0.62) * GB10.memory_bytes / small.kv_bytes_per_token
    assert abs((big.kv_capacity_tokens - small.kv_capacity_tokens) - extra) < 64
    with pytest.raises(UserError, match="does not fit"):
        SimEngine(GPT, EngineArgs(gpu_memory_utilization=0.4))


def test_kv_cache_full_admits_only_what_fits_then_recovers():
    e = SimEngine(MODELS["llama-3.1-8b"], EngineArgs(gpu_memory_utilization=0.16, max_model_len=4096,
                                                     max_num_batched_tokens=65536))
    cap = e.kv_capacity_tokens
    n = cap // 1000 + 5          # more 1000-token prompts than the cache holds at once
    for i in range(n):
        e.add_request(f"r{i}", 990, 10)
    first = e.step()
    assert first.num_seqs < n and e.waiting > 0
    assert e.kv_usage > 0.9
    drain(e)
    assert e.counters.requests_finished == n


def test_tensor_parallel_halves_decode_weight_time_and_pays_allreduce():
    solo, _ = step_time(GPT, GB10, tp=1, decode_ctx=[1100], prefill_chunks=[])
    tp2, _ = step_time(GPT, GB10, tp=2, decode_ctx=[1100], prefill_chunks=[])
    no_link, _ = step_time(GPT, GB10.with_(allreduce_latency_s=0.0), tp=2, decode_ctx=[1100], prefill_chunks=[])
    assert tp2 < solo
    assert tp2 - no_link == pytest.approx(2 * GPT.layers * GB10.allreduce_latency_s, rel=1e-6)
    with pytest.raises(UserError, match="needs 2 GB10 nodes"):
        SimEngine(GPT, EngineArgs(tensor_parallel_size=2), nodes=1)
    SimEngine(GPT, EngineArgs(tensor_parallel_size=2), nodes=2)


def test_abort_frees_kv_and_stops_tokens():
    e = SimEngine(GPT, EngineArgs())
    e.add_request("a", 500, 50)
    e.add_request("b", 500, 50)
    e.step()
    used = e.kv_usage
    e.abort("a")
    assert e.kv_usage < used and e.running == 1
    for st in drain(e):
        assert all(ev.req_id == "b" for ev in st.events)


def test_policies():
    assert LeastBusy().choose([0, 0]) == 0
    assert LeastBusy().choose([3, 1, 1]) == 1
    rr = RoundRobin()
    assert [rr.choose([0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]
    shuffle = SimpleShuffle(seed=1)
    picks = [shuffle.choose([0, 0]) for _ in range(1000)]
    assert 400 < sum(picks) < 600
    with pytest.raises(UserError):
        make_policy("fastest")


def test_tracker_counts_land_late():
    t = InflightTracker(2, update_lag_s=0.05)
    t.started(0, now=1.0)
    assert t.view(1.01) == [0, 0]      # still stale: a burst would pile onto backend 0
    assert t.view(1.06) == [1, 0]
    t.finished(0, now=2.0)
    assert t.view(2.0) == [0, 0] and t.true == [0, 0]
