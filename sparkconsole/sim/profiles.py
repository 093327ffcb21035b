"""Hardware and model profiles the simulated engine computes step times from.

Facts (bandwidth, layer counts, head sizes, parameter counts) come from public model cards and the
published GB10 figures (sparkconsole/sim/data/, the reference notes gb10-facts.md); the few *efficiency* constants
on the hardware profile are fitted against the published gpt-oss-120b topology sweep by `benchmarks/fit_sim.py`
(see docs/SIMULATION.md for the fit and its residuals).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

GIB = 1024 ** 3


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator node, plus the link that joins nodes for tensor parallelism."""

    name: str
    memory_bytes: float            # what the GPU reports as total (unified memory on GB10)
    mem_bw_bytes_s: float          # peak memory bandwidth
    # --- fitted: how much of the peaks a vLLM step actually gets ---
    mem_bw_efficiency: float       # fraction of peak bandwidth reached streaming weights and KV
    compute_flops_s: float         # effective FLOP/s on prefill matmuls (already includes efficiency)
    step_overhead_s: float         # fixed cost of one engine step added to the GPU time (fitted: 0)
    seq_overhead_s: float          # per scheduled sequence per step (sampling, output processing; fitted: 0)
    # --- interconnect for tensor parallel across nodes (ConnectX-7) ---
    link_bytes_s: float            # per-direction link bandwidth
    allreduce_latency_s: float     # fixed latency of one all-reduce over the link (fitted)
    link_efficiency: float = 0.8   # fraction of link bandwidth a ring all-reduce reaches
    nonweight_reserve_bytes: float = 3.0 * GIB   # activations + runtime outside the KV cache
    # CPU side of a step (Python scheduler + kernel launches). It runs ahead of the GPU, so it only
    # shows when the GPU work is shorter — small models; not fitted (hidden under gpt-oss's GPU time).
    cpu_step_s: float = 0.001
    launch_s_per_layer: float = 60e-6     # eager mode; CUDA graphs cut it to a fraction

    def with_(self, **changes: Any) -> HardwareProfile:
        return replace(self, **changes)


@dataclass(frozen=True)
class ModelProfile:
    """What one forward step has to read and compute, per token and per step."""

    name: str
    total_params: float
    active_params: float           # parameters touched per token (dense + routed experts + shared)
    layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    weight_bytes: float            # checkpoint size resident in memory
    dense_bytes: float             # non-expert weights streamed once per step whatever the batch
    # MoE: a decode step reads only the experts its tokens route to; identical for every layer.
    num_experts: int = 0           # routed experts per layer (0 = dense model)
    experts_per_token: int = 0
    expert_bytes: float = 0.0      # bytes of one routed expert in one layer
    # Real routing is not uniform: tokens of one batch share experts more than independent draws would.
    # The experts a batch of n tokens touches per layer are modelled as E * (1 - (1 - k/E) ** n**x);
    # x = 1 is uniform routing, smaller x = more sharing (fitted for gpt-oss-120b).
    expert_routing_exponent: float = 1.0
    full_attn_layers: int | None = None    # layers keeping the whole context in KV (None = all)
    sliding_window: int = 0        # window of the other layers (0 = none)
    kv_bytes_per_elem: float = 2.0  # kv_cache_dtype "auto" (bf16); fp8 halves it
    kv_bytes_per_token_measured: float | None = None   # when only a published KV capacity is known
    # how close this model's kernels get to the hardware's fitted efficiencies (1 = like gpt-oss-120b,
    # the model the hardware constants were fitted on); scales GPU memory and compute time, not the link
    kernel_efficiency: float = 1.0
    max_context: int = 131072

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto") -> float:
        """KV bytes one token occupies across all full-attention layers (the ones that grow)."""
        if self.kv_bytes_per_token_measured:
            return self.kv_bytes_per_token_measured
        per_elem = self.kv_bytes_per_elem
        if kv_cache_dtype.startswith("fp8"):
            per_elem = 1.0
        layers = self.layers if self.full_attn_layers is None else self.full_attn_layers
        return layers * self.num_kv_heads * self.head_dim * 2 * per_elem

    def sliding_kv_bytes(self, kv_cache_dtype: str = "auto") -> float:
        """KV bytes one sequence holds in its sliding-window layers (bounded by the window)."""
        if not self.sliding_window or self.full_attn_layers is None:
            return 0.0
        per_elem = 1.0 if kv_cache_dtype.startswith("fp8") else self.kv_bytes_per_elem
        return ((self.layers - self.full_attn_layers) * self.num_kv_heads * self.head_dim * 2
                * per_elem * self.sliding_window)


# GB10 (DGX Spark): 128 GB LPDDR5X unified, 273 GB/s; NVML/cudaMemGetInfo report ~121.7 GiB total
# (gb10-facts.md). ConnectX-7 200 GbE between the two nodes = 25 GB/s per direction.
# The efficiency constants below are the output of benchmarks/fit_sim.py (docs/SIMULATION.md).
GB10 = HardwareProfile(
    name="NVIDIA GB10",
    memory_bytes=121.7 * GIB,
    mem_bw_bytes_s=273e9,
    mem_bw_efficiency=0.91,
    compute_flops_s=83.3e12,
    step_overhead_s=0.0,
    seq_overhead_s=0.0,
    link_bytes_s=25e9,
    allreduce_latency_s=78e-6,
    link_efficiency=0.405,
)


def _gpt_oss_120b() -> ModelProfile:
    # openai/gpt-oss-120b: 36 layers, hidden 2880, 64 query heads x 64, 8 KV heads x 64, 128 experts
    # (top-4) of 3 x 2880 x 2880 params each in MXFP4 (4.25 bits/param with block scales), attention and
    # embeddings in bf16, attention alternates full / 128-token sliding window.
    layers, hidden = 36, 2880
    expert_params = 3 * hidden * 2880
    mxfp4 = 4.25 / 8
    attn_params = layers * (hidden * 64 * 64 * 2 + hidden * 8 * 64 * 2)
    unembed_params = 201088 * hidden
    router_params = layers * hidden * 128
    dense_bytes = 2.0 * (attn_params + unembed_params + router_params)
    expert_bytes = expert_params * mxfp4
    weight_bytes = 128 * layers * expert_bytes + dense_bytes + 2.0 * unembed_params  # + embedding table
    return ModelProfile(
        name="gpt-oss-120b", total_params=116.8e9, active_params=5.13e9, layers=layers,
        hidden_size=hidden, num_kv_heads=8, head_dim=64, weight_bytes=weight_bytes,
        dense_bytes=dense_bytes, num_experts=128, experts_per_token=4, expert_bytes=expert_bytes,
        full_attn_layers=18, sliding_window=128, max_context=131072, expert_routing_exponent=0.623,
    )


def _llama_31_8b() -> ModelProfile:
    # meta-llama/Llama-3.1-8B-Instruct in bf16: 32 layers, hidden 4096, 8 KV heads x 128.
    params = 8.03e9
    return ModelProfile(
        name="llama-3.1-8b", total_params=params, active_params=params, layers=32, hidden_size=4096,
        num_kv_heads=8, head_dim=128, weight_bytes=2.0 * params, dense_bytes=2.0 * params,
        max_context=131072,
    )


def _deepseek_v4_flash() -> ModelProfile:
    # Published tuning log (deepseek-v4-flash-tuning.csv): 685B total / 37B active, TP=2 over two GB10s,
    # KV capacity 482k tokens at gpu_memory_utilization 0.70 and 865k at 0.78. Its architecture is not
    # public here, so KV and resident weights are *derived* from those two capacities on this GB10 profile
    # (121.7 GiB per node): 0.08 x 2 nodes of memory = 383k tokens -> 54.6 KB per token; then the 0.70
    # point leaves ~150 GB of resident weights (~1.75 bits/param). Layer and expert shape follow the
    # DeepSeek-V3 family (61 layers, hidden 7168, 256 routed experts top-8, first 3 layers dense).
    # Its published baseline ITL (182 ms a token, eager, max-num-seqs 1, TP=2) is ~7x what the gpt-oss-fitted
    # roofline gives; kernel_efficiency 0.105 is that one point (its tuned run: 63 ms with MTP + graphs).
    layers, hidden = 61, 7168
    weight_bytes = 150.2e9
    # ~16.5B of the 37B active are attention, shared experts, dense layers and embeddings (V3 shape)
    dense_bytes = 16.5e9 * weight_bytes / 685e9
    expert_bytes = (weight_bytes - dense_bytes) / (256 * (layers - 3))
    return ModelProfile(
        name="deepseek-v4-flash", total_params=685e9, active_params=37e9, layers=layers,
        hidden_size=hidden, num_kv_heads=1, head_dim=576, weight_bytes=weight_bytes,
        dense_bytes=dense_bytes, num_experts=256, experts_per_token=8, expert_bytes=expert_bytes,
        kv_bytes_per_token_measured=54.6e3, max_context=163840, kernel_efficiency=0.105,
    )


def _tiny() -> ModelProfile:
    # The test bed's tiny random Llama (a few MB): everything is overhead.
    params = 1.0e6
    return ModelProfile(
        name="tiny", total_params=params, active_params=params, layers=2, hidden_size=64,
        num_kv_heads=4, head_dim=16, weight_bytes=4.0 * params, dense_bytes=4.0 * params,
        max_context=2048,
    )


MODELS: dict[str, ModelProfile] = {
    m.name: m for m in (_gpt_oss_120b(), _llama_31_8b(), _deepseek_v4_flash(), _tiny())
}
