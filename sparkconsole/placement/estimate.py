"""How much memory each server of a plan needs on each node, and what it claims: the memory fit (issue 36).

Per server and node (bytes):
- weights: the model's weight bytes (placement/modelinfo.py) ÷ (tensor × pipeline parallel): a rank holds its
  slice of every layer it runs, and pipeline stages split the layers.
- KV cache per token, this node's share:
  - MLA models (DeepSeek V2/V3, kv_lora_rank set): one latent entry per layer, kv_lora_rank + qk_rope_head_dim
    values in the KV dtype; vLLM's fp8_ds_mla layout (DeepSeek's sparse attention with an fp8 cache) is 656 bytes
    per entry: 512 fp8 latent values, four float32 scales, 64 bfloat16 RoPE values (vLLM
    FlashMLASparseBackend.get_kv_cache_shape). The latent is not split over tensor-parallel ranks: every rank
    keeps it whole, so only pipeline parallel divides it.
  - other models: K and V, head_dim each, for every KV head this rank holds: num_kv_heads ÷ tp, at least one
    (vLLM replicates KV heads when tp exceeds them), over the rank's layers (÷ pp).
- kv: that per token × max_model_len (one full-length sequence).
- overhead: activations, CUDA graphs and the runtime's own buffers: a floor per runtime, not a measurement.
- claim: what the server takes at start: vLLM gpu_memory_utilization (0.9 when unset) × MemTotal, or its GiB form;
  SGLang mem_fraction_static × MemTotal (None when unset: SGLang picks its own); llama.cpp claims nothing (None):
  it allocates its weights and its context's KV, which is `need`. A CPU build of vLLM (the test bed) sizes its KV
  from VLLM_CPU_KVCACHE_SPACE: its claim is that plus its weights and overhead.

`fits`: the need within the claim (or, with no claim, within the node's MemTotal). `kv_tokens_fit`: the tokens of
KV the claim holds beside the weights and overhead. Pure: the caller reads the node's cache and MemTotal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..runtimes import LLAMA_CPP, SGLANG, VLLM, Runtime, flag_value, float_flag, int_flag, parallel, runtime_for
from .modelinfo import GIB, ModelInfo, dtype_bytes, resolve

if TYPE_CHECKING:
    from ..launch.steps import Plan

GB10_MEMTOTAL_B = int(121.7 * GIB)        # what a GB10 reports as MemTotal (gb10-facts.md)
FP8_DS_MLA_ENTRY_B = 656                  # vLLM's fp8_ds_mla: 512 fp8 + 4 float32 scales + 64 bfloat16 per layer
# Activations, CUDA graphs, the runtime's own buffers beside weights and KV: a floor, as preflight's memory rule
# has used since its start (1 GiB for vLLM); llama.cpp's compute buffers are a few hundred MiB for small contexts.
OVERHEAD_B = {VLLM: 1 * GIB, SGLANG: 1 * GIB, LLAMA_CPP: GIB // 2}


@dataclass(frozen=True)
class MemoryEstimate:
    """One server of a plan on one node, bytes."""

    node: str
    server: str                # the plan's server key
    weights_b: int | None      # this node's share of the weights
    kv_per_token_b: int | None  # this node's share of KV bytes per token (MLA-aware)
    kv_b: int | None           # KV at max_model_len (one full-length sequence)
    overhead_b: int            # activations, CUDA graphs, runtime
    claim_b: int | None        # what the server takes: gpu_memory_utilization × MemTotal, its GiB form,
                               # SGLang mem_fraction_static × MemTotal; None: no claim
    source: str                # "hf-cache" | "metadata" | "hub" | "unknown"
    notes: tuple[str, ...] = ()
    total_b: int | None = None  # the node's MemTotal the claim was taken of
    max_model_len: int | None = None

    @property
    def need_b(self) -> int | None:
        """weights + kv + overhead, None when the weights are unknown."""
        if self.weights_b is None:
            return None
        return self.weights_b + (self.kv_b or 0) + self.overhead_b

    @property
    def weights_exceed_claim(self) -> bool:
        return self.claim_b is not None and self.weights_b is not None and self.weights_b > self.claim_b

    @property
    def fits(self) -> bool | None:
        """The need within the claim (no claim: within the node's memory); None when it cannot be told."""
        need = self.need_b
        room = self.claim_b if self.claim_b is not None else self.total_b
        if need is None or room is None:
            return None
        return need <= room

    @property
    def kv_tokens_fit(self) -> int | None:
        """Tokens of KV the claim holds once the weights and overhead are in."""
        if self.claim_b is None or self.weights_b is None or not self.kv_per_token_b:
            return None
        return max(0, (self.claim_b - self.weights_b - self.overhead_b) // self.kv_per_token_b)


def _auto_dtype(runtime: Runtime, argv: Sequence[str], info: ModelInfo) -> str:
    asked = flag_value(argv, *runtime.dtype) if runtime.dtype else None
    if asked and asked != "auto" and dtype_bytes(asked):
        return asked
    return info.dtype if info.dtype and dtype_bytes(info.dtype) else "bfloat16"


def kv_per_token(runtime: Runtime, argv: Sequence[str], info: ModelInfo, tp: int,
                 pp: int) -> tuple[int | None, tuple[str, ...]]:
    """This rank's KV bytes per token, and what the figure rests on."""
    if info.kv_per_token_b and not (info.num_layers and (info.mla or info.num_kv_heads)):
        return int(math.ceil(info.kv_per_token_b / (tp * pp))), ("KV per token from the recipe's metadata",)
    if not info.num_layers:
        return None, ("KV per token unknown: the model's layer count is not known",)
    layers = math.ceil(info.num_layers / pp)
    asked = (flag_value(argv, *runtime.kv_dtype) if runtime.kv_dtype else None) or info.kv_dtype or "auto"
    kv_dtype = asked.lower()
    if info.mla:
        rank, rope = info.kv_lora_rank or 0, info.qk_rope_head_dim or 0
        if kv_dtype == "fp8_ds_mla" or (info.sparse_indexer and kv_dtype.startswith("fp8") and runtime.name == VLLM):
            ds: tuple[str, ...] = ("MLA KV in vLLM's fp8_ds_mla layout: 656 bytes per layer (512 fp8 latent, 4 float32 scales, "
                  "64 bfloat16 RoPE)",)
            if info.model_type and "v4" in info.model_type:
                ds += ("DeepSeek V4 compresses its KV further; not modelled: this is an upper bound",)
            return FP8_DS_MLA_ENTRY_B * layers, ds
        per = dtype_bytes(_auto_dtype(runtime, argv, info) if kv_dtype == "auto" else kv_dtype) or 2
        return int(math.ceil((rank + rope) * per * layers)), (
            f"MLA KV: one latent of {rank}+{rope} values per layer, whole on every tensor-parallel rank",)
    if not (info.num_kv_heads and info.head_dim):
        return None, ("KV per token unknown: the model's KV heads or head size are not known",)
    heads = max(1, math.ceil(info.num_kv_heads / tp))
    if runtime.name == LLAMA_CPP:
        k = dtype_bytes(kv_dtype if kv_dtype != "auto" else "f16") or 2
        v = dtype_bytes(flag_value(argv, *runtime.kv_dtype_v) or "f16") or 2
        return int(math.ceil((k + v) * info.head_dim * heads * layers)), ()
    per = dtype_bytes(_auto_dtype(runtime, argv, info) if kv_dtype == "auto" else kv_dtype) or 2
    replicated = (f"{info.num_kv_heads} KV heads over tensor parallel {tp}: each rank keeps one",)
    return int(math.ceil(2 * info.head_dim * heads * per * layers)), replicated if tp > info.num_kv_heads else ()


def _claim(runtime: Runtime, argv: Sequence[str], env: Mapping[str, str], weights: int | None,
           total: int) -> tuple[int | None, tuple[str, ...]]:
    if runtime.name == VLLM and (env.get("VLLM_TARGET_DEVICE") == "cpu"):
        # The CPU build's KV cache is a space of its own beside the weights and the process: it fits when one
        # full-length sequence's KV fits that space.
        space = float(env.get("VLLM_CPU_KVCACHE_SPACE") or 4)
        if weights is None:
            return None, ("vLLM CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE",)
        return weights + int(space * GIB) + OVERHEAD_B[VLLM], (
            f"vLLM CPU: weights + VLLM_CPU_KVCACHE_SPACE {space:g} GiB + overhead",)
    gib = float_flag(argv, runtime.claim_gib)
    if gib is not None:
        return int(gib * GIB), ()
    frac = float_flag(argv, runtime.claim_fraction)
    if frac is None:
        frac = runtime.default_claim_fraction
        if frac is None:
            return None, (("SGLang picks its own mem_fraction_static when the command sets none",)
                          if runtime.name == SGLANG else ())
    return int(frac * total), ()


def _max_len(runtime: Runtime, argv: Sequence[str], info: ModelInfo) -> int | None:
    n = int_flag(argv, runtime.context, 0)
    if n > 0:
        return n
    return info.max_position_embeddings


def estimate_server(runtime: Runtime, node: str, server: str, argv: Sequence[str], info: ModelInfo,
                    total_b: int | None, env: Mapping[str, str] = {}) -> MemoryEstimate:   # noqa: B006 — read only
    """One server's estimate on one node from its argv and the model."""
    tp, pp = parallel(runtime, argv)
    tp, pp = max(tp, 1), max(pp, 1)
    notes: list[str] = []
    total = total_b or GB10_MEMTOTAL_B
    if not total_b:
        notes.append("the node's MemTotal unknown: a GB10's 121.7 GiB assumed")
    weights = math.ceil(info.weights_b / (tp * pp)) if info.weights_b else None
    kv_tok, why = kv_per_token(runtime, argv, info, tp, pp)
    notes += why
    max_len = _max_len(runtime, argv, info)
    claim, claim_notes = _claim(runtime, argv, env, weights, total)
    notes += claim_notes
    return MemoryEstimate(node=node, server=server, weights_b=weights, kv_per_token_b=kv_tok,
                          kv_b=kv_tok * max_len if kv_tok is not None and max_len else None,
                          overhead_b=OVERHEAD_B[runtime.name], claim_b=claim, source=info.source,
                          notes=(*info.notes, *notes), total_b=total, max_model_len=max_len)


def estimate_plan(recipe: Any, plan: Plan, node_total_b: Mapping[str, int], *, info: ModelInfo | None = None,
                  hub: ModelInfo | None = None) -> list[MemoryEstimate]:
    """Every server of the plan on its node. `info`: the model as read from a node's Hugging Face cache (None:
    the recipe's metadata alone); `hub`: as the Hub has it, used last; `node_total_b`: each node's MemTotal (a
    GB10's where missing)."""
    model = resolve(info, getattr(recipe, "metadata", None), hub, model=getattr(recipe, "model", None))
    runtime = runtime_for(getattr(recipe, "runtime", None), getattr(recipe, "command", "") or "")
    out = []
    head = next(iter(plan.server_args.values()), ())
    for svc in plan.services:
        if svc.role == "router":
            continue
        # A Ray worker's container holds its rank of the head's command, which only the head runs.
        argv = plan.server_args.get(svc.key, head)
        env = dict(plan.server_env.get(svc.key, ()))
        out.append(estimate_server(runtime, svc.node, svc.key, argv, model, node_total_b.get(svc.node), env))
    return out


def gib(b: int | None) -> str:
    """Bytes in words: GiB, or MiB below one GiB (a test model's weights)."""
    if b is None:
        return "?"
    return f"{b / GIB:.1f} GiB" if b >= GIB else f"{b / 1024 ** 2:.1f} MiB"


def render(estimates: Sequence[MemoryEstimate]) -> list[str]:
    """The memory fit in words, one line per server and its notes (recipe plan, preflight, the recipes screen)."""
    lines = []
    for e in estimates:
        fit = {True: "fits", False: "DOES NOT FIT", None: "fit unknown"}[e.fits]
        tok = f"{e.kv_per_token_b / 1024:.1f} KiB/token" if e.kv_per_token_b else "? /token"
        at = f" at {e.max_model_len} tokens" if e.max_model_len else ""
        room = f"claim {gib(e.claim_b)}" if e.claim_b is not None else f"no claim (node {gib(e.total_b)})"
        more = f", {e.kv_tokens_fit:,} tokens of KV fit" if e.kv_tokens_fit is not None else ""
        lines.append(f"memory [{e.server}]: weights {gib(e.weights_b)} + KV {gib(e.kv_b)}{at} ({tok}) + overhead "
                     f"{gib(e.overhead_b)} = {gib(e.need_b)}; {room}: {fit}{more} (source: {e.source})")
    seen: list[str] = []
    for e in estimates:
        seen += [n for n in e.notes if n not in seen]
    lines += [f"  memory note: {n}" for n in seen]
    return lines
