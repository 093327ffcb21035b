"""The test bed's vLLM is real: health, models, streamed tokens with usage, Prometheus metrics (its container:
tests/faults/test_container_killed.py)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.testbed.vllm import VllmServer, chat, metric_samples, request_success_total

pytestmark = pytest.mark.slow


def stream_chat(url: str, model: str, max_tokens: int) -> tuple[list[dict], dict | None]:
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me about the cluster."}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks, usage = [], None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            chunks.append(chunk)
            usage = chunk.get("usage") or usage
    return chunks, usage


def test_health_and_models(vllm_server: VllmServer) -> None:
    assert httpx.get(f"{vllm_server.url}/health", timeout=10).status_code == 200
    models = httpx.get(f"{vllm_server.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [vllm_server.model.name]
    assert models["data"][0]["max_model_len"] == 2048


def test_streaming_chat_reports_usage(vllm_server: VllmServer) -> None:
    chunks, usage = stream_chat(vllm_server.url, vllm_server.model.name, max_tokens=12)
    assert usage is not None and usage["completion_tokens"] == 12
    assert usage["prompt_tokens"] > 5  # chat template + message, tokenized by the trained tokenizer
    # chunks may carry empty content (partial bytes): count tokens from usage, not chunks
    assert any(c["choices"] and c["choices"][0].get("finish_reason") == "length" for c in chunks)


def test_metrics_have_vllm_names_and_count_requests(vllm_server: VllmServer) -> None:
    before = request_success_total(vllm_server.url)
    chat(vllm_server.url, vllm_server.model.name, "count me", max_tokens=3)
    names = {s.name for s in metric_samples(vllm_server.url)}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:generation_tokens_total"):
        assert name in names
    assert request_success_total(vllm_server.url) == before + 1
