"""llama-benchy runs offline against the test bed's vLLM and reports throughput the server agrees with."""

from __future__ import annotations

import pytest

from tests.testbed.benchy import Benchy
from tests.testbed.vllm import VllmServer, metric_samples

pytestmark = pytest.mark.slow
TG = 48


def generation_tokens(url: str) -> float:
    return sum(s.value for s in metric_samples(url) if s.name == "vllm:generation_tokens_total")


def test_benchy_measures_the_real_server(benchy: Benchy, vllm_server: VllmServer, tmp_path) -> None:
    before = generation_tokens(vllm_server.url)
    # tg 48, not 8: llama-benchy 0.4.0 timestamps network reads, not tokens, so its decode time is zero, and
    # tg_throughput null, when a reply arrives in one read (seen with tg=8 on the tiny model: 8 tokens take ~40 ms;
    # 48 take a quarter second or more, over many reads).
    result = benchy.run(vllm_server.url, vllm_server.model, tmp_path, pp=(64,), tg=(TG,), runs=1,
                        extra=["--exact-tg", "--no-warmup"])
    assert result["version"] == "0.4.0" and result["model"] == vllm_server.model.name
    runs = result["benchmarks"]
    assert [(r["concurrency"], r["prompt_size"], r["response_size"]) for r in runs] == [(1, 64, TG)]
    assert runs[0]["tg_throughput"]["mean"] > 0 and runs[0]["pp_throughput"]["mean"] > 0
    # --exact-tg: the server generated at least the tokens benchy asked for
    assert generation_tokens(vllm_server.url) - before >= TG
