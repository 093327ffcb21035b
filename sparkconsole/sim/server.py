"""A simulated vLLM OpenAI-compatible server: aiohttp on loopback, token timing from SimEngine.

    python -m sparkconsole.sim.server MODEL [vLLM serve args] [--sim-speed F] [--sim-node-dir DIR ...]

Speaks what vLLM speaks: POST /v1/chat/completions and /v1/completions (SSE chunks shaped like vLLM's,
`stream_options.include_usage`, `ignore_eos`, `min_tokens`, `max_tokens`; non-streaming too), /health,
/v1/models (id, max_model_len), /version (says simulated), /tokenize, /metrics (vLLM's metric names in a
prometheus_client registry, with a model_name label), and GET /sim/clock.

Clock: the engine steps in simulated seconds; the server sleeps step/speed of real time, so with
`--sim-speed F` everything runs F× faster than real time. Every figure the server reports itself
(histograms, usage timings, log throughput) is in simulated seconds; a client measuring wall time
multiplies its intervals by the `speed` from GET /sim/clock (also sent as the `X-Sim-Speed` header).

On a simulated node (started through the docker shim: --sim-node-dir/--sim-container) the server also
plays the node's workload: it loads weights into the node's memory, publishes its GPU busy fraction
for the thermal model and slows down while the node's GPU is thermally throttled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import time
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..errors import UserError
from .engine import EngineArgs, RequestRejected, SimEngine
from .experiment import ProxyProfile
from .node import pid_alive, read_json, write_load
from .profiles import GB10, MODELS, ModelProfile

VLLM_VERSION = "0.11.0"
SIM_VERSION = f"{VLLM_VERSION}+sim"
BLOCK = 16
WEIGHT_LOAD_BPS = 2.0e9          # simulated weight loading from local NVMe into unified memory
STARTUP_S = 4.0                  # process start, config, tokenizer (simulated seconds)
KV_ALLOC_S = 2.0
MAX_LAG_WALL_S = 0.25            # beyond this much real time behind its clock, the engine resyncs
# vLLM's engine core polls for work: an idle one starts its first step this long after a request arrives
# (the same constant the headless experiment uses, so served and headless figures agree).
ENGINE_WAKEUP_S = getattr(ProxyProfile(), "engine_wakeup_s", 0.0)

# ---------------------------------------------------------------------------------------------------
# A deterministic word tokenizer: a word or a punctuation mark is one token. /tokenize, usage and the
# generated text all agree on it, which is what clients check.

_WORD = re.compile(r"\w+|[^\w\s]")
_VOCAB = ("the of and to in is was for on that with as by at from his her are an be this which or had "
          "not but one all were they she there been has when who will more no if out so said what up its "
          "about into than them can only other new some could time these two may then do first any my now "
          "such like our over man me even most made after also did many before must through back years "
          "where much your way well down should because each just those people how too little state good "
          "very make world still own see men work long get here between both life being under never day "
          "same another know while last might us great old year off come since against go came right used "
          "take three").split()


def token_ids(text: str) -> list[int]:
    return [zlib.crc32(w.encode()) % 200000 for w in _WORD.findall(text)]


def count_tokens(text: str) -> int:
    return len(_WORD.findall(text))


def chat_prompt(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """A chat template: role markers around each message's text (tool/image parts reduced to text)."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        parts.append(f"<|start|> {m.get('role', 'user')} <|message|> {content or ''} <|end|>")
    if add_generation_prompt:
        parts.append("<|start|> assistant")
    return " ".join(parts)


def word_for(req_key: int, i: int) -> str:
    return _VOCAB[(req_key * 7919 + i * 104729) % len(_VOCAB)]


# ---------------------------------------------------------------------------------------------------
# vLLM command line

def vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve (simulated)", add_help=True, allow_abbrev=False)
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=lambda s: int(float(s.lower().replace("k", "")) * (1024 if "k" in s.lower() else 1)))
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--enable-prefix-caching", dest="prefix_caching", action="store_true", default=True)
    p.add_argument("--no-enable-prefix-caching", dest="prefix_caching", action="store_false")
    p.add_argument("--prefix-caching", dest="prefix_caching", action="store_true")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr")
    p.add_argument("--master-port", type=int)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--distributed-executor-backend")
    p.add_argument("--seed", type=int, default=0)
    # simulator-only flags (the docker shim adds the node ones)
    p.add_argument("--sim-speed", type=float)
    p.add_argument("--sim-profile", help="model profile name (default: matched from the model name)")
    p.add_argument("--sim-node-dir")
    p.add_argument("--sim-container")
    p.add_argument("--sim-memory-limit", type=int, default=0)
    p.add_argument("--sim-idle", action="store_true")
    p.add_argument("--sim-exec", action="store_true", help="started by docker exec: not the container's main process")
    p.add_argument("--sim-load-speedup", type=float)
    return p


def profile_for(model: str, override: str | None = None) -> ModelProfile:
    if override:
        if override not in MODELS:
            raise UserError(f"no simulated profile {override!r}", field="--sim-profile", fix="use one of " + ", ".join(MODELS))
        return MODELS[override]
    norm = model.lower().rstrip("/").rsplit("/", 1)[-1]
    for key in sorted(MODELS, key=len, reverse=True):
        if norm.startswith(key) or key in norm:
            return MODELS[key]
    raise UserError(f"the simulator has no profile for model {model!r}", field="model",
                    fix="serve one of " + ", ".join(MODELS) + " (or pass --sim-profile NAME)")


# ---------------------------------------------------------------------------------------------------
# logging like vLLM's

def log(msg: str, where: str = "api_server.py", level: str = "INFO") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    sys.stdout.write(f"{level} {stamp} [{where}] {msg}\n")
    sys.stdout.flush()


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

        def g(name, doc):
            return Gauge(name, doc, lb, registry=reg).labels(**self.labels)

        def c(name, doc):
            return Counter(name, doc, lb, registry=reg).labels(**self.labels)

        def h(name, doc, buckets):
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


# ---------------------------------------------------------------------------------------------------
# requests

@dataclass
class Req:
    rid: str
    key: int
    prompt_tokens: int
    max_tokens: int          # what the client allowed
    target: int              # what will be generated (EOS earlier unless ignore_eos)
    arrival: float
    cached_tokens: int = 0
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    first_at: float | None = None
    last_at: float | None = None
    generated: int = 0
    done: bool = False

    @property
    def finish_reason(self) -> str:
        return "length" if self.generated >= self.max_tokens else "stop"


class PrefixCache:
    """Which prompt blocks are still cached (LRU over chained block hashes, sized like the KV cache)."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = max(1, capacity_blocks)
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def lookup_and_insert(self, ids: list[int]) -> int:
        """Tokens of `ids` already cached (whole blocks, prefix only); the prompt's blocks become cached."""
        h, hit, missed = 0, 0, False
        for i in range(0, len(ids) - len(ids) % BLOCK, BLOCK):
            h = zlib.crc32(repr(ids[i:i + BLOCK]).encode(), h)
            if not missed and h in self.blocks:
                hit += BLOCK
                self.blocks.move_to_end(h)
            else:
                missed = True
                self.blocks[h] = None
                if len(self.blocks) > self.capacity:
                    self.blocks.popitem(last=False)
        return hit


class SimVllmServer:
    """One simulated `vllm serve`: engine loop, HTTP app, node workload publishing."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.model_arg = ns.model or ns.model_tag
        if not self.model_arg:
            raise UserError("no model given", field="model", fix="vllm serve MODEL [args]")
        self.served = (ns.served_model_name or [self.model_arg])[0]
        self.profile = profile_for(self.model_arg, ns.sim_profile)
        self.node_dir = Path(ns.sim_node_dir) if ns.sim_node_dir else None
        sim = (read_json(self.node_dir / "sim.json") if self.node_dir else None) or {}
        self.sim = sim
        self.speed = float(ns.sim_speed or sim.get("speed") or 1.0)
        self.load_speedup = float(ns.sim_load_speedup or sim.get("load_speedup") or 1.0)
        self.clock = SimClock(self.speed)
        self.host = sim.get("address") if sim.get("address") and ns.host in ("0.0.0.0", "::", "") else ns.host
        self.nodes = max(ns.tensor_parallel_size * ns.pipeline_parallel_size, ns.nnodes)
        self.max_model_len = ns.max_model_len or min(self.profile.max_context, 131072)
        self.args = EngineArgs(max_num_batched_tokens=ns.max_num_batched_tokens, max_num_seqs=ns.max_num_seqs,
                               gpu_memory_utilization=ns.gpu_memory_utilization, max_model_len=self.max_model_len,
                               tensor_parallel_size=ns.tensor_parallel_size * ns.pipeline_parallel_size,
                               kv_cache_dtype=ns.kv_cache_dtype, enforce_eager=ns.enforce_eager)
        self.engine: SimEngine | None = None
        self.metrics = Metrics(self.served)
        self.reqs: dict[str, Req] = {}
        self.prefix: PrefixCache | None = None
        self.reserved_b = 0
        self.phase = "starting"
        self.ready = False
        self._engine_t = 0.0
        self._wake = asyncio.Event()
        self._busy_acc = 0.0
        self._compute_acc = 0.0
        self._woke_by: float | None = None   # arrival of the request that woke the idle engine
        self._slow = 1.0
        self._stop = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task] = []
        self._req_seq = 0
        self._prefix_q = 0
        self._prefix_h = 0
        self._log_window = [0, 0, self.clock.now()]   # prompt tokens, generated tokens, since

    # ---- node coupling ---------------------------------------------------------------------------
    @property
    def load_key(self) -> str | None:
        return self.ns.sim_container if self.node_dir and self.ns.sim_container else None

    def publish(self, busy: float = 0.0, compute: float = 0.0) -> None:
        if self.load_key:
            write_load(self.node_dir, self.load_key, pid=os.getpid(), reserved_b=self.reserved_b, gpu_busy=busy,
                       compute_frac=compute, loaded=self.reserved_b > 0, phase=self.phase, address=self.host,
                       port=self.ns.port, tp_nodes=self.nodes)

    def _read_throttle(self) -> None:
        if not self.node_dir:
            return
        g = read_json(self.node_dir / "gpu.json")
        try:
            gpu = g["gpus"][0]
            self._slow = max(1.0, float(gpu["sm_clock_max_mhz"]) / max(1.0, float(gpu["sm_clock_mhz"])))
        except (TypeError, KeyError, IndexError, ValueError, ZeroDivisionError):
            self._slow = 1.0

    def _check_memory_limit(self) -> None:
        limit = self.ns.sim_memory_limit
        if limit and self.reserved_b > limit:
            # The cgroup's OOM killer ends the container: docker reports OOMKilled, exit 137.
            if self.node_dir and self.ns.sim_container:
                d = self.node_dir / "containers" / self.ns.sim_container
                (d / "oom").write_text("1\n")
                (d / "exitcode").write_text("137\n")
                (self.node_dir / "load" / f"{self.load_key}.json").unlink(missing_ok=True)
            sys.stdout.write("Killed\n")
            sys.stdout.flush()
            os._exit(137)

    def _node_free_b(self) -> int | None:
        if not self.node_dir:
            return None
        try:
            for line in (self.node_dir / "proc" / "meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            return None
        return None

    async def _publisher(self) -> None:
        last = time.monotonic()
        owner = self.sim.get("owner_pid")
        while not self._stop.is_set():
            await asyncio.sleep(0.25)
            now = time.monotonic()
            window = (now - last) * self.speed
            last = now
            busy = min(1.0, self._busy_acc / window) if window > 0 else 0.0
            compute = min(busy, self._compute_acc / window) if window > 0 else 0.0
            self._busy_acc = self._compute_acc = 0.0
            self._read_throttle()
            try:
                self.publish(busy, compute)
            except OSError:
                pass
            if self.node_dir and (not self.node_dir.is_dir() or (owner and not pid_alive(owner))):
                log("simulated node is gone; shutting down", "launcher.py")
                self._stop.set()
            self._maybe_log_stats()

    def _maybe_log_stats(self) -> None:
        if not self.engine:
            return
        now = self.clock.now()
        p0, g0, t0 = self._log_window
        if now - t0 < 10.0:
            return
        c = self.engine.counters
        dt = now - t0
        if c.prompt_tokens != p0 or c.generation_tokens != g0 or self.engine.has_work():
            q, hits = self._prefix_q, self._prefix_h
            log(f"Engine 000: Avg prompt throughput: {(c.prompt_tokens - p0) / dt:.1f} tokens/s, Avg generation "
                f"throughput: {(c.generation_tokens - g0) / dt:.1f} tokens/s, Running: {self.engine.running} reqs, "
                f"Waiting: {self.engine.waiting} reqs, GPU KV cache usage: {self.engine.kv_usage * 100:.1f}%, "
                f"Prefix cache hit rate: {(hits / q * 100) if q else 0:.1f}%", "loggers.py")
        self._log_window = [c.prompt_tokens, c.generation_tokens, now]

    # ---- startup -----------------------------------------------------------------------------------
    async def _wait_for_workers(self) -> None:
        """A multi-node head waits until every worker node mirrors it (vLLM waits for its ranks)."""
        if self.nodes <= 1 or not self.node_dir:
            return
        need, waited = self.nodes - 1, 0.0
        while not self._stop.is_set():
            found = 0
            for other in self.node_dir.parent.iterdir():
                if other == self.node_dir:
                    continue
                for p in (other / "load").glob("*.json"):
                    d = read_json(p)
                    if isinstance(d, dict) and d.get("mirror_of") == self.host and pid_alive(d.get("pid")):
                        found += 1
            if found >= need:
                log(f"All {self.nodes} nodes joined (tensor_parallel_size={self.args.tensor_parallel_size})",
                    "parallel_state.py")
                return
            if waited % 10.0 < 0.5:
                log(f"Waiting for {need - found} more node(s) to join at {self.host}", "parallel_state.py")
            await asyncio.sleep(0.5)
            waited += 0.5

    async def startup(self) -> None:
        ns = self.ns
        log(f"vLLM API server version {SIM_VERSION} (simulated)")
        log(f"non-default args: {{'model': {self.model_arg!r}, 'port': {ns.port}, 'gpu_memory_utilization': "
            f"{ns.gpu_memory_utilization}, 'max_model_len': {self.max_model_len}, 'max_num_batched_tokens': "
            f"{ns.max_num_batched_tokens}, 'max_num_seqs': {ns.max_num_seqs}, 'tensor_parallel_size': "
            f"{ns.tensor_parallel_size}}}", "utils.py")
        self.phase = "starting"
        self.publish()
        await self.clock.sleep(STARTUP_S / self.load_speedup)
        await self._wait_for_workers()
        total = GB10.memory_bytes
        want = ns.gpu_memory_utilization * total
        free = self._node_free_b()
        if free is not None and free < want:
            raise UserError(f"Free memory on device ({free / 2**30:.2f}/{total / 2**30:.2f} GiB) on startup is less "
                            f"than desired GPU memory utilization ({ns.gpu_memory_utilization}, "
                            f"{want / 2**30:.2f} GiB). Decrease GPU memory utilization or reduce GPU memory used "
                            "by other processes.")
        self.engine = SimEngine(self.profile, self.args, GB10, nodes=self.nodes)   # raises UserError if it won't fit
        weights = self.profile.weight_bytes / self.args.tensor_parallel_size
        self.phase = "loading"
        log(f"Starting to load model {self.model_arg}...", "gpu_model_runner.py")
        load_s = weights / WEIGHT_LOAD_BPS / self.load_speedup
        steps = max(1, int(load_s / 0.5 * self.load_speedup))
        for i in range(1, steps + 1):
            self.reserved_b = int(weights * i / steps)
            self._check_memory_limit()
            await self.clock.sleep(load_s / steps)
        log(f"Model loading took {weights / 2**30:.4f} GiB and {load_s:.6f} seconds", "gpu_model_runner.py")
        await self.clock.sleep(KV_ALLOC_S / self.load_speedup)
        self.reserved_b = int(want)
        self._check_memory_limit()
        kv_tokens = self.engine.kv_capacity_tokens
        log(f"GPU KV cache size: {kv_tokens:,} tokens", "kv_cache_utils.py")
        log(f"Maximum concurrency for {self.max_model_len:,} tokens per request: "
            f"{kv_tokens / self.max_model_len:.2f}x", "kv_cache_utils.py")
        self.prefix = PrefixCache(self.engine.kv_capacity_blocks) if ns.prefix_caching else None
        self.metrics.cache_info.labels(block_size=str(BLOCK), cache_dtype=ns.kv_cache_dtype,
                                       gpu_memory_utilization=str(ns.gpu_memory_utilization),
                                       num_gpu_blocks=str(self.engine.kv_capacity_blocks),
                                       enable_prefix_caching=str(ns.prefix_caching)).set(1)

    # ---- engine loop ---------------------------------------------------------------------------
    async def _engine_loop(self) -> None:
        eng = self.engine
        assert eng is not None
        idle = True
        while not self._stop.is_set():
            if not eng.has_work():
                idle = True
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self.clock.now()
            # Busy steps follow each other back to back in simulated time, whatever the real scheduling
            # jitter (a late wake-up shortens the next sleep). After idling, or when the host fell far
            # behind the clock, the engine restarts from "now".
            if idle:
                # An idle engine core starts its first step a fixed wake-up after the request that woke it
                # (not after this process got scheduled): served timings stay independent of host load.
                woke = self._woke_by if self._woke_by is not None else now
                start = max(self._engine_t, woke + ENGINE_WAKEUP_S)
                self._woke_by = None
            elif now - self._engine_t > MAX_LAG_WALL_S * self.speed:
                start = now
            else:
                start = self._engine_t
            idle = False
            res = eng.step()
            if res.num_seqs == 0:
                await asyncio.sleep(0.005)
                continue
            busy_s = res.busy * res.duration_s
            # A throttled SM clock stretches the GPU-bound part of the step, not the host overheads.
            dur = res.duration_s - busy_s + busy_s * self._slow
            end = start + dur
            self._engine_t = end
            self._busy_acc += busy_s * self._slow
            # matmul time of the step (prefill and batched decode are compute-bound; the rest streams memory)
            flops = 2.0 * self.profile.active_params * (res.prefill_tokens + res.decode_tokens)
            self._compute_acc += min(busy_s, flops / self.args.tensor_parallel_size / GB10.compute_flops_s) * self._slow
            await asyncio.sleep(max(0.0, (end - self.clock.now()) / self.speed))
            if res.preempted:
                self.metrics.preemptions.inc(res.preempted)
            if res.prefill_tokens:
                self.metrics.prompt_tokens.inc(res.prefill_tokens)
            for ev in res.events:
                req = self.reqs.get(ev.req_id)
                if req is None:
                    continue
                self._on_token(req, ev.new_tokens, ev.finished, end)

    def _on_token(self, req: Req, n: int, finished: bool, t: float) -> None:
        m = self.metrics
        if req.first_at is None:
            req.first_at = t
            m.ttft.observe(t - req.arrival)
        elif req.last_at is not None:
            gap = (t - req.last_at) / n
            for _ in range(n):
                m.itl.observe(gap)
                m.tpot.observe(gap)
        req.last_at = t
        req.generated += n
        m.generation_tokens.inc(n)
        if finished:
            req.done = True
            self.reqs.pop(req.rid, None)
            m.e2e.observe(t - req.arrival)
            m.prefill.observe(req.first_at - req.arrival)
            m.decode.observe(t - req.first_at)
            m.req_prompt.observe(req.prompt_tokens)
            m.req_gen.observe(req.generated)
            m.success.labels(**m.labels, finished_reason=req.finish_reason).inc()
        req.queue.put_nowait((n, finished, t))

    def submit(self, ids: list[int], body: dict) -> Req:
        """Validate sampling params like vLLM does and hand the request to the engine."""
        eng = self.engine
        assert eng is not None
        prompt = len(ids)
        if prompt < 1:
            raise RequestRejected("The prompt must contain at least one token.")
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        if mt is None:
            mt = self.max_model_len - prompt
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise RequestRejected(f"max_tokens must be at least 1, got {mt}.")
        min_t = body.get("min_tokens", 0) or 0
        if not isinstance(min_t, int) or min_t < 0 or min_t > mt:
            raise RequestRejected(f"min_tokens must be between 0 and max_tokens={mt}, got {min_t}.")
        if (body.get("n") or 1) != 1:
            raise RequestRejected("The simulated server supports n=1 only.")
        self._req_seq += 1
        key = zlib.crc32(repr(ids[:64]).encode()) ^ self._req_seq
        if body.get("ignore_eos"):
            target = mt
        else:
            # Without ignore_eos a model stops at its own end-of-sequence token: a stable length per prompt.
            eos_at = 48 + (zlib.crc32(repr(ids).encode()) % 700)
            target = max(min_t, min(mt, eos_at))
        if prompt + mt > self.max_model_len:
            raise RequestRejected(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt + mt} tokens ({prompt} in the messages, {mt} in the completion). Please reduce the "
                "length of the messages or completion.")
        rid = uuid.uuid4().hex
        cached = self.prefix.lookup_and_insert(ids) if self.prefix else 0
        cached = min(cached, prompt - 1)   # the last prompt token is always recomputed
        # Cached blocks are not prefilled again: the engine computes only the rest of the prompt.
        eng.add_request(rid, prompt - cached, target)
        self.metrics.prefix_queries.inc(prompt)
        self.metrics.prefix_hits.inc(cached)
        self._prefix_q += prompt
        self._prefix_h += cached
        self.metrics.req_max.observe(mt)
        # While the engine is busy its timeline may trail the clock by a little: the request arrives at
        # the engine's "now", so served latencies never include host scheduling lag.
        now = self.clock.now()
        arrival = min(now, self._engine_t) if eng.running or eng.waiting > 1 else now
        if self._woke_by is None and not (eng.running or eng.waiting > 1):
            self._woke_by = arrival
        req = Req(rid=rid, key=key, prompt_tokens=prompt, max_tokens=mt, target=target,
                  arrival=arrival, cached_tokens=cached)
        self.reqs[rid] = req
        self._wake.set()
        return req

    def abort(self, req: Req) -> None:
        if not req.done and self.engine:
            self.engine.abort(req.rid)
            self.reqs.pop(req.rid, None)
            self.metrics.success.labels(**self.metrics.labels, finished_reason="abort").inc()

    # ---- HTTP ------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.h_health)
        r.add_get("/ping", self.h_health)
        r.add_get("/version", self.h_version)
        r.add_get("/v1/models", self.h_models)
        r.add_get("/metrics", self.h_metrics)
        r.add_get("/sim/clock", self.h_clock)
        r.add_post("/tokenize", self.h_tokenize)
        r.add_post("/detokenize", self.h_detokenize)
        r.add_post("/v1/chat/completions", self.h_chat)
        r.add_post("/v1/completions", self.h_completions)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        key = self.ns.api_key or os.environ.get("VLLM_API_KEY")
        if key and request.path.startswith("/v1/"):
            if request.headers.get("Authorization", "") != f"Bearer {key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        resp = await handler(request)
        if not resp.prepared:
            resp.headers["X-Sim-Speed"] = repr(self.speed)
        return resp

    @staticmethod
    def error(message: str, status: int = 400, kind: str = "BadRequestError", param: str | None = None) -> web.Response:
        return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                                 status=status)

    async def h_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def h_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": SIM_VERSION, "simulated": True, "profile": self.profile.name})

    async def h_clock(self, request: web.Request) -> web.Response:
        return web.json_response({"speed": self.speed, "sim_time": self.clock.now(), "simulated": True,
                                  "engine_lag_s": max(0.0, self._engine_t - self.clock.now())})

    async def h_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.served, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": self.model_arg, "parent": None, "max_model_len": self.max_model_len,
            "permission": []}]})

    async def h_metrics(self, request: web.Request) -> web.Response:
        if self.engine:
            self.metrics.running.set(self.engine.running)
            self.metrics.waiting.set(self.engine.waiting)
            self.metrics.kv_usage.set(self.engine.kv_usage)
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _json(self, request: web.Request) -> dict:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise web.HTTPBadRequest(text=json.dumps({"error": {"message": "Invalid JSON body", "type": "BadRequestError",
                                                                "param": None, "code": 400}}),
                                     content_type="application/json")
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text='{"error": {"message": "body must be a JSON object", "code": 400}}',
                                     content_type="application/json")
        return body

    def _model_ok(self, body: dict) -> web.Response | None:
        model = body.get("model")
        if model is not None and model != self.served:
            return self.error(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
        return None

    async def h_tokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if (bad := self._model_ok(body)) is not None:
            return bad
        if isinstance(body.get("messages"), list):
            text = chat_prompt(body["messages"], body.get("add_generation_prompt", True))
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return self.error("tokenize needs 'prompt' (text) or 'messages'")
        ids = token_ids(text)
        return web.json_response({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids})

    async def h_detokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        toks = body.get("tokens")
        if not isinstance(toks, list):
            return self.error("detokenize needs 'tokens'")
        return web.json_response({"prompt": " ".join(_VOCAB[t % len(_VOCAB)] for t in toks if isinstance(t, int))})

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if (bad := self._model_ok(body)) is not None:
            return bad
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return self.error("'messages' must be a non-empty list", param="messages")
        ids = token_ids(chat_prompt(msgs))
        return await self._generate(request, body, ids, chat=True)

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if (bad := self._model_ok(body)) is not None:
            return bad
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1:
            p = p[0]
        if isinstance(p, str):
            ids = token_ids(p)
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            ids = list(p)
        else:
            return self.error("'prompt' must be a text or a list of token ids", param="prompt")
        return await self._generate(request, body, ids, chat=False)

    async def _generate(self, request: web.Request, body: dict, ids: list[int], *, chat: bool) -> web.StreamResponse:
        if not self.engine:
            return self.error("engine not ready", 503, "ServiceUnavailableError")
        try:
            req = self.submit(ids, body)
        except RequestRejected as exc:
            return self.error(str(exc))
        created = int(time.time())
        rid = ("chatcmpl-" if chat else "cmpl-") + req.rid
        obj = "chat.completion.chunk" if chat else "text_completion"
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        continuous = bool(opts.get("continuous_usage_stats"))

        def usage(done: int) -> dict:
            u = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + done, "completion_tokens": done}
            if req.cached_tokens:
                u["prompt_tokens_details"] = {"cached_tokens": req.cached_tokens}
            return u

        def text_of(start: int, n: int) -> str:
            return "".join(" " + word_for(req.key, i) for i in range(start, start + n))

        if not body.get("stream"):
            produced = 0
            try:
                while not req.done:
                    n, _, _ = await req.queue.get()
                    produced += n
            except asyncio.CancelledError:
                self.abort(req)
                raise
            text = text_of(0, produced).lstrip()
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                                  "tool_calls": []}, "logprobs": None,
                          "finish_reason": req.finish_reason, "stop_reason": None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": req.finish_reason,
                          "stop_reason": None}
            return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                      "created": created, "model": self.served, "choices": [choice],
                                      "usage": usage(produced)}, headers={"X-Sim-Speed": repr(self.speed)})

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache", "X-Sim-Speed": repr(self.speed)})
        await resp.prepare(request)
        head = {"id": rid, "object": obj, "created": created, "model": self.served}

        def chunk(choices: list, u: dict | None = None) -> bytes:
            d = dict(head, choices=choices)
            if u is not None:
                d["usage"] = u
            return b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"

        produced = 0
        try:
            while True:
                n, finished, _ = await req.queue.get()
                if chat and produced == 0:
                    # vLLM sends the role chunk with the first engine output, not before the prefill
                    await resp.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}], usage(0) if continuous else None))
                text = text_of(produced, n)
                produced += n
                fr = req.finish_reason if finished else None
                if chat:
                    ch = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": fr}
                else:
                    ch = {"index": 0, "text": text, "logprobs": None, "finish_reason": fr, "stop_reason": None}
                await resp.write(chunk([ch], usage(produced) if continuous else None))
                if finished:
                    break
            if include_usage:
                await resp.write(chunk([], usage(produced)))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.abort(req)
            raise
        return resp

    # ---- run -------------------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        self._tasks.append(asyncio.create_task(self._publisher()))
        try:
            await self._startup_or_stop()
            if self._stop.is_set():
                return 0
            self._tasks.append(asyncio.create_task(self._engine_loop()))
            self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.ns.port, reuse_address=True)
            await site.start()
            self.phase = "ready"
            self.ready = True
            self.publish()
            if self.node_dir and self.ns.sim_container:
                (self.node_dir / "containers" / self.ns.sim_container / "ready").write_text("1\n")
            log(f"Starting vLLM API server 0 on http://{self.host}:{self.ns.port}", "launcher.py")
            log("Started server process [%d]" % os.getpid(), "server.py")
            log("Waiting for application startup.", "on.py")
            log("Application startup complete.", "on.py")
            await self._stop.wait()
            log("Shutting down", "server.py")
            return 0
        finally:
            for t in self._tasks:
                t.cancel()
            if self._runner:
                await self._runner.cleanup()
            self._unpublish()

    async def _startup_or_stop(self) -> None:
        start = asyncio.create_task(self.startup())
        stop = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait({start, stop}, return_when=asyncio.FIRST_COMPLETED)
        if start in done:
            stop.cancel()
            start.result()
        else:
            start.cancel()

    def _unpublish(self) -> None:
        if self.load_key:
            (self.node_dir / "load" / f"{self.load_key}.json").unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------
# workers and placeholders (no HTTP)

def _node_by_address(node_dir: Path, address: str) -> Path | None:
    for other in node_dir.parent.iterdir():
        sim = read_json(other / "sim.json")
        if isinstance(sim, dict) and sim.get("address") == address:
            return other
    return None


async def mirror_head(node_dir: Path | None, key: str | None, head_addr: str | None, what: str) -> int:
    """A headless rank (vLLM --headless, or a Ray worker) holds its share of a head's model: mirror the
    head's memory and busy fraction on this node until stopped."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log(f"{what}: waiting for head at {head_addr or '?'}", "multiproc_executor.py")
    sim = (read_json(node_dir / "sim.json") if node_dir else None) or {}
    owner = sim.get("owner_pid")
    joined = False
    try:
        while not stop.is_set():
            if node_dir and key and head_addr:
                head_dir = _node_by_address(node_dir, head_addr)
                best = None
                for p in (head_dir / "load").glob("*.json") if head_dir else ():
                    d = read_json(p)
                    if isinstance(d, dict) and (d.get("tp_nodes") or 1) > 1 and pid_alive(d.get("pid")):
                        best = d
                reserved = int(best.get("reserved_b", 0)) if best else 0
                busy = float(best.get("gpu_busy", 0.0)) if best else 0.0
                compute = float(best.get("compute_frac", 0.0)) if best else 0.0
                write_load(node_dir, key, pid=os.getpid(), reserved_b=reserved, gpu_busy=busy, compute_frac=compute,
                           loaded=reserved > 0, phase="worker", mirror_of=head_addr)
                if best and not joined:
                    joined = True
                    log(f"{what}: joined head at {head_addr}", "multiproc_executor.py")
            # the simulated cluster that owns this node is gone: nothing will ever stop us otherwise
            if (node_dir and not node_dir.is_dir()) or (owner and not pid_alive(owner)):
                break
            try:
                await asyncio.wait_for(stop.wait(), 0.25)
            except asyncio.TimeoutError:
                pass
    finally:
        if node_dir and key:
            (node_dir / "load" / f"{key}.json").unlink(missing_ok=True)
    return 0


def _ray_head_address(cmd: list[str]) -> str | None:
    text = " ".join(cmd)
    if "ray" not in text or "start" not in text or "--head" in text:
        return None
    m = re.search(r"--address[= ]['\"]?([^:'\" ]+)", text)
    return m.group(1) if m else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--sim-idle" in argv:
        # A placeholder container (anything that is not a vLLM server): stays up until stopped.
        i = argv.index("--")
        ns, _ = vllm_parser().parse_known_args(argv[:i])
        cmd = argv[i + 1:]
        log(f"simulated container runs: {' '.join(cmd) or '(image default)'}", "sim")
        node_dir = Path(ns.sim_node_dir) if ns.sim_node_dir else None
        code = asyncio.run(mirror_head(node_dir, ns.sim_container, _ray_head_address(cmd), "ray worker"))
        _write_exit(ns, code)
        return code
    ns, unknown = vllm_parser().parse_known_args(argv)
    if unknown:
        log(f"simulated vLLM ignores arguments: {' '.join(unknown)}", "arg_utils.py", "WARNING")
    if ns.headless:
        node_dir = Path(ns.sim_node_dir) if ns.sim_node_dir else None
        code = asyncio.run(mirror_head(node_dir, ns.sim_container, ns.master_addr, f"headless rank {ns.node_rank}"))
        _write_exit(ns, code)
        return code
    try:
        server = SimVllmServer(ns)
        code = asyncio.run(server.run())
    except UserError as exc:
        log(f"ValueError: {exc.problem}" + (f" ({exc.fix})" if exc.fix else ""), "core.py", "ERROR")
        code = 1
    except OSError as exc:
        log(f"OSError: {exc}", "api_server.py", "ERROR")
        code = 1
    _write_exit(ns, code)
    return code


def _write_exit(ns: argparse.Namespace, code: int) -> None:
    if ns.sim_node_dir and ns.sim_container and not ns.sim_exec:
        d = Path(ns.sim_node_dir) / "containers" / ns.sim_container
        try:
            if d.is_dir():
                (d / "exitcode").write_text(f"{code}\n")
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
