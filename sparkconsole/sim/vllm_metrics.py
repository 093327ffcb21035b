"""What a simulated vLLM server measures with: its clock (simulated seconds, real time × speed) and vLLM's V1
metric names in a prometheus_client registry."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..errors import UserError


class SimClock:
    """Simulated seconds since start: real time × speed."""

    def __init__(self, speed: float) -> None:
        if not speed > 0:
            raise UserError(f"speed must be positive, got {speed}", field="--speed", fix="use e.g. 1 or 10")
        self.speed = float(speed)
        self.t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self.t0) * self.speed

    async def sleep(self, sim_seconds: float) -> None:
        await asyncio.sleep(max(0.0, sim_seconds) / self.speed)


# ---------------------------------------------------------------------------------------------------
# metrics

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)
_TOK_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class Metrics:
    """vLLM's V1 metric names, one registry per server."""

    def __init__(self, model_name: str) -> None:
        self.registry = reg = CollectorRegistry()
        lb = ["model_name", "engine"]
        self.labels = {"model_name": model_name, "engine": "0"}

        def g(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, lb, registry=reg).labels(**self.labels)

        def c(name: str, doc: str) -> Counter:
            return Counter(name, doc, lb, registry=reg).labels(**self.labels)

        def h(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, lb, buckets=buckets, registry=reg).labels(**self.labels)

        self.running = g("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = c("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               lb + ["finished_reason"], registry=reg)
        self.ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS)
        self.itl = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS)
        self.tpot = h("vllm:time_per_output_token_seconds",
                      "Histogram of time per output token in seconds (deprecated name of inter_token_latency).", _ITL_BUCKETS)
        self.e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _E2E_BUCKETS)
        self.queue = h("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _E2E_BUCKETS)
        self.prefill = h("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", _E2E_BUCKETS)
        self.decode = h("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", _E2E_BUCKETS)
        self.req_prompt = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", _TOK_BUCKETS)
        self.req_gen = h("vllm:request_generation_tokens", "Number of generation tokens processed.", _TOK_BUCKETS)
        self.req_max = h("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", _TOK_BUCKETS)
        self.cache_info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                ["block_size", "cache_dtype", "gpu_memory_utilization", "num_gpu_blocks",
                                 "enable_prefix_caching"], registry=reg)

