"""The sweep against a real vLLM (CPU) server, beside llama-benchy 0.4.0 on the same server (the test bed).

Like with like (docs/BENCHMARKS.md, "Cross-check with llama-benchy"):
- the same definitions: ours follow llama-benchy 0.4.0's, and the tiny model's vocabulary is ASCII-only, so no
  stream chunk carries empty content (llama-benchy leaves those tokens out of its count; ours counts them);
- the server on its own CPU and both clients on another: on 2 cores a client's own work otherwise slows the
  server it measures (vLLM's OpenMP threads wait for a preempted peer);
- pp 128: llama-benchy then takes the server's prompt count (at pp 96 its 20% rule rejected it);
- the figures are compared in lockstep (tests/testbed/lockstep.py): the same prompts (ours: the same words in
  each request's own order), each tool's own client and per-request figures, batch by batch in rounds of ours,
  theirs, theirs, ours. This VM's speed wanders by ±10-15 % over tens of seconds and once dropped by a third for half a minute; two CLIs run one after the other
  meet different stretches of it, two batches a second apart meet the same one. Each batch waits the same
  10 ms of quiet, and llama-benchy's session skips its per-request environment lookups (TOLERANCE says why).
  The interquartile mean over rounds of ours/theirs is compared; a set that disagrees is measured again, up
  to twice, and all rounds decide.
- The two CLIs, each run once, are compared too, loosely: the same units and definitions end to end.
The module is `alone`: no other test shares the machine while it measures (scripts/test runs it last).
"""

from __future__ import annotations

import asyncio
import os

import pytest

from sparkconsole.bench.measure import run_sweep
from sparkconsole.bench.results import ResultsStore
from sparkconsole.bench.sweep import SweepSpec
from tests.testbed.timing import compare_rounds, interquartile_mean, merge_rounds, split_cpus
from tests.testbed.vllm import start_vllm_server

pytestmark = [pytest.mark.slow, pytest.mark.alone]

PP, TG, CONC = 128, 64, (1, 2)
CLI_RUNS = 6          # batches per level in each CLI's sweep
ROUNDS = 24           # lockstep rounds per concurrency (each: two batches per tool)
# llama-benchy's per-request keys, which our levels carry in its schema too
KEYS = {"e2e_ttft": "TTFT ms", "pp_req_throughput": "prefill t/s", "tg_req_throughput": "decode t/s"}


@pytest.fixture(scope="module")
def pinned_server(vllm_env, tiny_model, tmp_path_factory):
    server_cpus, _ = split_cpus()
    server = start_vllm_server(vllm_env, tiny_model, tmp_path_factory.mktemp("xcheck-server"), cpus=server_cpus)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client_cpus():
    """This process (our sweep) and its children (llama-benchy) on the CPU the server does not use."""
    _, cpus = split_cpus()
    before = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    yield cpus
    os.sched_setaffinity(0, before)


@pytest.fixture(scope="module")
def clis(pinned_server, benchy, client_cpus, tmp_path_factory):
    """`sparkconsole`'s sweep, then llama-benchy's CLI, on the same server: (our run, levels, rows), theirs."""
    tmp = tmp_path_factory.mktemp("xcheck-cli")
    spec = SweepSpec(url=pinned_server.url, pp=(PP,), tg=(TG,), concurrency=CONC, runs=CLI_RUNS, latency_mode="none")
    with ResultsStore(tmp / "ours.sqlite") as store:
        out = asyncio.run(run_sweep(spec, store))
        ours = (store.run(out.run_id), store.levels(out.run_id), store.requests(out.run_id))
    theirs = benchy.run(pinned_server.url, pinned_server.model, tmp, pp=(PP,), tg=(TG,), concurrency=CONC,
                        runs=CLI_RUNS, extra=("--exact-tg",))
    return ours, theirs


@pytest.fixture(scope="module")
def cross_check(pinned_server, benchy, client_cpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("xcheck-lockstep")

    def lockstep(name: str) -> dict:
        return benchy.lockstep(pinned_server.url, pinned_server.model, tmp / name, pp=PP, tg=TG,
                               concurrency=CONC, rounds=ROUNDS, cpus=client_cpus, same_prompts=True)

    data = lockstep("set1.json")
    compared = compare_rounds(data)
    for again in (2, 3):
        if not disagreements(compared):
            break
        # Measured again before it counts, and all sets decide together: a real difference stays out, a chance
        # one (a figure's spread between sets is ~2.5 % here, so one in twenty lands past 5 %) must come back.
        print(f"\nset {again - 1} of rounds: " + "; ".join(disagreements(compared)))
        data = merge_rounds(data, lockstep(f"set{again}.json"))
        compared = compare_rounds(data)
    print("\n" + "\n".join(f"c{c} {KEYS[k]}: ours {a:.1f} llama-benchy {b:.1f} (round ratio {100 * (r - 1):+.1f}%)"
                           for (c, k), (a, b, r) in compared.items()))
    return compared, data


@pytest.mark.timeout(900)
def test_sweep_on_real_vllm_exact_lengths(clis, pinned_server):
    (run, levels, rows), _ = clis
    assert run.model == pinned_server.model.name and run.vllm_version and not run.simulated
    assert len(rows) == CLI_RUNS * sum(CONC) and all(r["ok"] for r in rows), [r["error"] for r in rows]
    # Exact lengths on a real server: the prompt fitted with vLLM's /tokenize (chat template included),
    # the answer held to tg by min_tokens + ignore_eos, both as vLLM's usage counts them.
    assert {r["prompt_tokens"] for r in rows} == {PP}
    assert {r["completion_tokens"] for r in rows} == {TG}
    assert all(lv.metrics["prompt_source"] == "tokenize" for lv in levels)


# One sweep of each CLI, one after the other: the VM's wander is in the gap. Two clean-clone CI runs put them
# 29 % apart (c1 TTFT 49.4 vs 38.3 ms; nothing else running) and 39 % (c1 decode, a vLLM of another test beside
# it), and a third 61 % (c2 TTFT 28.1 vs 45.2 ms: a 30-ms figure, each tool with its own prompts), where the
# lockstep, a second apart, read within 5 %. So this checks units and aggregation end to end (a wrong unit or a c2
# sum for a per-request figure is a factor of 2 or more), not closeness: that is the lockstep's.
CLI_FACTOR = 1.8          # ours/theirs or theirs/ours at most this


@pytest.mark.timeout(900)
def test_both_clis_report_the_same_quantities(clis):
    (_, levels, _), theirs = clis
    ours = {lv.key.concurrency: lv.metrics for lv in levels}
    theirs = {b["concurrency"]: b for b in theirs["benchmarks"]}
    assert set(ours) == set(theirs) == set(CONC)
    bad = []
    for c in CONC:
        for key, label in KEYS.items():
            a, b = (interquartile_mean(m[key]["values"]) for m in (ours[c], theirs[c]))
            if max(a / b, b / a) > CLI_FACTOR:
                bad.append(f"c{c} {label}: ours {a:.1f} vs llama-benchy {b:.1f}")
    assert not bad, bad


# The 5 % for every figure. Two things in how the tools pace and send requests, not in how they time
# them, had put c1 TTFT ~3 % apart (docs/BENCHMARKS.md, "Cross-check with llama-benchy"): the time each takes to
# prepare a batch (hence the same 10 ms of quiet before each), and llama-benchy's session looking up ~/.netrc and
# the proxy variables in a thread for every request after its clock starts (1.1-1.5 ms; the lockstep opens its
# session without trust_env). The same lookups sent its c2 pair further apart. And the prompts: with each tool's
# own, ours read 5-9 % below llama-benchy's TTFT in clean-clone runs, a gap that grew with the prompt (0.9 ms at
# pp 128, 2.5 ms at pp 1024) - the server's own work on llama-benchy's book text against our short common words,
# not the clocks. With the same prompts both tools agree within 1.2 % on every figure.
TOLERANCE = {(c, k): 0.05 for c in CONC for k in KEYS}


@pytest.mark.timeout(900)
def test_sweep_on_real_vllm_agrees_with_llama_benchy(cross_check):
    """The issue's check, batch by batch on the same server: TTFT, prefill t/s and decode t/s within 5 % of
    llama-benchy's, and the same prompts as the server counts them."""
    compared, data = cross_check
    assert set(compared) == set(TOLERANCE)
    bad = disagreements(compared)
    assert not bad, bad
    # The same pp, as the server counted it, for both (the two CLIs above each send their own prompts).
    for c, per in data.items():
        for who in ("ours", "benchy"):
            assert {n for r in per[who]["prompt_tokens"] for n in r} == {PP}, (c, who)


def disagreements(compared: dict[tuple[int, str], tuple[float, float, float]]) -> list[str]:
    return [f"c{c} {KEYS[k]}: ours {a:.1f} vs {b:.1f} ({100 * (r - 1):+.1f}%, allowed {TOLERANCE[c, k]:.1%})"
            for (c, k), (a, b, r) in compared.items() if abs(r - 1) > TOLERANCE[c, k]]
