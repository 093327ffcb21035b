"""vLLM, SGLang, llama.cpp and router /metrics → engine figures, rates and latency percentiles: what each runtime's
and router's samples mean (serving/prom.py reads the Prometheus text itself).

Everything here is keyed by sample names, so a metric that is missing, renamed or of an unexpected type gives
None, never an exception. Values are summed over label sets (several models, several engines behind one endpoint).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .prom import Histogram, Scrape, counter_increase, counter_rate, histogram_window, series_increase

# Current (V1) names first, then the older ones they replaced; then SGLang's (`sglang:*`, published with
# --enable-metrics) and llama.cpp's llama-server's (`llamacpp:*`, with --metrics) names for the same figure. One
# server publishes one runtime's names, so the first name present is that runtime's.
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
SUCCESS = ("vllm:request_success_total",)        # finished requests, by finished_reason
# SGLang's token_usage: the share of its KV pool's token slots in use; llama.cpp's ratio (older builds only).
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
            "llamacpp:kv_cache_usage_ratio")
PREFIX_COUNTERS = (  # (queries, hits) pairs of one generation, never mixed
    (("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"),
     ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")),
    (("vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries"),
     ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits")),
)
PREFIX_HIT_RATE_GAUGE = ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate")
PROMPT_TOKENS = ("vllm:prompt_tokens_total", "vllm:prompt_tokens", "sglang:prompt_tokens_total",
                 "llamacpp:prompt_tokens_total")
GENERATION_TOKENS = ("vllm:generation_tokens_total", "vllm:generation_tokens", "sglang:generation_tokens_total",
                     "llamacpp:tokens_predicted_total")
TTFT = ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")
# Prefill/decode disaggregation. On the decode side: where each prompt token came from (`source` label:
# local_compute, external_kv_transfer, local_cache_hit) — the plain prompt counter rises alike with or without a
# transfer, this one tells a transfer from a recompute; and NIXL's own histograms of bytes and time per transfer.
PROMPT_BY_SOURCE = ("vllm:prompt_tokens_by_source_total",)
SOURCE_EXTERNAL, SOURCE_LOCAL = "external_kv_transfer", "local_compute"
KV_BYTES = ("vllm:nixl_bytes_transferred",)
KV_XFER_TIME = ("vllm:nixl_xfer_time_seconds",)
KV_FAILED = ("vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_failed_transfers")
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds", "sglang:inter_token_latency_seconds",
       "sglang:time_per_output_token_seconds")

# Routers. vllm-router (Rust, metrics on its own port, 29000 by default) and the LiteLLM proxy.
ROUTER_REQUESTS = ("vllm_router_requests_total", "litellm_proxy_total_requests_metric_total",
                   "litellm_requests_metric_total")
ROUTER_ERRORS = ("vllm_router_request_errors_total", "litellm_proxy_failed_requests_metric_total",
                 "litellm_deployment_failure_responses_total")
# vllm-router 0.1.17 publishes generate_duration (no labels) where its source also declares request_duration.
ROUTER_LATENCY = ("vllm_router_request_duration_seconds", "vllm_router_generate_duration_seconds",
                  "litellm_request_total_latency_metric")
ROUTER_BACKEND_REQUESTS = ("vllm_router_processed_requests_total", "litellm_deployment_total_requests_total")
ROUTER_TTFT = ("litellm_llm_api_time_to_first_token_metric",)
ROUTER_WORKER_HEALTH = "vllm_router_worker_health"          # 1 healthy, 0 not; label worker
# Workers in the router's list now: vllm-router 0.1.17 keeps a removed worker's health series (at 1) after
# POST /remove_worker, so only this gauge says it left (a rolling restart's 2/2 -> 1/2 -> 2/2).
ROUTER_ACTIVE_WORKERS = "vllm_router_active_workers"
ROUTER_WORKER_LOAD = ("vllm_router_running_requests", "vllm_router_worker_load")  # label worker
LITELLM_DEPLOYMENT_STATE = "litellm_deployment_state"      # 0 healthy, 1 partial outage, 2 outage
LITELLM_IN_FLIGHT = "litellm_deployment_in_progress_requests"

# Every sample name the figures below read (as prefixes): parse(..., only=CONSOLE_NAMES) drops the rest of
# a /metrics page before the parser sees it — a real vLLM page is ~50 KB, mostly histograms nobody here reads.
CONSOLE_NAMES: tuple[str, ...] = tuple(dict.fromkeys(
    RUNNING + WAITING + KV_USAGE + tuple(n for pair in PREFIX_COUNTERS for names in pair for n in names)
    + PREFIX_HIT_RATE_GAUGE + PROMPT_TOKENS + GENERATION_TOKENS + TTFT + ITL + PROMPT_BY_SOURCE + KV_BYTES
    + KV_XFER_TIME + KV_FAILED + ROUTER_REQUESTS + ROUTER_ERRORS
    + ROUTER_LATENCY + ROUTER_TTFT + (ROUTER_WORKER_HEALTH, ROUTER_ACTIVE_WORKERS) + ROUTER_WORKER_LOAD
    + ROUTER_BACKEND_REQUESTS
    + (LITELLM_DEPLOYMENT_STATE, LITELLM_IN_FLIGHT)))

# --- what the console shows --------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineMetrics:
    """One scrape of a vLLM server, lifetime figures. None: the server does not publish it."""
    running: float | None
    waiting: float | None
    kv_usage: float | None               # 0..1, mean over engines
    prefix_hit_rate: float | None        # 0..1 since start
    prompt_tokens: float | None          # counters since start
    generation_tokens: float | None
    ttft: Histogram | None
    itl: Histogram | None
    models: tuple[str, ...] = ()         # model_name labels seen
    # disaggregation (None where the server moves no KV cache)
    prompt_tokens_external: float | None = None   # prompt tokens whose KV cache arrived by transfer
    prompt_tokens_local: float | None = None      # prompt tokens computed here
    kv_in_bytes: float | None = None              # bytes NIXL moved, since start
    kv_transfers: float | None = None             # transfers, since start
    kv_failed: float | None = None
    runtime: str | None = None                    # whose names the page uses: vLLM | SGLang | llama.cpp

    def pct(self, which: str, q: float) -> float | None:
        h = getattr(self, which)
        return h.quantile(q) if h is not None else None


_RUNTIME_PREFIXES = (("vllm:", "vLLM"), ("sglang:", "SGLang"), ("llamacpp:", "llama.cpp"))


def runtime_of(s: Scrape) -> str | None:
    """The serving runtime a page comes from, by the names of its engine figures (None: a router, or nothing)."""
    name = s.first(*RUNNING, *GENERATION_TOKENS)
    return next((title for prefix, title in _RUNTIME_PREFIXES if name and name.startswith(prefix)), None)


@dataclass(frozen=True)
class EngineWindow:
    """What happened between two scrapes."""
    seconds: float
    prompt_tps: float | None
    gen_tps: float | None
    generation_tokens: float | None      # tokens generated in the window (stall detection)
    prefix_hit_rate: float | None
    ttft: Histogram | None
    itl: Histogram | None
    kv_bytes_per_transfer: float | None = None    # mean over the window's transfers
    kv_transfers: float | None = None             # transfers in the window
    kv_xfer: Histogram | None = None              # seconds per transfer
    external_share: float | None = None           # 0..1 of the window's prompt tokens that came by transfer

    def pct(self, which: str, q: float) -> float | None:
        h = getattr(self, which)
        return h.quantile(q) if h is not None else None


def _by_source(s: Scrape, source: str) -> float | None:
    vals = [v for labels, v in s.values(PROMPT_BY_SOURCE[0]).items() if dict(labels).get("source") == source
            and math.isfinite(v)]
    return math.fsum(vals) if vals else None


def source_increase(prev: Scrape, cur: Scrape, source: str) -> float | None:
    name = PROMPT_BY_SOURCE[0]
    pick = {k: v for k, v in cur.values(name).items() if dict(k).get("source") == source}
    if not pick:
        return None
    return series_increase({k: v for k, v in prev.values(name).items() if k in pick}, pick)


def _prefix_pair(s: Scrape) -> tuple[str, str] | None:
    for queries, hits in PREFIX_COUNTERS:
        q, h = s.first(*queries), s.first(*hits)
        if q and h:
            return q, h
    return None


def engine_metrics(s: Scrape) -> EngineMetrics:
    rate = None
    pair = _prefix_pair(s)
    if pair:
        q, h = s.total(pair[0]), s.total(pair[1])
        rate = (h / q) if q and h is not None else None
    if rate is None:
        rate = s.mean(*PREFIX_HIT_RATE_GAUGE)
    return EngineMetrics(
        running=s.total(*RUNNING), waiting=s.total(*WAITING), kv_usage=_unit(s.mean(*KV_USAGE)),
        prefix_hit_rate=_unit(rate), prompt_tokens=s.total(*PROMPT_TOKENS),
        generation_tokens=s.total(*GENERATION_TOKENS), ttft=s.histogram(*TTFT), itl=s.histogram(*ITL),
        models=s.label_values("model_name", *RUNNING, *GENERATION_TOKENS),
        prompt_tokens_external=_by_source(s, SOURCE_EXTERNAL), prompt_tokens_local=_by_source(s, SOURCE_LOCAL),
        kv_in_bytes=s.total(KV_BYTES[0] + "_sum"), kv_transfers=s.total(KV_BYTES[0] + "_count"),
        kv_failed=s.total(*KV_FAILED), runtime=runtime_of(s),
    )


def engine_window(prev: Scrape, cur: Scrape) -> EngineWindow:
    rate = None
    pair = _prefix_pair(cur)
    if pair:
        dq = counter_increase(prev, cur, pair[0])
        dh = counter_increase(prev, cur, pair[1])
        rate = (dh / dq) if dq and dh is not None else None
    return EngineWindow(
        seconds=cur.time - prev.time,
        prompt_tps=counter_rate(prev, cur, *PROMPT_TOKENS),
        gen_tps=counter_rate(prev, cur, *GENERATION_TOKENS),
        generation_tokens=counter_increase(prev, cur, *GENERATION_TOKENS),
        prefix_hit_rate=_unit(rate),
        ttft=histogram_window(prev, cur, *TTFT),
        itl=histogram_window(prev, cur, *ITL),
        **_kv_window(prev, cur),
    )


def _kv_window(prev: Scrape, cur: Scrape) -> dict[str, Any]:
    n = counter_increase(prev, cur, KV_BYTES[0] + "_count")
    moved = counter_increase(prev, cur, KV_BYTES[0] + "_sum")
    ext, loc = source_increase(prev, cur, SOURCE_EXTERNAL), source_increase(prev, cur, SOURCE_LOCAL)
    share = ext / (ext + loc) if ext is not None and loc is not None and ext + loc > 0 else None
    return {"kv_transfers": n, "kv_bytes_per_transfer": moved / n if n and moved is not None else None,
            "kv_xfer": histogram_window(prev, cur, *KV_XFER_TIME) if n else None, "external_share": share}


def _unit(v: float | None) -> float | None:
    if v is None or math.isnan(v):
        return None
    return min(max(v, 0.0), 1.0)


@dataclass(frozen=True)
class RouterMetrics:
    requests: float | None               # counters since start
    errors: float | None
    backends_up: int | None
    backends_total: int | None
    backend_load: tuple[tuple[str, float], ...]   # (backend, in-flight requests)
    backend_requests: tuple[tuple[str, float], ...]   # (backend, requests sent to it since start)
    latency: Histogram | None
    ttft: Histogram | None


def router_metrics(s: Scrape) -> RouterMetrics | None:
    """What a router publishes, or None when the scrape has no router metric at all."""
    up = total = None
    health = s.values(ROUTER_WORKER_HEALTH)
    if health:
        total, up = len(health), sum(1 for v in health.values() if v >= 1)
        active = s.total(ROUTER_ACTIVE_WORKERS)
        if active is not None:
            up = min(up, int(active))
    else:
        states = s.values(LITELLM_DEPLOYMENT_STATE)
        if states:
            total, up = len(states), sum(1 for v in states.values() if v == 0)
    load = _per_backend(s, *ROUTER_WORKER_LOAD, LITELLM_IN_FLIGHT)
    sent = _per_backend(s, *ROUTER_BACKEND_REQUESTS)
    r = RouterMetrics(requests=s.total(*ROUTER_REQUESTS), errors=s.total(*ROUTER_ERRORS), backends_up=up,
                      backends_total=total, backend_load=load, backend_requests=sent,
                      latency=s.histogram(*ROUTER_LATENCY), ttft=s.histogram(*ROUTER_TTFT))
    if (r.requests is None and r.errors is None and total is None and not load and not sent
            and r.latency is None and r.ttft is None):
        return None
    return r


def _per_backend(s: Scrape, *names: str) -> tuple[tuple[str, float], ...]:
    """{backend: value summed over its other labels} of the first name present."""
    out: dict[str, float] = {}
    name = s.first(*names)
    if name:
        for labels, v in s.values(name).items():
            d = dict(labels)
            who = d.get("worker") or d.get("api_base") or d.get("litellm_model_name") or "?"
            out[who] = out.get(who, 0.0) + v
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class RouterWindow:
    seconds: float
    requests_per_s: float | None
    errors_per_s: float | None
    latency: Histogram | None
    ttft: Histogram | None


def router_window(prev: Scrape, cur: Scrape) -> RouterWindow:
    return RouterWindow(seconds=cur.time - prev.time, requests_per_s=counter_rate(prev, cur, *ROUTER_REQUESTS),
                        errors_per_s=counter_rate(prev, cur, *ROUTER_ERRORS),
                        latency=histogram_window(prev, cur, *ROUTER_LATENCY),
                        ttft=histogram_window(prev, cur, *ROUTER_TTFT))
