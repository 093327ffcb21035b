"""llama-benchy runs offline against the test bed's vLLM and reports throughput the server agrees with."""

from __future__ import annotations

import pytest

from tests.testbed.benchy import Benchy
from tests.testbed.vllm import VllmServer, metric_samples

pytestmark = pytest.mark.slow


def generation_tokens(url: str) -> float:
    return sum(s.value for s in metric_samples(url) if s.name == "vllm:generation_tokens_total")


@pytest.mark.xfail(strict=False, reason=(
    "llama-benchy 0.4.0 leaves tg_throughput null when a short reply arrives in one network read (it timestamps "
    "reads, not tokens); seen once under load with tg=8 on the tiny CPU model"))
def test_benchy_measures_the_real_server(benchy: Benchy, vllm_server: VllmServer, tmp_path) -> None:
    before = generation_tokens(vllm_server.url)
    result = benchy.run(vllm_server.url, vllm_server.model, tmp_path, pp=(64,), tg=(8,), runs=1,
                        extra=["--exact-tg", "--no-warmup"])
    assert result["version"] == "0.4.0" and result["model"] == vllm_server.model.name
    runs = result["benchmarks"]
    assert [(r["concurrency"], r["prompt_size"], r["response_size"]) for r in runs] == [(1, 64, 8)]
    assert runs[0]["tg_throughput"]["mean"] > 0 and runs[0]["pp_throughput"]["mean"] > 0
    # --exact-tg: the server generated at least the 8 tokens benchy asked for
    assert generation_tokens(vllm_server.url) - before >= 8
