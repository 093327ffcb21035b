"""The serve command of a v2 recipe that has no `command:`, built from its `defaults` as sparkrun builds it.

vLLM: `vllm serve {model}` (`--revision` when the recipe pins one), then one flag per default that is a vLLM
option: the key with dashes (`max_model_len` → `--max-model-len {max_model_len}`), the parallel sizes spelled
vLLM's way, a true boolean as the bare flag, a false one as `--no-FLAG` where vLLM turns it on by itself (and
left out otherwise). The executor backend is the topology's business (launch/topologies.py), never written
here. A default that is no vLLM option is not passed, with a warning naming it. Other runtimes: None (the
plan refuses, naming the runtime, until its command is built by the runtime's own planner).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# vLLM's option names (its `vllm serve --help`), as recipe default keys; the parallel sizes are renamed.
RENAMED = {"tensor_parallel": "--tensor-parallel-size", "pipeline_parallel": "--pipeline-parallel-size",
           "data_parallel": "--data-parallel-size"}
VLLM_OPTIONS = frozenset({
    "port", "host", "gpu_memory_utilization", "max_model_len", "max_num_batched_tokens", "max_num_seqs",
    "served_model_name", "dtype", "quantization", "enforce_eager", "enable_prefix_caching", "trust_remote_code",
    "kv_cache_dtype", "otlp_traces_endpoint", "api_key", "attention_backend", "load_format", "reasoning_parser",
    "tool_call_parser", "chat_template", "speculative_config", "tokenizer", "tokenizer_mode", "mm_encoder_tp_mode",
    "block_size", "seed", "enable_auto_tool_choice", "enable_chunked_prefill", "async_scheduling",
    "generation_config", "hf_overrides", "compilation_config", "attention_config", "model_loader_extra_config",
    "default_chat_template_kwargs", "limit_mm_per_prompt", "mm_processor_cache_gb", "kv_cache_memory_bytes",
    "max_cudagraph_capture_size", "long_prefill_token_threshold", "mamba_cache_mode", "safetensors_load_strategy",
    "moe_backend", "enable_prompt_tokens_details", "enable_force_include_usage", "enable_request_id_headers",
    "enable_flashinfer_autotune", "disable_custom_all_reduce", "enable_expert_parallel", "swap_space",
    "cpu_offload_gb", "max_logprobs", "disable_log_stats", "enable_log_requests", "max_num_partial_prefills",
    "enable_sleep_mode", "kv_transfer_config", "gpu_memory_utilization_gb", "tool_parser_plugin", "chat_template_content_format",
    "distributed_executor_backend", *RENAMED})
BOOLEAN = frozenset({"enforce_eager", "enable_prefix_caching", "trust_remote_code", "enable_auto_tool_choice",
                     "enable_chunked_prefill", "async_scheduling", "enable_prompt_tokens_details",
                     "enable_force_include_usage", "enable_request_id_headers", "enable_flashinfer_autotune",
                     "disable_custom_all_reduce", "enable_expert_parallel", "disable_log_stats", "enable_log_requests",
                     "enable_sleep_mode"})
# On unless told otherwise: false must be said (--no-FLAG), or the server runs with it on.
NEGATABLE = frozenset({"enable_prefix_caching", "enable_chunked_prefill", "async_scheduling",
                       "enable_flashinfer_autotune"})
# Keys the plan itself uses (never flags): placeholder values of a recipe's own.
NOT_FLAGS = frozenset({"model", "model_revision", "resolved_model_path", "distributed_executor_backend"})


def vllm_command(defaults: Mapping[str, Any], model_revision: str | None) -> tuple[str, list[str]]:
    """(the command template, the defaults not passed)."""
    parts = ["vllm serve '{model}'"]
    if model_revision:
        parts.append("--revision '{model_revision}'")
    skipped: list[str] = []
    for key, value in defaults.items():
        if key in NOT_FLAGS:
            continue
        if key not in VLLM_OPTIONS:
            skipped.append(key)
            continue
        flag = RENAMED.get(key, "--" + key.replace("_", "-"))
        if key in BOOLEAN or isinstance(value, bool):
            if value is True or str(value).lower() == "true":
                parts.append(flag)
            elif key in NEGATABLE:
                parts.append("--no-" + flag[2:])
            continue
        # quoted as sparkrun's shell would take it: a JSON value, or a name with spaces, stays one argument
        parts.append(f"{flag} '{{{key}}}'")
    return " ".join(parts), skipped


def generated_command(runtime: str, defaults: Mapping[str, Any], model_revision: str | None) -> tuple[str, list[str]] | None:
    if runtime == "vllm":
        return vllm_command(defaults, model_revision)
    return None
