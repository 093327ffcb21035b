"""One simulated `vllm serve`: the engine on its clock, the requests it serves, and the node's workload.

On a simulated node (started through the docker shim: --sim-node-dir/--sim-container) the server also plays the
node's workload: it loads weights into the node's memory, publishes its GPU busy fraction for the thermal model
and slows down while the node's GPU is thermally throttled. Its HTTP routes are in sim/vllm_http.py; how it is
started (and the headless ranks that mirror it) in sim/server.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

from aiohttp import web

from ..errors import UserError
from .engine import EngineArgs, RequestRejected, SimEngine
from .experiment import ProxyProfile
from .files import pid_alive, read_json
from .node import GIB, PAGE_TABLES_PER_GIB, write_load
from .profiles import GB10
from .vllm_args import SIM_VERSION, log, profile_for
from .vllm_http import VllmHttpApi
from .vllm_metrics import Metrics, SimClock
from .vllm_request import Req

BLOCK = 16
WEIGHT_LOAD_BPS = 2.0e9          # simulated weight loading from local NVMe into unified memory
STARTUP_S = 4.0                  # process start, config, tokenizer (simulated seconds)
KV_ALLOC_S = 2.0
# vLLM's CPU side (Python, torch, compile workers, host buffers): what its container's cgroup is charged besides page
# tables. A GB10 serving vLLM showed ~9.4 GiB of host memory in use beyond the worker's 89.3 GiB of GPU memory
# (Syllo/nvtop pull request 511), the OS's ~5 GiB (GB10Spec.os_used_kb) included: ~4 GiB is vLLM's.
CPU_SIDE_B = 4 << 30
MAX_LAG_WALL_S = 0.25            # beyond this much real time behind its clock, the engine resyncs
# vLLM's engine core polls for work: an idle one starts its first step this long after a request arrives
# (the same constant the headless experiment uses, so served and headless figures agree).
ENGINE_WAKEUP_S = getattr(ProxyProfile(), "engine_wakeup_s", 0.0)


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


class SimVllmServer(VllmHttpApi):
    """One simulated `vllm serve`: engine loop, HTTP app, node workload publishing."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.model_arg = ns.model or ns.model_tag
        if not self.model_arg:
            raise UserError("no model given", field="model", fix="vllm serve MODEL [args]")
        # vLLM answers to every --served-model-name and names the first in its responses
        self.names = tuple(ns.served_model_name or [self.model_arg])
        self.served = self.names[0]
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
        self._tasks: list[asyncio.Task[None]] = []
        self._req_seq = 0
        self._prefix_q = 0
        self._prefix_h = 0
        self._log_window = [0, 0, self.clock.now()]   # prompt tokens, generated tokens, since

    # ---- node coupling ---------------------------------------------------------------------------
    @property
    def load_key(self) -> str | None:
        return self.ns.sim_container if self.node_dir and self.ns.sim_container else None

    def publish(self, busy: float = 0.0, compute: float = 0.0) -> None:
        if self.load_key and self.node_dir:          # a load key implies the node directory
            write_load(self.node_dir, self.load_key, pid=os.getpid(), reserved_b=self.reserved_b, cpu_b=CPU_SIDE_B,
                       gpu_busy=busy,
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
        # What the container's cgroup is charged on a GB10: the CPU side and the page tables of the GPU memory, not
        # the GPU memory itself (sim/node.py). Only that reaching the cap brings its OOM kill.
        charged = CPU_SIDE_B + self.reserved_b // GIB * PAGE_TABLES_PER_GIB
        if limit and charged > limit:
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
            with contextlib.suppress(OSError):
                self.publish(busy, compute)
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
        self._check_memory_limit()           # its CPU side (Python, torch) is there before any GPU memory
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

    def submit(self, ids: list[int], body: dict[str, Any]) -> Req:
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
            log(f"Started server process [{os.getpid()}]", "server.py")
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
        if self.load_key and self.node_dir:
            (self.node_dir / "load" / f"{self.load_key}.json").unlink(missing_ok=True)
