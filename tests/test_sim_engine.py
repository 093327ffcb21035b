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


def test_a_burst_beyond_the_budget_is_prefilled_over_two_steps():
    e = SimEngine(GPT, EngineArgs(max_num_batched_tokens=32768, max_model_len=4096, kv_cache_dtype="fp8"))
    for i in range(64):
        e.add_request(f"r{i}", 1024, 8)
    firsts = []
    for _ in range(3):
        st = e.step()
        assert st.prefill_tokens + st.decode_tokens <= 32768
        firsts.append(sum(ev.first for ev in st.events))
    # 32 prompts fill the first step; the second decodes those and prefills 31.97 more; the last one after
    assert firsts == [32, 31, 1]


def test_fp8_kv_cache_holds_twice_the_tokens():
    auto = SimEngine(MODELS["llama-3.1-8b"], EngineArgs(kv_cache_dtype="auto"))
    fp8 = SimEngine(MODELS["llama-3.1-8b"], EngineArgs(kv_cache_dtype="fp8"))
    assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token
    assert abs(fp8.kv_capacity_tokens - 2 * auto.kv_capacity_tokens) <= 2 * 16


def test_decode_is_bandwidth_bound_and_prefill_compute_bound():
    # one decode token streams the weights; doubling bandwidth almost halves it, doubling FLOP/s barely matters
    base, _ = step_time(GPT, GB10, tp=1, decode_ctx=[1100], prefill_chunks=[])
    bw2, _ = step_time(GPT, GB10.with_(mem_bw_bytes_s=2 * GB10.mem_bw_bytes_s), tp=1, decode_ctx=[1100],
                       prefill_chunks=[])
    fl2, _ = step_time(GPT, GB10.with_(compute_flops_s=2 * GB10.compute_flops_s), tp=1, decode_ctx=[1100],
                       prefill_chunks=[])
    assert bw2 < 0.6 * base and fl2 > 0.9 * base
    big = [(1024, 0)] * 32
    p_base, _ = step_time(GPT, GB10, tp=1, decode_ctx=[], prefill_chunks=big)
    p_fl2, _ = step_time(GPT, GB10.with_(compute_flops_s=2 * GB10.compute_flops_s), tp=1, decode_ctx=[],
                         prefill_chunks=big)
    assert p_fl2 < 0.6 * p_base


def test_moe_decode_reads_more_experts_as_the_batch_grows_but_saturates():
    t = [step_time(GPT, GB10, tp=1, decode_ctx=[1100] * n, prefill_chunks=[])[0] for n in (1, 8, 64, 256)]
    assert t[0] < t[1] < t[2] < t[3]
    assert (t[3] - t[2]) / 192 < (t[1] - t[0]) / 7     # per extra sequence it gets cheaper


def test_tiny_model_steps_are_bounded_by_cpu_overhead():
    d, busy = step_time(MODELS["tiny"], GB10, tp=1, decode_ctx=[10], prefill_chunks=[])
    assert busy < d and d >= GB10.cpu_step_s


# ---- the headless experiment -------------------------------------------------------------------

from dataclasses import replace  # noqa: E402

from sparkconsole.sim.experiment import LITELLM, RequestTiming, benchy_metrics, run_level, run_sweep  # noqa: E402

BENCH_ARGS = EngineArgs(max_num_batched_tokens=32768, gpu_memory_utilization=0.70, max_model_len=4096,
                        kv_cache_dtype="fp8")


def test_benchy_metrics_follow_llama_benchy_formulas():
    one = [RequestTiming(start=0.0, backend=0, first=0.5, end=2.5, tokens=101)]
    pp, tg, ttft = benchy_metrics(one, 1000, latency=0.1)
    assert pp == pytest.approx(1000 / 0.4) and tg == pytest.approx(100 / 2.0) and ttft == pytest.approx(0.5)
    two = [RequestTiming(0.0, 0, 0.5, 2.5, 101), RequestTiming(0.1, 1, 1.0, 4.0, 101)]
    pp, tg, ttft = benchy_metrics(two, 1000, latency=0.1)
    assert pp == pytest.approx(2000 / 1.0)            # latest first token - earliest start
    assert tg == pytest.approx(200 / 3.5)             # (tokens - requests) / (latest end - earliest first)
    assert ttft == pytest.approx((0.5 + 0.9) / 2)


def test_least_busy_pile_on_comes_from_the_proxy_event_loop():
    # the fitted proxy routes a c16 burst before counting it: lopsided; an instant proxy alternates
    slow = run_level("2x-solo-least-busy", "gpt-oss-120b", BENCH_ARGS, 16, 256, 8, runs=4)
    instant = run_level("2x-solo-least-busy", "gpt-oss-120b", BENCH_ARGS, 16, 256, 8, runs=4,
                        proxy=replace(LITELLM, route_s=1e-6, forward_s=1e-6, client_gap_s=1e-3,
                                      client_jitter_s=0.0))
    assert instant.imbalance == pytest.approx(1.0)
    assert slow.imbalance > 1.3
    shuffle = run_level("2x-solo-simple-shuffle", "gpt-oss-120b", BENCH_ARGS, 64, 64, 4, runs=10)
    assert 0.4 < shuffle.backend_requests[0] / sum(shuffle.backend_requests) < 0.6


def test_without_a_per_backend_limit_the_c64_collapse_is_only_a_dip():
    # the engine alone spills the overflow into the next step; the published collapse needs the limit
    unlimited = replace(LITELLM, max_inflight_per_backend=None)
    c32, c64 = run_sweep("solo", "gpt-oss-120b", BENCH_ARGS, [32, 64], 1024, 128, 1, proxy=unlimited)
    assert c64.prefill_tps > 0.85 * c32.prefill_tps
    _, limited = run_sweep("solo", "gpt-oss-120b", BENCH_ARGS, [32, 64], 1024, 128, 1)
    assert limited.prefill_tps < 0.6 * c32.prefill_tps


def test_tp2_beats_solo_for_a_single_request_as_published():
    solo = run_level("solo", "gpt-oss-120b", BENCH_ARGS, 1, 1024, 128, runs=1)
    tp2 = run_level("cluster-tp2", "gpt-oss-120b", BENCH_ARGS, 1, 1024, 128, runs=1)
    assert tp2.decode_tps > 1.1 * solo.decode_tps and tp2.ttft_ms < 0.8 * solo.ttft_ms


def test_bad_sweep_input_is_a_user_error():
    with pytest.raises(UserError, match="unknown topology"):
        run_sweep("3x-solo", "gpt-oss-120b", BENCH_ARGS, [1], 10, 10, 1)
    with pytest.raises(UserError, match="unknown model"):
        run_sweep("solo", "gpt-5", BENCH_ARGS, [1], 10, 10, 1)
    with pytest.raises(UserError):
        run_sweep("solo", "gpt-oss-120b", BENCH_ARGS, [0], 10, 10, 1)


def test_prefilled_request_recomputes_only_the_last_prompt_token():
    e = SimEngine(GPT, EngineArgs())
    e.add_request("d", 1000, 3, prefilled_tokens=1000)
    first = e.step()
    assert first.prefill_tokens == 1 and first.events[0].first
    assert e.kv_usage > 0          # the transferred KV occupies blocks here
    drain(e)
    assert e.counters.prompt_tokens == 1 and e.counters.generation_tokens == 3


def test_disagg_splits_prefill_and_decode_over_two_engines():
    solo = run_level("solo", "gpt-oss-120b", BENCH_ARGS, 1, 1024, 32, runs=1)
    disagg = run_level("disagg", "gpt-oss-120b", BENCH_ARGS, 1, 1024, 32, runs=1)
    # the KV hop and the second engine's first step come on top of the same prefill
    assert solo.ttft_ms < disagg.ttft_ms < solo.ttft_ms + 100
    # under load the decode engine is never stalled by 32k-token prefill steps
    solo16 = run_level("solo", "gpt-oss-120b", BENCH_ARGS, 64, 1024, 128, runs=1)
    disagg16 = run_level("disagg", "gpt-oss-120b", BENCH_ARGS, 64, 1024, 128, runs=1)
    assert disagg16.decode_tps > solo16.decode_tps


# ---- other published figures the profiles are checked against -------------------------------------

from sparkconsole.sim.reference import load_rows  # noqa: E402


def test_deepseek_profile_reproduces_the_published_kv_capacities_and_baseline_itl():
    _, rows = load_rows("deepseek-v4-flash-tuning.csv")
    pub = {r["metric"]: r for r in rows}
    m = MODELS["deepseek-v4-flash"]
    for util, col in ((0.70, "baseline"), (0.78, "optimized")):
        e = SimEngine(m, EngineArgs(gpu_memory_utilization=util, tensor_parallel_size=2, max_model_len=8192),
                      nodes=2)
        assert e.kv_capacity_tokens == pytest.approx(float(pub["kv_cache_tokens"][col]), rel=0.02)
    itl, _ = step_time(m, GB10, tp=2, decode_ctx=[2000], prefill_chunks=[])
    assert 1000 * itl == pytest.approx(float(pub["itl_ms_per_token"]["baseline"]), rel=0.1)


def test_llama_8b_single_node_matches_the_published_rates_out_of_sample():
    _, rows = load_rows("llama-3.1-8b-disaggregation.csv")
    pub = {int(r["concurrency"]): float(r["throughput_tps"]) for r in rows if r["architecture"] == "single-node"}
    direct = replace(LITELLM, route_s=2e-4, forward_s=2e-4, chunk_s=1e-5, done_s=0.0)   # a thin proxy
    args = EngineArgs(gpu_memory_utilization=0.3, max_model_len=4096)
    for c in (1, 8):
        r = run_level("solo", "llama-3.1-8b", args, c, 512, 100, runs=2, proxy=direct)
        assert r.decode_tps == pytest.approx(pub[c], rel=0.15), c


# ---- invariants under arbitrary load (property test) ----------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hst  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(reqs=hst.lists(hst.tuples(hst.integers(1, 3000), hst.integers(1, 300)), min_size=1, max_size=40),
       budget=hst.sampled_from([256, 2048, 8192]), seqs=hst.integers(1, 16), abort_every=hst.integers(0, 7))
def test_engine_invariants_hold_under_any_load(reqs, budget, seqs, abort_every):
    # a KV cache of ~13k tokens: long requests crowd it and force preemptions
    e = SimEngine(MODELS["llama-3.1-8b"], EngineArgs(max_num_batched_tokens=budget, max_num_seqs=seqs,
                                                     gpu_memory_utilization=0.16, max_model_len=4096))
    want = {}
    for i, (p, m) in enumerate(reqs):
        e.add_request(f"r{i}", p, m)
        want[f"r{i}"] = m
    aborted = {f"r{i}" for i in range(len(reqs)) if abort_every and i % abort_every == 1}
    got: dict[str, int] = {}
    firsts: set[str] = set()
    steps = 0
    while e.has_work():
        st_ = e.step()
        steps += 1
        assert steps < 200000
        assert st_.prefill_tokens + st_.decode_tokens <= budget
        assert e.running <= seqs and 0.0 <= e.kv_usage <= 1.0
        for ev in st_.events:
            assert ev.first == (ev.req_id not in firsts)
            firsts.add(ev.req_id)
            got[ev.req_id] = got.get(ev.req_id, 0) + ev.new_tokens
            assert got[ev.req_id] <= want[ev.req_id]
            assert ev.finished == (got[ev.req_id] == want[ev.req_id])
        if steps == 3:
            for rid in aborted:
                e.abort(rid)
    for rid, m in want.items():
        if rid not in aborted:
            assert got.get(rid) == m
    assert e.kv_usage == 0.0


def test_decode_growth_beyond_the_kv_cache_preempts_and_recomputes():
    e = SimEngine(MODELS["llama-3.1-8b"], EngineArgs(max_num_batched_tokens=8192, max_num_seqs=16,
                                                     gpu_memory_utilization=0.16, max_model_len=4096))
    n = 16
    assert n * 600 < e.kv_capacity_tokens < n * 1400     # all prompts fit; all finished sequences do not
    for i in range(n):
        e.add_request(f"r{i}", 600, 800)
    tokens = drain(e)
    assert e.counters.preemptions > 0
    assert e.counters.requests_finished == n
    assert sum(len(s.events) for s in tokens) == n * 800
    assert e.counters.prompt_tokens > n * 600          # preempted requests were recomputed
