"""A discrete-time model of one vLLM V1 engine: continuous batching, chunked prefill, paged KV cache.

No I/O and no real time: `step()` schedules one batch exactly the way vLLM's V1 scheduler does
(running requests first — decodes and unfinished prefill chunks — then waiting requests fill what is
left of the `max_num_batched_tokens` budget, at most `max_num_seqs` running, KV blocks allocated per
step, the newest running request preempted and recomputed when blocks run out) and returns how many
simulated seconds that batch takes on the hardware profile, with the tokens it produced.

Step time is a small roofline built from the profiles (docs/SIMULATION.md):
    overhead + per-sequence overhead + max(CPU launch time, GPU time), GPU time =
    bytes streamed (dense weights + the routed experts the batch touches + KV read) / effective bandwidth
  + FLOPs (2 x active params per token + attention) / effective FLOP/s
  + tensor parallel: two all-reduces per layer over the link (latency + bytes / bandwidth).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from sparkconsole.errors import UserError
from sparkconsole.sim.profiles import GB10, HardwareProfile, ModelProfile

KV_BLOCK_TOKENS = 16   # vLLM's default block size


class RequestRejected(ValueError):
    """The engine refuses a request, as vLLM answers HTTP 400 (message is one line)."""


@dataclass
class EngineArgs:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.7
    max_model_len: int = 4096
    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = True


@dataclass(frozen=True)
class TokenEvent:
    req_id: str
    new_tokens: int
    first: bool       # this event carries the request's first output token
    finished: bool    # the request is done (max_tokens reached)


@dataclass(frozen=True)
class StepResult:
    duration_s: float
    events: list[TokenEvent]
    prefill_tokens: int = 0
    decode_tokens: int = 0
    num_seqs: int = 0
    busy: float = 0.0          # fraction of the step the GPU spent on math/memory (vs. overheads)
    preempted: int = 0


@dataclass
class _Request:
    req_id: str
    prompt_tokens: int
    max_tokens: int
    computed: int = 0          # tokens whose KV is in the cache
    generated: int = 0
    blocks: int = 0            # KV blocks held

    @property
    def target(self) -> int:
        """Tokens that must be in the KV cache before the next token can be sampled."""
        return self.prompt_tokens + max(0, self.generated - 1) if self.generated else self.prompt_tokens

    @property
    def prefilling(self) -> bool:
        return self.computed < self.target


@dataclass
class EngineCounters:
    prompt_tokens: int = 0         # prefill tokens computed (recomputation after preemption included)
    generation_tokens: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_s: float = 0.0
    elapsed_s: float = 0.0


def step_time(model: ModelProfile, hw: HardwareProfile, *, tp: int, decode_ctx: list[int],
              prefill_chunks: list[tuple[int, int]], kv_cache_dtype: str = "auto",
              eager: bool = True) -> tuple[float, float]:
    """Seconds one batch takes, and the part of it the GPU is busy.

    decode_ctx: context length of each decoding sequence; prefill_chunks: (new tokens, tokens already
    in the cache) per prefilling sequence. Per GPU: weights and KV heads are split `tp` ways.
    """
    n_seqs = len(decode_ctx) + len(prefill_chunks)
    if n_seqs == 0:
        return 0.0, 0.0
    tokens = len(decode_ctx) + sum(n for n, _ in prefill_chunks)
    # bytes streamed from memory
    weight_bytes = model.dense_bytes
    if model.is_moe:
        e, k = model.num_experts, model.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** (tokens ** model.expert_routing_exponent))
        weight_bytes += model.layers * touched * model.expert_bytes
    kv_per_token = model.kv_bytes_per_token(kv_cache_dtype)
    ctx_total = sum(decode_ctx) + sum(n + past for n, past in prefill_chunks)
    kv_bytes = kv_per_token * ctx_total
    eff = model.kernel_efficiency
    t_mem = (weight_bytes + kv_bytes) / tp / (hw.mem_bw_bytes_s * hw.mem_bw_efficiency * eff)
    # math
    attn_layers = model.layers if model.full_attn_layers is None else model.full_attn_layers
    attn_flops = 4.0 * attn_layers * model.hidden_size * (
        sum(decode_ctx) + sum(n * (past + n / 2) for n, past in prefill_chunks))
    flops = 2.0 * model.active_params * tokens + attn_flops
    t_comp = flops / tp / (hw.compute_flops_s * eff)
    # tensor parallel: an all-reduce after attention and after the MLP, in every layer
    t_comm = 0.0
    if tp > 1:
        msg = tokens * model.hidden_size * 2.0
        ring = 2.0 * (tp - 1) / tp * msg / (hw.link_bytes_s * hw.link_efficiency)
        t_comm = 2 * model.layers * (hw.allreduce_latency_s + ring)
    busy = t_mem + t_comp + t_comm
    cpu = hw.cpu_step_s + hw.launch_s_per_layer * model.layers * (1.0 if eager else 0.1)
    total = hw.step_overhead_s + hw.seq_overhead_s * n_seqs + max(busy, cpu)
    return total, busy


class SimEngine:
    """One vLLM engine (possibly spanning `nodes` GB10s with tensor parallelism)."""

    def __init__(self, model: ModelProfile, args: EngineArgs, hw: HardwareProfile = GB10,
                 nodes: int = 1) -> None:
        tp = args.tensor_parallel_size
        if tp < 1:
            raise UserError(f"tensor_parallel_size must be at least 1, got {tp}",
                            field="tensor_parallel_size", fix="set tensor_parallel_size to 1 or the node count")
        if nodes < tp:
            raise UserError(f"tensor_parallel_size {tp} needs {tp} GB10 nodes (one GPU each), got {nodes}",
                            field="tensor_parallel_size", fix=f"use {nodes} or add nodes")
        if not 0.0 < args.gpu_memory_utilization <= 1.0:
            raise UserError(f"gpu_memory_utilization must be in (0, 1], got {args.gpu_memory_utilization}",
                            field="gpu_memory_utilization", fix="use a fraction such as 0.7")
        if args.max_num_batched_tokens < 1 or args.max_num_seqs < 1 or args.max_model_len < 1:
            raise UserError("max_num_batched_tokens, max_num_seqs and max_model_len must be positive",
                            field="engine args", fix="use positive integers")
        if args.max_model_len > model.max_context:
            raise UserError(f"max_model_len {args.max_model_len} exceeds {model.name}'s context "
                            f"{model.max_context}", field="max_model_len", fix=f"use at most {model.max_context}")
        self.model = model
        self.args = args
        self.hw = hw
        self.nodes = nodes
        self.tp = tp
        self.kv_dtype = args.kv_cache_dtype
        self.kv_bytes_per_token = model.kv_bytes_per_token(args.kv_cache_dtype)
        budget = args.gpu_memory_utilization * hw.memory_bytes * tp
        kv_bytes = budget - model.weight_bytes - hw.nonweight_reserve_bytes * tp
        if kv_bytes <= self.kv_bytes_per_token * KV_BLOCK_TOKENS:
            need = (model.weight_bytes + hw.nonweight_reserve_bytes * tp) / (hw.memory_bytes * tp)
            raise UserError(
                f"{model.name} does not fit: {model.weight_bytes / 1e9:.0f} GB of weights in "
                f"{budget / 1e9:.0f} GB ({args.gpu_memory_utilization:.2f} x {tp} GPU)",
                field="gpu_memory_utilization",
                fix=f"raise gpu_memory_utilization above {min(need, 1.0):.2f} or add tensor parallel nodes")
        self.kv_capacity_blocks = int(kv_bytes // (self.kv_bytes_per_token * KV_BLOCK_TOKENS))
        # sliding-window layers hold a bounded window per sequence: charge it as extra blocks
        self._window_blocks = math.ceil(model.sliding_kv_bytes(args.kv_cache_dtype)
                                        / (self.kv_bytes_per_token * KV_BLOCK_TOKENS)) if model.sliding_window else 0
        self._free_blocks = self.kv_capacity_blocks
        self._running: list[_Request] = []
        self._waiting: deque[_Request] = deque()
        self._by_id: dict[str, _Request] = {}
        self.counters = EngineCounters()
        self.gpu_busy = 0.0

    # ---- public state -------------------------------------------------------------------------
    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_capacity_blocks * KV_BLOCK_TOKENS

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self._free_blocks / self.kv_capacity_blocks

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._by_id

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, req_id: str, prompt_tokens: int, max_tokens: int, *, prefilled_tokens: int = 0) -> None:
        """Queue a request. `prefilled_tokens`: prompt KV already computed elsewhere and transferred in
        (disaggregated prefill); as vLLM's KV connectors do, the last prompt token is recomputed here."""
        if req_id in self._by_id:
            raise RequestRejected(f"request id {req_id!r} is already in the engine")
        if prompt_tokens < 1 or max_tokens < 1:
            raise RequestRejected("prompt_tokens and max_tokens must be at least 1")
        limit = self.args.max_model_len
        if prompt_tokens + max_tokens > limit:
            # vLLM's wording, so clients see the same 400 message as from a real server
            raise RequestRejected(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion).")
        need = self._blocks_for(prompt_tokens + max_tokens)
        if need > self.kv_capacity_blocks:
            raise RequestRejected(f"request needs {need * KV_BLOCK_TOKENS} KV tokens; the cache holds "
                                  f"{self.kv_capacity_tokens}")
        req = _Request(req_id, prompt_tokens, max_tokens, computed=max(0, min(prefilled_tokens, prompt_tokens - 1)))
        self._by_id[req_id] = req
        self._waiting.append(req)

    def abort(self, req_id: str) -> None:
        req = self._by_id.pop(req_id, None)
        if req is None:
            return
        if req in self._running:
            self._running.remove(req)
        else:
            self._waiting.remove(req)
        self._release(req)
        self.counters.requests_aborted += 1

    # ---- KV blocks ----------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / KV_BLOCK_TOKENS) + self._window_blocks

    def _try_allocate(self, req: _Request, tokens_after: int) -> bool:
        need = self._blocks_for(tokens_after) - req.blocks
        if need <= 0:
            return True
        if need > self._free_blocks:
            return False
        self._free_blocks -= need
        req.blocks += need
        return True

    def _release(self, req: _Request) -> None:
        self._free_blocks += req.blocks
        req.blocks = 0

    def _preempt(self, req: _Request) -> None:
        # vLLM V1 preempts by recompute: drop the KV, requeue at the front, keep the output so far
        self._running.remove(req)
        self._release(req)
        req.computed = 0
        self._waiting.appendleft(req)
        self.counters.preemptions += 1

    # ---- one step -----------------------------------------------------------------------------
    def step(self) -> StepResult:
        budget = self.args.max_num_batched_tokens
        scheduled: list[tuple[_Request, int]] = []
        preempted = 0
        # 1. running requests, oldest first: a decode token each, or the next prefill chunk
        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            n = min(req.target - req.computed, budget) if req.prefilling else 1
            while not self._try_allocate(req, req.computed + n):
                victim = self._running[-1]
                self._preempt(victim)
                preempted += 1
                if victim is req:
                    break
            else:
                scheduled.append((req, n))
                budget -= n
                i += 1
                continue
            break  # req itself was preempted: nothing after it can be scheduled
        # 2. waiting requests, in arrival order, while budget, sequence slots and KV blocks last
        if not preempted:
            while self._waiting and budget > 0 and len(self._running) < self.args.max_num_seqs:
                req = self._waiting[0]
                n = min(req.target - req.computed, budget)
                if not self._try_allocate(req, req.computed + n):
                    break
                self._waiting.popleft()
                self._running.append(req)
                scheduled.append((req, n))
                budget -= n

        decode_ctx: list[int] = []
        prefill_chunks: list[tuple[int, int]] = []
        for req, n in scheduled:
            if req.prefilling:
                prefill_chunks.append((n, req.computed))
            else:
                decode_ctx.append(req.computed + 1)
        duration, busy = step_time(self.model, self.hw, tp=self.tp, decode_ctx=decode_ctx,
                                   prefill_chunks=prefill_chunks, kv_cache_dtype=self.kv_dtype,
                                   eager=self.args.enforce_eager)

        events: list[TokenEvent] = []
        prefill_tokens = 0
        for req, n in scheduled:
            was_prefill = req.prefilling
            req.computed += n
            if was_prefill:
                prefill_tokens += n
                if req.prefilling:
                    continue   # more chunks to go: no token sampled yet
            first = req.generated == 0
            req.generated += 1
            finished = req.generated >= req.max_tokens
            events.append(TokenEvent(req.req_id, 1, first, finished))
            if finished:
                self._running.remove(req)
                self._release(req)
                del self._by_id[req.req_id]
                self.counters.requests_finished += 1
        c = self.counters
        c.prompt_tokens += prefill_tokens
        c.generation_tokens += len(events)
        c.steps += 1 if scheduled else 0
        c.busy_s += busy
        c.elapsed_s += duration
        self.gpu_busy = busy / duration if duration > 0 else 0.0
        return StepResult(duration, events, prefill_tokens, len(decode_ctx), len(scheduled),
                          self.gpu_busy, preempted)
