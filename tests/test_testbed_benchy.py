"""llama-benchy runs offline against the test bed's vLLM and reports throughput the server agrees with."""

from __future__ import annotations

import pytest

from tests.testbed.benchy import Benchy
from tests.testbed.vllm import VllmServer, metric_samples

pytestmark = pytest.mark.slow
TG = 128
RUNS = 3


def generation_tokens(url: str) -> float:
    return sum(s.value for s in metric_samples(url) if s.name == "vllm:generation_tokens_total")


def test_benchy_measures_the_real_server(benchy: Benchy, vllm_server: VllmServer, tmp_path) -> None:
    before = generation_tokens(vllm_server.url)
    # llama-benchy 0.4.0 timestamps network reads, not tokens: when a whole reply lands in one read its decode time
    # is zero and that run has no tg speed (seen with tg=8 on the tiny model, and once with tg=48 on a loaded 2-core
    # CI machine whose client was not scheduled while the tokens streamed). A longer reply and three runs make it
    # take every run landing in one read to leave tg_throughput empty.
    result = benchy.run(vllm_server.url, vllm_server.model, tmp_path, pp=(64,), tg=(TG,), runs=RUNS,
                        extra=["--exact-tg", "--no-warmup"])
    assert result["version"] == "0.4.0" and result["model"] == vllm_server.model.name
    runs = result["benchmarks"]
    assert [(r["concurrency"], r["prompt_size"], r["response_size"]) for r in runs] == [(1, 64, TG)]
    assert runs[0]["tg_throughput"]["mean"] > 0 and runs[0]["pp_throughput"]["mean"] > 0
    # --exact-tg: the server generated at least the tokens benchy asked for
    assert generation_tokens(vllm_server.url) - before >= TG * RUNS
