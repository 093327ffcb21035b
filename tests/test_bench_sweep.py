"""Sweeps against real loopback servers, written to real SQLite files: exact prompts, failures, thermal notes,
simulated-clock scaling, and the topology matrix."""

from __future__ import annotations

import itertools
import json
import time

import httpx
import pytest

from sparkconsole.bench.matrix import StaticLauncher, run_matrix
from sparkconsole.bench.measure import run_sweep
from sparkconsole.bench.results import ResultsStore, ThermalNote
from sparkconsole.bench.sweep import SweepSpec
from sparkconsole.errors import UserError
from tests.test_bench_helpers import Behaviour, FakeVllm


@pytest.fixture
async def server():
    srv = await FakeVllm(Behaviour(token_delay=0.001)).start()
    yield srv
    await srv.stop()


def _spec(url: str, **kw) -> SweepSpec:
    base = dict(url=url, pp=(40,), tg=(8,), concurrency=(1, 3), runs=2, latency_mode="none")
    base.update(kw)
    return SweepSpec(**base)


@pytest.mark.parametrize("tokenize", [True, False])
async def test_sweep_records_levels_with_exact_prompts(tmp_path, tokenize):
    srv = await FakeVllm(Behaviour(token_delay=0.001, tokenize=tokenize)).start()
    seen = []
    try:
        with ResultsStore(tmp_path / "r.sqlite") as store:
            out = await run_sweep(_spec(srv.url, depth=(0, 20)), store, on_level=seen.append)
            levels = store.levels(out.run_id)
            rows = store.requests(out.run_id)
            run = store.run(out.run_id)
    finally:
        await srv.stop()
    assert [str(lv.key) for lv in seen] == ["pp40 tg8 c1", "pp40 tg8 c3", "pp40 tg8 d20 c1", "pp40 tg8 d20 c3"]
    assert [lv.key for lv in levels] == [lv.key for lv in seen]
    assert len(rows) == 2 * (2 * 1 + 2 * 3) and all(r["ok"] for r in rows)
    # The server counted exactly pp + depth prompt tokens for every measured request, template included.
    assert {(r["depth"], r["prompt_tokens"]) for r in rows} == {(0, 40), (20, 60)}
    assert all(r["completion_tokens"] == 8 for r in rows)
    assert all(0 <= r["itl_p50_ms"] <= r["itl_p99_ms"] <= r["itl_max_ms"] for r in rows)
    assert levels[1].metrics["prompt_source"] == ("tokenize" if tokenize else "usage")
    measured = [r for r in srv.requests if r.get("min_tokens") == 8]
    assert all(r["ignore_eos"] and r["stream_options"]["include_usage"] for r in measured)
    # Unique prompts: prefix caching cannot shorten prefill.
    users = [r["messages"][-1]["content"] for r in measured]
    assert len(set(users)) == len(users)
    assert run.model == "fake/model-1" and run.vllm_version == "0.32.0-fake" and run.endpoint == srv.url
    assert run.finished is not None and not run.simulated
    for lv in levels:
        assert lv.decode_tps and lv.decode_tps > 0 and lv.metrics["requests_ok"] == 2 * lv.key.concurrency
        assert lv.metrics["itl_ms"]["p50"] <= lv.metrics["itl_ms"]["p99"]


async def test_failed_requests_are_recorded_and_the_sweep_goes_on(tmp_path):
    srv = await FakeVllm(Behaviour(token_delay=0.001, fail_every=4)).start()
    try:
        with ResultsStore(tmp_path / "r.sqlite") as store:
            out = await run_sweep(_spec(srv.url, concurrency=(2, 4)), store)
            rows = store.requests(out.run_id)
            levels = store.levels(out.run_id)
    finally:
        await srv.stop()
    assert len(levels) == 2
    bad = [r for r in rows if not r["ok"]]
    assert bad and all(r["error"].startswith("HTTP 500") and r["status"] == 500 for r in bad)
    assert sum(lv.metrics["requests_failed"] for lv in levels) == len(bad)
    assert sum(lv.metrics["requests_ok"] for lv in levels) == len(rows) - len(bad)
    assert any("HTTP 500" in e for lv in levels for e in lv.metrics["errors"])


async def test_thermal_probe_annotates_each_level(server, tmp_path):
    temps = itertools.count(60)
    calls = []

    def probe():
        t = next(temps)
        calls.append(t)
        if t == 62:
            raise RuntimeError("node unreachable")      # a broken probe must not stop the sweep
        return ThermalNote(float(t), ("hw_slowdown",) if t == 61 else ())

    with ResultsStore(tmp_path / "r.sqlite") as store:
        out = await run_sweep(_spec(server.url), store, thermal_probe=probe, thermal_interval=0.05)
        levels = store.levels(out.run_id)
    first, second = levels
    assert first.thermal.max_temp_c is not None and second.thermal.max_temp_c > first.thermal.max_temp_c
    assert "hw_slowdown" in first.thermal.throttle_reasons
    assert second.thermal.max_temp_c == max(c for c in calls if c != 62)


async def test_simulated_clock_scales_intervals(tmp_path):
    figures = {}
    for speed in (None, 10.0):
        srv = await FakeVllm(Behaviour(token_delay=0.01, sim_speed=speed)).start()
        try:
            with ResultsStore(tmp_path / f"r{speed}.sqlite") as store:
                out = await run_sweep(_spec(srv.url, concurrency=(1,), tg=(12,), runs=1, warmup=False), store)
                figures[speed] = (store.levels(out.run_id)[0].mean("tg_req_throughput"), store.run(out.run_id))
        finally:
            await srv.stop()
    (real, real_run), (sim, sim_run) = figures[None], figures[10.0]
    assert sim_run.simulated and sim_run.speed == 10.0 and not real_run.simulated
    # The server sleeps 10 ms per token, so no client can read faster than ~100 tok/s; at ten times real time
    # each interval counts ten times as long, so the simulated figure cannot pass ~10 tok/s (unscaled it would
    # read ~90). Load only slows both; the real run still has to beat 15 tok/s (66 ms a token).
    assert 0 < sim <= 15 < real


class RecordingLauncher:
    """A matrix Launcher over FakeVllm servers that records each call; the topology "broken" fails to launch."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []
        self.running: list[FakeVllm] = []
        self.kept: list[FakeVllm] = []

    async def launch(self, recipe, topology):
        self.events.append(("launch", topology))
        if topology == "broken":
            raise UserError("node spark2 unreachable", fix="check the link")
        self.running.append(await FakeVllm(Behaviour(token_delay=0.001)).start())
        return self.running[-1].url

    async def stop(self):
        self.events.append(("stop",))
        while self.running:
            await self.running.pop().stop()

    def release(self):
        self.events.append(("release",))
        self.kept, self.running = self.kept + self.running, []


async def test_matrix_launches_sweeps_and_stops_each_topology(tmp_path):
    launcher = RecordingLauncher()
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: tiny\n")
    template = _spec("http://unset.invalid", concurrency=(1, 2), runs=1)
    with ResultsStore(tmp_path / "m.sqlite") as store:
        out = await run_matrix(str(recipe), ["solo", "broken", "cluster-tp2"], launcher, template, store)
        runs = store.runs()
        again = await run_matrix(str(recipe), ["solo", "broken", "cluster-tp2"], launcher, template, store,
                                 resume=True)
    events = launcher.events
    assert out.measured == ["solo", "cluster-tp2"] and list(out.failed) == ["broken"]
    assert "spark2 unreachable" in out.failed["broken"]
    assert events[:6] == [("launch", "solo"), ("stop",), ("launch", "broken"), ("stop",),
                          ("launch", "cluster-tp2"), ("stop",)]
    assert [(r.label, r.topology) for r in runs] == [("solo", "solo"), ("cluster-tp2", "cluster-tp2")]
    assert all(r.recipe_hash and len(r.recipe_hash) == 16 for r in runs)
    # Resumed: the finished topologies are not launched again, the failed one is retried.
    assert again.skipped == ["solo", "cluster-tp2"] and events[6:] == [("launch", "broken"), ("stop",)]


async def test_matrix_keep_last_leaves_the_last_measured_topology_serving(tmp_path):
    """The last topology, once measured, is released instead of stopped and still answers; one that failed is
    stopped as any other."""
    launcher = RecordingLauncher()
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: tiny\n")
    template = _spec("http://unset.invalid", concurrency=(1,), runs=1)
    try:
        with ResultsStore(tmp_path / "m.sqlite") as store:
            kept = await run_matrix(str(recipe), ["solo", "2x-solo"], launcher, template, store, keep_last=True)
            failed_last = await run_matrix(str(recipe), ["solo", "broken"], launcher, template, store,
                                           keep_last=True)
        events = launcher.events
        assert events[:4] == [("launch", "solo"), ("stop",), ("launch", "2x-solo"), ("release",)]
        assert kept.kept == ("2x-solo", launcher.kept[0].url) and kept.measured == ["solo", "2x-solo"]
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(kept.kept[1] + "/v1/models")).status_code == 200
        assert events[4:] == [("launch", "solo"), ("stop",), ("launch", "broken"), ("stop",)]
        assert failed_last.kept is None and list(failed_last.failed) == ["broken"]
    finally:
        for srv in launcher.kept:
            await srv.stop()


async def test_static_launcher_names_the_missing_topology():
    with pytest.raises(UserError, match="no endpoint given for topology 'disagg'"):
        await StaticLauncher({"solo": "http://x"}).launch("r", "disagg")


def test_spec_rejects_bad_values_with_one_line_errors():
    with pytest.raises(UserError, match="--concurrency"):
        SweepSpec(url="http://x", concurrency=(0,))
    with pytest.raises(UserError, match="--url"):
        SweepSpec(url="localhost:8000")
    with pytest.raises(UserError, match="latency"):
        SweepSpec(url="http://x", latency_mode="ping")
    for pace in (-0.5, float("nan"), float("inf")):
        with pytest.raises(UserError, match="--pace"):
            SweepSpec(url="http://x", pace=pace)


async def test_a_paced_sweep_starts_its_batches_apart_and_its_eta_counts_the_pace(server, tmp_path):
    """`--pace`: a steady load beside other work. Five batches (warm-up and four runs) of a fast server, paced
    0.3 s, take at least four paces; every ETA counts at least a pace for each batch left; the figures stand."""
    progress = []
    t0 = time.perf_counter()
    with ResultsStore(tmp_path / "r.sqlite") as store:
        out = await run_sweep(_spec(server.url, concurrency=(2,), runs=4, pace=0.3), store,
                              on_progress=progress.append)
        rows = store.requests(out.run_id)
    assert time.perf_counter() - t0 >= 4 * 0.3
    timed = [p for p in progress if p.eta_s is not None]
    assert [p.run_index for p in timed] == [1, 2, 3, 4]
    assert all(p.eta_s >= 0.3 * (p.runs - p.run_index + 1) for p in timed), [p.eta_s for p in timed]
    assert len(rows) == 8 and all(r["ok"] for r in rows)
    assert out.levels[0].decode_tps and out.levels[0].metrics["requests_ok"] == 8


@pytest.mark.parametrize("pp, depth", [(16, 0), (37, 0), (512, 0), (100, 64), (2048, 300)])
async def test_prompt_fit_is_exact_when_words_cost_several_tokens(pp, depth):
    """A server whose tokenizer splits words into 1–4 pieces (as the test bed's 1,536-token vocabulary does)."""
    import random

    from sparkconsole.bench.prompts import fit_shape, messages

    def cost(word: str) -> int:
        return 1 if word in ("the", "a", "of", "Text:") else 1 + len(word) // 3

    calls = []

    async def count(msgs):
        calls.append(1)
        return 7 + sum(4 + sum(cost(w) for w in m["content"].split()) for m in msgs)

    shape = await fit_shape(count, pp, depth, source="test")
    assert shape.measured == shape.target == pp + depth
    assert len(calls) <= 30
    rng = random.Random(1)
    variants = [messages(shape, rng) for _ in range(20)]
    assert {await count(v) for v in variants} == {pp + depth}           # every order has the same length
    if len(shape.prompt_words) >= 10:
        assert len({json.dumps(v) for v in variants}) == 20             # and no two requests share it
    assert (shape.context_words is not None) == bool(depth)


@pytest.mark.parametrize("refused, want_ids, want_exact", [
    (("return_token_ids",), False, True),
    (("return_token_ids", "min_tokens"), False, False),
])
async def test_fields_a_strict_proxy_refuses_are_dropped(tmp_path, refused, want_ids, want_exact):
    srv = await FakeVllm(Behaviour(token_delay=0.001, refuse_fields=refused)).start()
    try:
        with ResultsStore(tmp_path / "r.sqlite") as store:
            out = await run_sweep(_spec(srv.url, concurrency=(2,), runs=1), store)
            rows = store.requests(out.run_id)
            level = store.levels(out.run_id)[0]
    finally:
        await srv.stop()
    assert rows and all(r["ok"] for r in rows)
    assert level.metrics["request_options"] == {"return_token_ids": want_ids, "exact_tg": want_exact}
    # Without min_tokens/ignore_eos the fake server stops early (its "EOS"); usage still counts exactly.
    assert {r["completion_tokens"] for r in rows} == {8}


@pytest.mark.parametrize("on_failure", ["continue", "pause"])
async def test_a_failed_level_is_marked_and_the_sweep_continues_or_pauses(tmp_path, on_failure):
    srv = await FakeVllm(Behaviour(token_delay=0.001)).start()

    def break_after_first(level) -> None:       # the server dies for good once the first level is stored
        srv.behaviour.http_status = 500

    spec = _spec(srv.url, concurrency=(1, 2, 3), on_failure=on_failure)
    try:
        with ResultsStore(tmp_path / "r.sqlite") as store:
            out = await run_sweep(spec, store, on_level=break_after_first)
            levels = store.levels(out.run_id)
            finished = store.run(out.run_id).finished
            if on_failure == "pause":
                srv.behaviour.http_status = 200           # the operator fixes the endpoint and resumes
                again = await run_sweep(spec, store, resume=True)
                resumed_levels = store.levels(out.run_id)
                resumed_finished = store.run(out.run_id).finished
    finally:
        await srv.stop()
    first, second = levels[0], levels[1]
    assert first.failure is None and first.metrics["requests_ok"] == 2
    assert second.failure.startswith("4 of 4 requests failed: HTTP 500")
    if on_failure == "continue":
        assert [lv.key.concurrency for lv in levels] == [1, 2, 3] and levels[2].failure
        assert out.paused_after is None and finished is not None
    else:
        # Stopped right after recording the failed level; the run stays open and --resume goes on from there.
        assert [lv.key.concurrency for lv in levels] == [1, 2] and out.paused_after == second.key
        assert finished is None
        assert again.resumed and again.run_id == out.run_id and [k.concurrency for k in again.skipped] == [1, 2]
        assert [lv.key.concurrency for lv in again.levels] == [3] and again.levels[0].failure is None
        assert [lv.key.concurrency for lv in resumed_levels] == [1, 2, 3] and resumed_finished is not None


def test_on_failure_choice_is_checked():
    with pytest.raises(UserError, match="--on-failure"):
        _spec("http://127.0.0.1:9", on_failure="retry")


async def test_matrix_pauses_at_a_failed_level_and_resume_goes_on_from_there(tmp_path):
    """`--on-failure pause` in a matrix: the topology whose level failed is stopped, the next ones are not
    launched, and --resume relaunches it, continues its open run from the next level, then does the rest."""
    events = []
    servers: dict[str, FakeVllm] = {}

    class Launcher:
        async def launch(self, recipe, topology):
            events.append(("launch", topology))
            srv = await FakeVllm(Behaviour(token_delay=0.001)).start()
            servers[topology] = srv
            return srv.url

        async def stop(self):
            events.append(("stop",))
            for srv in servers.values():
                await srv.stop()

    broken = {"solo": True}

    def break_solo_after_first(level) -> None:       # solo's server fails every request after its first level
        if broken["solo"] and "solo" in servers:
            servers["solo"].behaviour.http_status = 500

    template = _spec("http://unset.invalid", concurrency=(1, 2, 3), runs=1, on_failure="pause")
    with ResultsStore(tmp_path / "m.sqlite") as store:
        out = await run_matrix("tiny", ["solo", "cluster-tp2"], Launcher(), template, store,
                               on_level=break_solo_after_first)
        first_runs = store.runs()
        solo_levels = store.levels(first_runs[0].run_id)
        broken["solo"] = False                         # the operator fixes it, then resumes
        again = await run_matrix("tiny", ["solo", "cluster-tp2"], Launcher(), template, store, resume=True)
        runs = {r.topology: r for r in store.runs()}
        resumed_solo = store.levels(runs["solo"].run_id)
    assert out.measured == [] and not out.failed
    assert out.paused.startswith("solo after pp40 tg8 c2: 2 of 2 requests failed: HTTP 500"), out.paused
    assert events[:2] == [("launch", "solo"), ("stop",)]                     # cluster-tp2 never launched
    assert [r.topology for r in first_runs] == ["solo"] and first_runs[0].finished is None
    assert [lv.key.concurrency for lv in solo_levels] == [1, 2] and solo_levels[1].failure
    assert again.paused is None and again.measured == ["solo", "cluster-tp2"]
    assert events[2:] == [("launch", "solo"), ("stop",), ("launch", "cluster-tp2"), ("stop",)]
    assert runs["solo"].run_id == first_runs[0].run_id and runs["solo"].finished   # the same run, finished
    assert [lv.key.concurrency for lv in resumed_solo] == [1, 2, 3] and resumed_solo[2].failure is None
