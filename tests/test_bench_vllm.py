"""The sweep against a real vLLM (CPU) server, beside llama-benchy 0.4.0 on the same server (the test bed)."""

from __future__ import annotations

import asyncio

import pytest

from sparkconsole.bench.results import ResultsStore
from sparkconsole.bench.sweep import SweepSpec, run_sweep

pytestmark = pytest.mark.slow

PP, TG, CONC, RUNS = 96, 64, (1, 2), 2


@pytest.mark.xfail(strict=False, reason=(
    "llama-benchy 0.4.0 timestamps network reads, not tokens (shared/reference/client-ceilings.md): on the tiny CPU "
    "model its TTFT read 5x ours at c1 in one run (181 ms vs 34.6 ms) — the issue's 5% agreement is not shown here"))
async def test_sweep_on_real_vllm_matches_llama_benchy(vllm_server, benchy, tmp_path):
    spec = SweepSpec(url=vllm_server.url, pp=(PP,), tg=(TG,), concurrency=CONC, runs=RUNS, latency_mode="none")
    with ResultsStore(tmp_path / "r.sqlite") as store:
        out = await run_sweep(spec, store)
        run = store.run(out.run_id)
        levels = store.levels(out.run_id)
        rows = store.requests(out.run_id)
    assert run.model == vllm_server.model.name and run.vllm_version and not run.simulated
    assert len(rows) == RUNS * sum(CONC) and all(r["ok"] for r in rows), [r["error"] for r in rows]
    # Exact lengths on a real server: the prompt fitted with vLLM's /tokenize (chat template included),
    # the answer held to tg by min_tokens + ignore_eos, both as vLLM's usage counts them.
    assert {r["prompt_tokens"] for r in rows} == {PP}
    assert {r["completion_tokens"] for r in rows} == {TG}
    assert all(lv.metrics["prompt_source"] == "tokenize" for lv in levels)

    theirs = await asyncio.to_thread(benchy.run, vllm_server.url, vllm_server.model, tmp_path, pp=(PP,), tg=(TG,),
                                     concurrency=CONC, runs=RUNS, extra=("--exact-tg",))
    by_c = {b["concurrency"]: b for b in theirs["benchmarks"]}
    compared = 0
    for lv in levels:
        b = by_c[lv.key.concurrency]
        ours_ttft, their_ttft = lv.mean("e2e_ttft"), b["e2e_ttft"]["mean"]
        # Same definitions, same server, minutes apart on a shared machine: same order of magnitude.
        assert 0.33 * their_ttft <= ours_ttft <= 3 * their_ttft, (lv.key, ours_ttft, their_ttft)
        # On a CPU-starved machine a whole answer can reach the client in one read: then neither tool has a
        # decode rate for that request. Compare where both have one; llama-benchy drops empty-content
        # (partial UTF-8) chunks, so its figure can only read lower.
        ours_decode = lv.mean("tg_req_throughput")
        their_decode = (b.get("tg_req_throughput") or {}).get("mean")
        if ours_decode and their_decode:
            assert 0.5 * their_decode <= ours_decode <= 3 * their_decode, (lv.key, ours_decode, their_decode)
            compared += 1
    assert compared, "no level where both tools measured a decode rate"
