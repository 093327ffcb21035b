"""serving.metrics: Prometheus text from vLLM and routers → figures, rates and histogram percentiles.

Metric text comes from prometheus_client itself, with vLLM's metric definitions (names, label sets, bucket
boundaries as in vllm/v1/metrics/loggers.py) — `VllmExporter` below. The files tests/fixtures/metrics-*.txt were
written by it (`python -m tests.test_serving_metrics`), seeded with the published gpt-oss-120b solo c8 figures
(sparkconsole/sim/data/gpt-oss-120b-topologies.csv); they are generated from the definitions, not recorded
from a running server. The router files follow vllm-router's src/metrics.rs and LiteLLM's prometheus callback.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from sparkconsole.serving import metrics as m
from sparkconsole.serving import prom

FIXTURES = Path(__file__).parent / "fixtures"

# Bucket boundaries exactly as vLLM defines them.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0]
# Published solo c8 on one Spark (gpt-oss-120b): TTFT mean 1385 ms, 153.5 decode tok/s over 8 streams.
SOLO_C8_TTFT_S = 1.385
SOLO_C8_ITL_S = 8 / 153.5


class VllmExporter:
    """A real prometheus_client registry carrying vLLM's metrics of one generation:
    "v1" (current names), "v0.9" (deprecated V1 names only) or "v0" (the V0 engine's names)."""

    def __init__(self, generation: str = "v1", model: str = "openai/gpt-oss-120b", engines=(0,),
                 process: bool = False):
        self.gen, self.model, self.engines = generation, model, tuple(str(e) for e in engines)
        r = self.registry = CollectorRegistry()
        if process:  # vLLM's /metrics also carries the default process/python collectors
            ProcessCollector(registry=r), PlatformCollector(registry=r), GCCollector(registry=r)
        labels = ["model_name"] if generation == "v0" else ["model_name", "engine"]
        g = lambda n, d: Gauge(n, d, labels, registry=r)  # noqa: E731
        c = lambda n, d: Counter(n, d, labels, registry=r)  # noqa: E731
        h = lambda n, d, b: Histogram(n, d, labels, buckets=b, registry=r)  # noqa: E731
        self.running = g("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv = {"v1": lambda: g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")}.get(
            generation, lambda: g("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."))()
        if generation == "v1":
            self.pq = c("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
            self.ph = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        elif generation == "v0.9":
            self.pq = c("vllm:gpu_prefix_cache_queries", "GPU prefix cache queries. DEPRECATED")
            self.ph = c("vllm:gpu_prefix_cache_hits", "GPU prefix cache hits. DEPRECATED")
        else:
            self.hit_rate = g("vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.")
            g("vllm:num_requests_swapped", "Number of requests swapped to CPU.")
            self._v0_hits = self._v0_queries = 0.0
        self.preempt = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.gen_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               labels + ["finished_reason"], registry=r)
        self.ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                      TTFT_BUCKETS)
        itl_name = "vllm:inter_token_latency_seconds" if generation == "v1" else "vllm:time_per_output_token_seconds"
        self.itl = h(itl_name, "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", E2E_BUCKETS)
        for e in self.engines:  # vLLM creates every series at start, at zero
            for metric in (self.running, self.waiting, self.kv, self.prompt, self.gen_tokens, self.ttft,
                           self.itl, self.e2e, self.preempt):
                metric.labels(*self._lv(e))

    def _lv(self, engine: str) -> tuple[str, ...]:
        return (self.model,) if self.gen == "v0" else (self.model, engine)

    def state(self, running: float, waiting: float, kv: float, engine=0) -> None:
        lv = self._lv(str(engine))
        self.running.labels(*lv).set(running)
        self.waiting.labels(*lv).set(waiting)
        self.kv.labels(*lv).set(kv)

    def serve(self, rng: random.Random, requests: int, *, prompt_tokens=1024, gen_tokens=128,
              ttft_s=SOLO_C8_TTFT_S, itl_s=SOLO_C8_ITL_S, prefix_hit=0.25, engine=0) -> None:
        """Record `requests` finished requests with lognormal TTFT/ITL around the given means."""
        lv = self._lv(str(engine))
        for _ in range(requests):
            ttft = rng.lognormvariate(math.log(ttft_s), 0.35)
            self.ttft.labels(*lv).observe(ttft)
            total = ttft
            for _ in range(gen_tokens - 1):
                itl = rng.lognormvariate(math.log(itl_s), 0.2)
                self.itl.labels(*lv).observe(itl)
                total += itl
            self.e2e.labels(*lv).observe(total)
            self.prompt.labels(*lv).inc(prompt_tokens)
            self.gen_tokens.labels(*lv).inc(gen_tokens)
            self.success.labels(*lv, "length").inc()
            hits = int(prompt_tokens * prefix_hit)
            if self.gen == "v0":
                self._v0_queries += prompt_tokens
                self._v0_hits += hits
                self.hit_rate.labels(*lv).set(self._v0_hits / self._v0_queries)
            else:
                self.pq.labels(*lv).inc(prompt_tokens)
                self.ph.labels(*lv).inc(hits)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def seeded_workload(exp: VllmExporter, seed: int = 8) -> VllmExporter:
    rng = random.Random(seed)
    for e in exp.engines:
        exp.serve(rng, 40, engine=e)
        exp.state(running=8, waiting=3, kv=0.41, engine=e)
    return exp


def vllm_router_text(requests: int, errors: int, health: dict[str, int], load: dict[str, int],
                     durations: list[float]) -> str:
    """vllm-router's exposition (metrics-exporter-prometheus: HELP/TYPE, no _created), per src/metrics.rs."""
    bounds = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0,
              90.0, 120.0, 180.0, 240.0]
    route = 'route="/v1/chat/completions"'
    out = ["# HELP vllm_router_requests_total Total number of requests by route and method",
           "# TYPE vllm_router_requests_total counter", f"vllm_router_requests_total{{{route}}} {requests}", "",
           "# HELP vllm_router_request_errors_total Total number of request errors by route and error type",
           "# TYPE vllm_router_request_errors_total counter",
           f'vllm_router_request_errors_total{{{route},error_type="backend_error"}} {errors}', "",
           "# HELP vllm_router_active_workers Number of currently active workers",
           "# TYPE vllm_router_active_workers gauge", f"vllm_router_active_workers {sum(health.values())}", "",
           "# HELP vllm_router_worker_health Worker health status (1=healthy, 0=unhealthy)",
           "# TYPE vllm_router_worker_health gauge"]
    out += [f'vllm_router_worker_health{{worker="{w}"}} {v}' for w, v in health.items()]
    out += ["", "# HELP vllm_router_running_requests Number of running requests per worker",
            "# TYPE vllm_router_running_requests gauge"]
    out += [f'vllm_router_running_requests{{worker="{w}"}} {v}' for w, v in load.items()]
    out += ["", "# HELP vllm_router_request_duration_seconds Request duration in seconds by route",
            "# TYPE vllm_router_request_duration_seconds histogram"]
    for b in bounds:
        out.append(f'vllm_router_request_duration_seconds_bucket{{{route},le="{b}"}} {sum(d <= b for d in durations)}')
    out.append(f'vllm_router_request_duration_seconds_bucket{{{route},le="+Inf"}} {len(durations)}')
    out.append(f"vllm_router_request_duration_seconds_sum{{{route}}} {sum(durations)}")
    out.append(f"vllm_router_request_duration_seconds_count{{{route}}} {len(durations)}")
    return "\n".join(out) + "\n"


def litellm_text(rng: random.Random, deployments: dict[str, int], requests: int, failed: int) -> str:
    """LiteLLM proxy's prometheus callback (prometheus_client), with its metric names and labels."""
    r = CollectorRegistry()
    buckets = (0.005, 0.00625, 0.0125, 0.025, 0.05, 0.1, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5,
               6.0, 6.5, 7.0, 7.5, 8.0, 8.5, 9.0, 9.5, 10.0, 15.0, 20.0, 25.0, 30.0, 60.0, 120.0, 180.0, 240.0,
               300.0, float("inf"))
    lab = ["end_user", "hashed_api_key", "api_key_alias", "requested_model", "team", "team_alias", "user",
           "status_code"]
    total = Counter("litellm_proxy_total_requests_metric", "Total number of requests made to the proxy server",
                    lab, registry=r)
    fail = Counter("litellm_proxy_failed_requests_metric", "Total number of failed responses from proxy",
                   lab[:-1] + ["exception_status", "exception_class"], registry=r)
    state = Gauge("litellm_deployment_state", "LLM Deployment Analytics - The state of the deployment: "
                  "0 = healthy, 1 = partial outage, 2 = complete outage",
                  ["litellm_model_name", "model_id", "api_base", "api_provider"], registry=r)
    lat = Histogram("litellm_request_total_latency_metric", "Total latency (seconds) for a request to LiteLLM",
                    ["end_user", "hashed_api_key", "api_key_alias", "requested_model", "team", "team_alias",
                     "user", "model"], buckets=buckets, registry=r)
    key = "88dc28d0f030c55ed4ab77ed8faf098196cb1c05df778539800c9f1243fe6b4b"
    total.labels("", key, "", "gpt-oss-120b", "", "", "", "200").inc(requests - failed)
    if failed:
        total.labels("", key, "", "gpt-oss-120b", "", "", "", "500").inc(failed)
        fail.labels("", key, "", "gpt-oss-120b", "", "", "", "500", "InternalServerError").inc(failed)
    for i, (base, v) in enumerate(deployments.items()):
        state.labels("hosted_vllm/openai/gpt-oss-120b", f"dep-{i}", base, "hosted_vllm").set(v)
    for _ in range(requests - failed):
        lat.labels("", key, "", "gpt-oss-120b", "", "", "", "gpt-oss-120b").observe(
            rng.lognormvariate(math.log(SOLO_C8_TTFT_S + 127 * SOLO_C8_ITL_S), 0.2))
    return generate_latest(r).decode()


def write_fixtures() -> None:
    FIXTURES.mkdir(exist_ok=True)
    note = ("# Generated by tests/test_serving_metrics.py from vLLM's metric definitions (vllm/v1/metrics/loggers.py),\n"
            "# seeded with published gpt-oss-120b solo c8 figures; not recorded from a running server.\n")
    for gen, fname in (("v1", "metrics-vllm-v1.txt"), ("v0.9", "metrics-vllm-v0.9.txt"), ("v0", "metrics-vllm-v0.txt")):
        (FIXTURES / fname).write_text(note + seeded_workload(VllmExporter(gen, process=(gen == "v1"))).text())
    (FIXTURES / "metrics-vllm-v1-dp2.txt").write_text(note + seeded_workload(VllmExporter("v1", engines=(0, 1))).text())
    rng = random.Random(3)
    (FIXTURES / "metrics-vllm-router.txt").write_text(
        "# Written from vllm-router's src/metrics.rs definitions; not recorded.\n" + vllm_router_text(
            120, 2, {"http://127.0.0.1:8001": 1, "http://127.0.0.1:8002": 0},
            {"http://127.0.0.1:8001": 5, "http://127.0.0.1:8002": 0},
            [rng.lognormvariate(math.log(8.0), 0.2) for _ in range(118)]))
    (FIXTURES / "metrics-litellm.txt").write_text(
        "# Written from LiteLLM's prometheus callback definitions; not recorded.\n" + litellm_text(
            rng, {"http://127.0.0.1:8001": 0, "http://127.0.0.1:8002": 2}, 200, 7))


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- parsing and engine figures ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["metrics-vllm-v1.txt", "metrics-vllm-v0.9.txt", "metrics-vllm-v0.txt"])
def test_fixture_generations_give_the_same_figures(name):
    """Three generations of names for one seeded workload: the same figures come out of each."""
    got = m.engine_metrics(prom.parse(fixture(name)))
    want = m.engine_metrics(prom.parse(seeded_workload(VllmExporter("v1")).text()))
    assert got.running == want.running == 8 and got.waiting == want.waiting == 3
    assert got.kv_usage == pytest.approx(0.41)
    assert got.prefix_hit_rate == pytest.approx(want.prefix_hit_rate)
    assert 0.2 < got.prefix_hit_rate < 0.3
    assert got.generation_tokens == want.generation_tokens == 40 * 128
    assert got.ttft.bounds == tuple(TTFT_BUCKETS) + (math.inf,)
    for which in ("ttft", "itl"):
        for q in (0.5, 0.95):
            assert got.pct(which, q) == pytest.approx(want.pct(which, q))
    assert got.models == ("openai/gpt-oss-120b",)


def test_percentiles_land_near_the_published_means():
    em = m.engine_metrics(prom.parse(fixture("metrics-vllm-v1.txt")))
    # lognormal around the mean: p50 sits in the bucket holding the mean, p95 above it.
    assert 1.0 <= em.pct("ttft", 0.5) <= 2.5
    assert em.pct("ttft", 0.95) > em.pct("ttft", 0.5)
    assert 0.05 <= em.pct("itl", 0.5) <= 0.075
    assert em.ttft.mean == pytest.approx(SOLO_C8_TTFT_S, rel=0.25)


def test_label_sets_are_summed():
    one = m.engine_metrics(prom.parse(fixture("metrics-vllm-v1.txt")))
    two = m.engine_metrics(prom.parse(fixture("metrics-vllm-v1-dp2.txt")))
    assert two.running == 2 * one.running and two.generation_tokens == 2 * one.generation_tokens
    assert two.kv_usage == pytest.approx(one.kv_usage)            # a fraction: averaged, not summed
    assert two.ttft.observations == 2 * one.ttft.observations


def test_process_metrics_and_created_samples_do_not_confuse():
    s = prom.parse(fixture("metrics-vllm-v1.txt"))
    assert s.bad_lines == 0
    assert s.first("process_resident_memory_bytes")          # default collectors are there
    assert s.total("vllm:prompt_tokens_total") == 40 * 1024  # not mixed with vllm:prompt_tokens_created


def test_missing_and_unknown_metrics_are_none():
    em = m.engine_metrics(prom.parse("# HELP x y\n# TYPE x gauge\nx 1\n"))
    assert all(getattr(em, f) is None for f in ("running", "waiting", "kv_usage", "prefix_hit_rate",
                                                 "prompt_tokens", "generation_tokens", "ttft", "itl"))
    assert m.router_metrics(prom.parse("")) is None


@pytest.mark.parametrize("garbage", ["", "<html><body>502 Bad Gateway</body></html>", "\x00\xff" * 50,
                                     "vllm:num_requests_running{model_name=\"a\" 3\n", "{}{}{}",
                                     "# TYPE vllm:num_requests_running histogram\nvllm:num_requests_running 3\n"])
def test_garbage_never_raises(garbage):
    s = prom.parse(garbage)
    m.engine_metrics(s), m.router_metrics(s), m.engine_window(s, s), m.router_window(s, s)


@example(lines=['vllm:generation_tokens_total{le="-inf"} -inf', 'vllm:generation_tokens_total{l=""}Inf'])  # fsum raised
@settings(max_examples=150, deadline=None)
@given(lines=st.lists(st.one_of(
    st.text(max_size=60),
    st.sampled_from(fixture("metrics-vllm-v1.txt").splitlines()),
    st.builds(lambda n, v: f"vllm:{n}{{le=\"{v}\"}} {v}", st.sampled_from(
        ["time_to_first_token_seconds_bucket", "num_requests_running", "generation_tokens_total"]),
        st.one_of(st.floats(allow_nan=True), st.just("+Inf"), st.text(max_size=5)))), max_size=40))
def test_arbitrary_text_never_raises(lines):
    a = prom.parse("\n".join(lines), time=0)
    b = prom.parse("\n".join(reversed(lines)), time=1)
    for s_ in (a, b):
        em = m.engine_metrics(s_)
        for which in ("ttft", "itl"):
            em.pct(which, 0.5)
        m.router_metrics(s_)
    w = m.engine_window(a, b)
    w.pct("ttft", 0.95), m.router_window(a, b)


@settings(max_examples=150, deadline=None)
@given(counts=st.lists(st.one_of(st.floats(-5, 1e6), st.just(math.nan)), min_size=0, max_size=8), q=st.floats(allow_nan=True))
def test_quantile_of_any_buckets_never_raises(counts, q):
    bounds = tuple(float(i) for i in range(len(counts) - 1)) + ((math.inf,) if counts else ())
    prom.histogram_quantile(q, bounds, tuple(counts))


def test_one_bad_line_keeps_the_rest():
    text = fixture("metrics-vllm-v1.txt").replace(
        "# HELP vllm:num_requests_waiting", 'vllm:broken{model_name="x" 1\n# HELP vllm:num_requests_waiting')
    s = prom.parse(text)
    assert s.bad_lines == 1
    em = m.engine_metrics(s)
    assert em.running == 8 and em.waiting == 3 and em.ttft is not None


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("metrics-*.txt")), ids=lambda p: p.name)
def test_filtered_parse_gives_the_same_figures(path):
    text = path.read_text()
    full, part = prom.parse(text, time=0), prom.parse(text, time=0, only=m.CONSOLE_NAMES)
    # the router fixture holds only series the console reads; every other page has some it skips
    kept, every = sum(map(len, part.series.values())), sum(map(len, full.series.values()))
    assert kept == every if path.name == "metrics-vllm-router.txt" else kept < every
    assert m.engine_metrics(part) == m.engine_metrics(full)
    assert m.router_metrics(part) == m.router_metrics(full)


def test_bytes_input():
    assert m.engine_metrics(prom.parse(fixture("metrics-vllm-v1.txt").encode())).running == 8


# --- windows between scrapes -------------------------------------------------------------------------------
def test_window_rates_and_percentiles_see_only_the_new_requests():
    exp, rng = VllmExporter("v1"), random.Random(1)
    exp.serve(rng, 50, ttft_s=0.05, itl_s=0.02)            # a fast past…
    first = prom.parse(exp.text(), time=100.0)
    exp.serve(rng, 10, ttft_s=3.0, itl_s=0.3, prompt_tokens=2000, gen_tokens=64)   # …then a slow window
    second = prom.parse(exp.text(), time=110.0)
    w = m.engine_window(first, second)
    assert w.seconds == 10
    assert w.prompt_tps == pytest.approx(10 * 2000 / 10)
    assert w.gen_tps == pytest.approx(10 * 64 / 10) and w.generation_tokens == 640
    assert 2.5 <= w.pct("ttft", 0.5) <= 5.0
    assert m.engine_metrics(second).pct("ttft", 0.5) < 0.1    # lifetime p50 is still the fast past
    assert 0.2 <= w.pct("itl", 0.5) <= 0.4
    assert w.ttft.observations == 10
    assert w.prefix_hit_rate == pytest.approx(0.25, abs=0.01)


def test_idle_window_has_rates_of_zero_and_no_percentiles():
    exp = seeded_workload(VllmExporter("v1"))
    a, b = prom.parse(exp.text(), time=1.0), prom.parse(exp.text(), time=2.0)
    w = m.engine_window(a, b)
    assert w.gen_tps == 0 and w.prompt_tps == 0
    assert w.pct("ttft", 0.5) is None and w.prefix_hit_rate is None


def test_counter_reset_is_not_a_negative_rate():
    before = prom.parse(seeded_workload(VllmExporter("v1")).text(), time=0.0)
    restarted, rng = VllmExporter("v1"), random.Random(2)
    restarted.serve(rng, 3, gen_tokens=100)
    after = prom.parse(restarted.text(), time=5.0)
    w = m.engine_window(before, after)
    assert w.generation_tokens == 300 and w.gen_tps == pytest.approx(60)
    assert w.ttft.observations == 3


def test_window_needs_the_metric_on_both_sides():
    a = prom.parse("", time=0)
    b = prom.parse(fixture("metrics-vllm-v1.txt"), time=1)
    w = m.engine_window(a, b)
    assert w.gen_tps is None and w.ttft is None


# --- histogram_quantile ------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(obs=st.lists(st.floats(0.0005, 3000, allow_nan=False), min_size=1, max_size=300),
       q=st.floats(0.01, 1.0))
def test_quantile_lands_in_the_bucket_of_the_true_quantile(obs, q):
    r = CollectorRegistry()
    h = Histogram("t_seconds", "t", buckets=TTFT_BUCKETS, registry=r)
    for x in obs:
        h.observe(x)
    est = prom.parse(generate_latest(r)).histogram("t_seconds").quantile(q)
    xs = sorted(obs)
    true = xs[max(math.ceil(q * len(xs) - 1e-9), 1) - 1]
    if true > TTFT_BUCKETS[-1]:
        assert est == TTFT_BUCKETS[-1]      # Prometheus answers the highest finite bound
        return
    hi = next(b for b in TTFT_BUCKETS if true <= b)
    lo = max([0.0] + [b for b in TTFT_BUCKETS if b < hi])
    assert lo <= est <= hi


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(0, 50), min_size=2, max_size=12), q1=st.floats(0, 1), q2=st.floats(0, 1))
def test_quantile_is_monotonic_in_q(counts, q1, q2):
    bounds = tuple(float(i + 1) for i in range(len(counts) - 1)) + (math.inf,)
    cum = tuple(float(sum(counts[: i + 1])) for i in range(len(counts)))
    a, b = prom.histogram_quantile(min(q1, q2), bounds, cum), prom.histogram_quantile(max(q1, q2), bounds, cum)
    if cum[-1] == 0:
        assert a is None and b is None
    else:
        assert a <= b


def test_quantile_interpolates_like_prometheus():
    # 10 observations in (0.1, 0.25]: p50 is halfway through that bucket
    bounds, cum = (0.1, 0.25, math.inf), (0.0, 10.0, 10.0)
    assert prom.histogram_quantile(0.5, bounds, cum) == pytest.approx(0.175)
    assert prom.histogram_quantile(0.5, (0.25, math.inf), (0.0, 4.0)) == 0.25   # all in +Inf: highest finite bound
    assert prom.histogram_quantile(0.5, (1.0,), (3.0,)) is None                   # no +Inf bucket
    assert prom.histogram_quantile(0.5, (1.0, math.inf), (0.0, 0.0)) is None     # no observations
    assert prom.histogram_quantile(1.5, bounds, cum) == math.inf


# --- routers -----------------------------------------------------------------------------------------------
def test_vllm_router_metrics():
    r = m.router_metrics(prom.parse(fixture("metrics-vllm-router.txt")))
    assert (r.requests, r.errors, r.backends_up, r.backends_total) == (120, 2, 1, 2)
    assert dict(r.backend_load) == {"http://127.0.0.1:8001": 5, "http://127.0.0.1:8002": 0}
    assert 5.0 <= r.latency.quantile(0.5) <= 10.0


def test_a_worker_taken_out_of_vllm_router_is_not_counted_up():
    """vllm-router 0.1.17 after POST /remove_worker?url=…:21002, as it answered on the test bed: the removed
    worker's health series stays at 1; only the active-workers gauge says it left (a rolling restart's 1/2)."""
    text = ("# TYPE vllm_router_worker_health gauge\n"
            'vllm_router_worker_health{worker="http://127.0.0.1:21002"} 1\n'
            'vllm_router_worker_health{worker="http://127.0.0.1:21001"} 1\n'
            "# TYPE vllm_router_active_workers gauge\n"
            "vllm_router_active_workers 1\n")
    r = m.router_metrics(prom.parse(text, only=m.CONSOLE_NAMES))
    assert (r.backends_up, r.backends_total) == (1, 2)
    back = text.replace("vllm_router_active_workers 1", "vllm_router_active_workers 2")
    assert (m.router_metrics(prom.parse(back, only=m.CONSOLE_NAMES)).backends_up, 2) == (2, 2)


def test_litellm_metrics():
    r = m.router_metrics(prom.parse(fixture("metrics-litellm.txt")))
    assert (r.requests, r.errors, r.backends_up, r.backends_total) == (200, 7, 1, 2)
    assert r.latency.observations == 193


def test_router_window_rates():
    rng = random.Random(5)
    hl = {"a": 1, "b": 1}
    durations = [rng.random() for _ in range(99)]
    a = prom.parse(vllm_router_text(100, 1, hl, {}, durations), time=0)
    b = prom.parse(vllm_router_text(160, 4, hl, {}, durations + [rng.random() for _ in range(57)]), time=2)
    w = m.router_window(a, b)
    assert w.requests_per_s == 30 and w.errors_per_s == 1.5
    assert w.latency.observations == 57


# --- recorded from the real test bed (python -m tests.test_serving_metrics record) ----------------------------
def recorded(prefix: str) -> tuple[str, int, int]:
    path = next(FIXTURES.glob(f"{prefix}*-recorded.txt"))
    text = path.read_text()
    meta = dict(part.strip().split(": ") for part in text.splitlines()[1].lstrip("# ").split(","))
    return text, int(meta["requests"]), int(meta["max_tokens"])


def test_recorded_vllm():
    text, n, max_tokens = recorded("metrics-vllm-0.32.0-cpu")
    s = prom.parse(text)
    assert s.bad_lines == 0
    em = m.engine_metrics(s)
    assert em.running == 0 and em.waiting == 0 and em.kv_usage == 0       # idle after the requests
    assert em.generation_tokens == n * max_tokens                          # ignore_eos: exactly max_tokens each
    assert em.ttft.observations == n and em.itl.observations == n * (max_tokens - 1)
    assert em.prefix_hit_rate is not None and 0 <= em.prefix_hit_rate <= 1
    assert em.pct("ttft", 0.5) <= em.pct("ttft", 0.95)
    assert em.models == ("tiny-llama",)
    assert m.router_metrics(s) is None


def test_recorded_vllm_router():
    text, n, _ = recorded("metrics-vllm-router")
    r = m.router_metrics(prom.parse(text))
    assert r.requests == n and (r.backends_up, r.backends_total) == (1, 1)
    assert sum(v for _, v in r.backend_requests) == n
    assert r.latency.observations == n and r.latency.quantile(0.5) > 0


def test_recorded_litellm():
    text, n, _ = recorded("metrics-litellm")
    s = prom.parse(text)
    assert s.bad_lines == 0
    r = m.router_metrics(s)
    assert r.requests == n and (r.backends_up, r.backends_total) == (1, 1)
    assert sum(v for _, v in r.backend_requests) == n
    assert r.latency.observations == n
    assert m.engine_metrics(s).running is None


def test_vllm_fixture_is_not_a_router():
    assert m.router_metrics(prom.parse(fixture("metrics-vllm-v1.txt"))) is None


def record_real(requests: int = 6, max_tokens: int = 12) -> None:
    """Record /metrics of the real test bed: vLLM (CPU) serving the tiny model, vllm-router and LiteLLM in
    front of it, after `requests` chat completions of exactly `max_tokens` tokens through each.
    Costs ~3 GiB and both cores for ~30 s. Run: python -m tests.test_serving_metrics record"""
    import shlex
    import tempfile

    import httpx

    from tests.testbed import routers
    from tests.testbed.cache import ensure_venv
    from tests.testbed.model import ensure_tiny_model
    from tests.testbed.vllm import VLLM_VENV, VLLM_VERSION, chat, start_vllm_server

    log_dir = Path(tempfile.mkdtemp(prefix="record-metrics-"))
    venv = ensure_venv(VLLM_VENV)
    model = ensure_tiny_model(venv)
    server = start_vllm_server(venv, model, log_dir)
    started = []
    try:
        def header(what: str, n: int) -> str:
            return (f"# Recorded from a real {what} by `python -m tests.test_serving_metrics record`\n"
                    f"# requests: {n}, max_tokens: {max_tokens}, ignore_eos: true\n")
        for _ in range(requests):
            chat(server.url, model.name, "Tell me about GPUs.", max_tokens=max_tokens)
        text = httpx.get(server.url + "/metrics", timeout=10).text
        (FIXTURES / f"metrics-vllm-{VLLM_VERSION}-cpu-recorded.txt").write_text(
            header(f"vLLM {VLLM_VERSION} (CPU build, tiny model)", requests) + text)

        rr = routers.start_vllm_router(ensure_venv(routers.VLLM_ROUTER_VENV), [server.url], model.name, log_dir)
        started.append(rr)
        for _ in range(requests):
            chat(rr.url, model.name, "Tell me about routers.", max_tokens=max_tokens)
        argv = shlex.split(rr.proc.args) if isinstance(rr.proc.args, str) else list(rr.proc.args)
        prom_port = argv[argv.index("--prometheus-port") + 1]
        text = httpx.get(f"http://127.0.0.1:{prom_port}/metrics", timeout=10).text
        (FIXTURES / f"metrics-vllm-router-{routers.VLLM_ROUTER_VERSION}-recorded.txt").write_text(
            header(f"vllm-router {routers.VLLM_ROUTER_VERSION} (one backend)", requests) + text)

        base_config = routers.litellm_config

        def with_prometheus(*a, **kw):
            cfg = base_config(*a, **kw)
            cfg.setdefault("litellm_settings", {})["callbacks"] = ["prometheus"]
            return cfg
        routers.litellm_config = with_prometheus
        # The test bed's LiteLLM venv has no prometheus_client (an optional extra): lend it ours, read-only.
        import prometheus_client
        lend = log_dir / "lend"
        lend.mkdir()
        (lend / "prometheus_client").symlink_to(Path(prometheus_client.__file__).parent)
        base_spawn = routers._spawn

        def spawn_with_lend(router, argv, env, cwd):
            base_spawn(router, argv, {**env, "PYTHONPATH": str(lend)}, cwd)
        routers._spawn = spawn_with_lend
        lt = routers.start_litellm(ensure_venv(routers.LITELLM_VENV), [server.url], model.name, log_dir)
        started.append(lt)
        for _ in range(requests):
            chat(lt.url, model.name, "Tell me about proxies.", max_tokens=max_tokens, headers=lt.headers)
        reply = httpx.get(lt.url + "/metrics", headers=lt.headers, timeout=10, follow_redirects=True)
        text = reply.text
        assert lt.api_key not in text, "the master key must never reach a fixture"
        if reply.status_code == 200:
            (FIXTURES / f"metrics-litellm-{routers.LITELLM_VERSION}-recorded.txt").write_text(
                header(f"LiteLLM proxy {routers.LITELLM_VERSION} (prometheus callback, one backend)", requests) + text)
        else:
            print(f"LiteLLM /metrics: HTTP {reply.status_code}")
    finally:
        for r in started:
            r.stop()
        server.stop()


if __name__ == "__main__":
    import sys
    record_real() if sys.argv[1:] == ["record"] else write_fixtures()
