"""Measuring a sweep (bench/sweep.py's SweepSpec): each level's batches sent, timed and stored as they land.

`run_sweep` learns the endpoint (sweep.py's discover, accepted_options, probe_latency), opens or resumes the run in
the results store, then measures level by level: a warm-up batch unless `warmup=False`, `runs` recorded batches,
the level's figures (bench/metrics.py) with the hottest thermal reading while it ran, and, for a disaggregated
launch, what crossed the KV connector. A level with a failed request is marked failed with the commonest reason;
`on_failure="pause"` stops right after it, the run left open for `--resume`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp

from .. import __version__
from .client import RequestResult, StallWatch, api_base, chat_payload, open_session, stream_chat
from .metrics import level_metrics, percentiles, request_figures
from .prompts import PromptShape, calibrate, messages
from .results import LevelKey, LevelResult, ResultsStore, ThermalNote
from .sweep import (
    BatchClock,
    EndpointFacts,
    Progress,
    SweepOutcome,
    SweepSpec,
    accepted_options,
    api_headers,
    discover,
    kv_level,
    kv_scrapes,
    probe_latency,
)


def request_row(r: RequestResult, *, expected_prompt: int, latency_s: float, scale: float) -> dict[str, Any]:
    f = request_figures(r, expected_prompt=expected_prompt, latency_s=latency_s, scale=scale)

    def ms(v: float | None) -> float | None:
        return None if v is None else v * 1000
    tt = r.token_times
    itl = [(tt[i] - tt[i - 1]) * scale * 1000 for i in range(1, len(tt))]
    gaps = percentiles(itl) or {}
    return {"ok": r.ok, "error": r.error, "status": r.status, "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens if r.ok else None, "tokens_estimated": r.tokens_estimated,
            "ttfr_ms": ms(f.ttfr_s), "ttft_ms": ms(f.ttft_s), "est_ppt_ms": ms(f.est_ppt_s),
            "prefill_tps": f.prefill_tps, "decode_tps": f.decode_tps, "tpot_ms": ms(f.tpot_s),
            "itl_p50_ms": gaps.get("p50"), "itl_p99_ms": gaps.get("p99"),
            "itl_max_ms": max(itl, default=None)}


class _ThermalWatch:
    """Polls the injected probe while a level runs, keeping the hottest reading and every throttle reason."""

    def __init__(self, probe: Callable[[], ThermalNote | None] | None, interval: float) -> None:
        self.probe, self.interval = probe, interval
        self.note: ThermalNote | None = None
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        if self.probe is None:
            return
        try:
            got = self.probe()
        except Exception:   # a broken probe must not stop a measurement; the level just lacks the note
            return
        if got is not None:
            self.note = got if self.note is None else self.note.merge(got)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sample()

    def __enter__(self) -> _ThermalWatch:
        self.sample()
        if self.probe is not None:
            self._task = asyncio.ensure_future(self._loop())
        return self

    def __exit__(self, *_: object) -> None:
        if self._task:
            self._task.cancel()
        self.sample()


def _failure(metrics: dict[str, Any]) -> str | None:
    """'N of M requests failed: <the commonest reason>', or None when none failed."""
    if not metrics["requests_failed"]:
        return None
    errors = metrics["errors"] or {"unknown error": metrics["requests_failed"]}
    reason = max(errors.items(), key=lambda kv: kv[1])[0]
    total = metrics["requests_failed"] + metrics["requests_ok"]
    return f"{metrics['requests_failed']} of {total} requests failed: {reason}"


class _Levels:
    """One sweep's measuring, level by level, in an open session against a discovered endpoint."""

    def __init__(self, spec: SweepSpec, session: aiohttp.ClientSession, headers: dict[str, str],
                 facts: EndpointFacts, options: tuple[bool, bool], latency: float, store: ResultsStore | None,
                 run_id: str, todo: list[LevelKey], on_progress: Callable[[Progress], None] | None) -> None:
        self.spec, self.session, self.headers, self.facts, self.store, self.run_id = \
            spec, session, headers, facts, store, run_id
        self.token_ids, self.exact_tg = options
        self.latency = latency
        self.levels = spec.levels()
        self.on_progress = on_progress
        self.shapes: dict[tuple[int, int], PromptShape] = {}
        # Fresh orders every time, also when a level is measured again after an interruption: a repeated
        # prompt would find its prefix in the server's cache.
        self.rng = random.Random()
        self.chat_url = api_base(spec.url) + "/chat/completions"
        per_level = spec.runs + (1 if spec.warmup else 0)
        self.remaining = [k.concurrency for k in todo for _ in range(per_level)]     # batches left, for the ETA
        self.clock = BatchClock(spec.pace)
        self.failed = 0
        self.last_start: float | None = None
        self.watch = StallWatch(spec.stall_timeout, spec.first_timeout)    # one timer task for every stream

    def progress(self, idx: int, key: LevelKey, run_index: int) -> None:
        if self.on_progress:
            self.on_progress(Progress(key, idx, len(self.levels), run_index, self.spec.runs,
                                      self.clock.left(self.remaining), self.failed))

    async def shape(self, key: LevelKey) -> PromptShape:
        if (key.pp, key.depth) not in self.shapes:
            self.shapes[(key.pp, key.depth)] = await calibrate(self.session, self.spec.url, self.facts.model, key.pp,
                                                               key.depth, self.headers, token_ids=self.token_ids)
        return self.shapes[(key.pp, key.depth)]

    async def batch(self, key: LevelKey, shape: PromptShape) -> list[RequestResult]:
        spec = self.spec
        bodies = [json.dumps(chat_payload(self.facts.model, messages(shape, self.rng), key.tg, exact_tg=self.exact_tg,
                                          token_ids=self.token_ids)).encode() for _ in range(key.concurrency)]
        if spec.pace and self.last_start is not None:
            await asyncio.sleep(self.last_start + spec.pace - time.perf_counter())
        t0 = self.last_start = time.perf_counter()
        results = list(await asyncio.gather(*(stream_chat(self.session, self.chat_url, b, headers=self.headers,
                                                          timeout=spec.request_timeout, watch=self.watch)
                                              for b in bodies)))
        self.clock.add(key.concurrency, time.perf_counter() - t0)
        if key.concurrency in self.remaining:
            self.remaining.remove(key.concurrency)
        return results

    async def measure(self, key: LevelKey, thermal: _ThermalWatch) -> LevelResult:
        """One level: its warm-up, its recorded batches (each stored as it lands), then its figures."""
        spec, store, facts = self.spec, self.store, self.facts
        idx = self.levels.index(key) + 1
        shape = await self.shape(key)
        if store is not None:
            store.clear_level(self.run_id, key)
        started = time.time()
        batches: list[list[RequestResult]] = []
        expected, latency_s, scale = shape.target, self.latency * facts.speed, facts.speed
        with thermal:
            if spec.warmup:
                self.progress(idx, key, 0)
                await self.batch(key, shape)
            kv_before = await kv_scrapes(self.session, spec.kv_metrics)
            for run_index in range(1, spec.runs + 1):
                self.progress(idx, key, run_index)
                results = await self.batch(key, shape)
                self.failed += sum(1 for r in results if not r.ok)
                batches.append(results)
                if store is not None:
                    store.record_requests(self.run_id, key, run_index, [
                        request_row(r, expected_prompt=expected, latency_s=latency_s, scale=scale) for r in results])
        metrics = level_metrics(batches, expected_prompt=expected, latency_s=latency_s, scale=scale)
        metrics["prompt_source"] = shape.source
        if spec.kv_metrics:
            metrics["kv"] = kv_level(kv_before, await kv_scrapes(self.session, spec.kv_metrics),
                                     metrics.get("requests_ok") or 0)
        metrics["request_options"] = {"return_token_ids": self.token_ids, "exact_tg": self.exact_tg}
        if (failure := _failure(metrics)) is not None:
            metrics["failure"] = failure
        return LevelResult(run_id=self.run_id, label=spec.run_label, key=key, runs=spec.runs, metrics=metrics,
                           thermal=thermal.note, started=started, finished=time.time())


def _provenance(spec: SweepSpec, facts: EndpointFacts, latency: float) -> dict[str, Any]:
    """What a run records about where and how it measured (results.py's runs table)."""
    return {"topology": spec.topology, "recipe": spec.recipe, "recipe_hash": spec.recipe_hash,
            "endpoint": spec.url, "model": facts.model, "vllm_version": facts.vllm_version,
            "simulated": facts.simulated, "speed": facts.speed, "latency_mode": spec.latency_mode,
            "latency_ms": latency * 1000, "tool_version": f"sparkconsole {__version__}"}


def _open_run(spec: SweepSpec, store: ResultsStore | None, facts: EndpointFacts, prov: dict[str, Any],
              resume: bool) -> tuple[str, bool, set[LevelKey]]:
    """(run id, resumed, the levels already finished): a new run, or with `resume` the newest of the same spec."""
    if store is None:
        return uuid.uuid4().hex[:12], False, set()
    ident = spec.identity()
    ident["model"] = facts.model
    run_id, resumed = store.begin_run(source="sparkconsole", label=spec.run_label, spec=ident, resume=resume, **prov)
    return run_id, resumed, (store.finished_keys(run_id) if resumed else set())


async def run_sweep(spec: SweepSpec, store: ResultsStore | None = None, *, resume: bool = False,
                    thermal_probe: Callable[[], ThermalNote | None] | None = None,
                    on_level: Callable[[LevelResult], None] | None = None,
                    on_progress: Callable[[Progress], None] | None = None,
                    thermal_interval: float = 1.0) -> SweepOutcome:
    """Measure every level of `spec` against its endpoint; with `store`, write each batch and level as it lands.

    With `resume`, the newest run of the same spec in `store` continues: finished levels are skipped (and
    re-announced through `on_level`), an interrupted level is measured again from its start.
    """
    headers = api_headers()
    async with open_session(max(spec.concurrency)) as session:
        facts = await discover(session, spec, headers)
        options = await accepted_options(session, spec, facts.model, headers)
        latency = await probe_latency(session, spec, facts.model, headers)
        prov = _provenance(spec, facts, latency)
        run_id, resumed, done = _open_run(spec, store, facts, prov, resume)
        outcome = SweepOutcome(run_id, resumed, provenance=prov)
        if store is not None and done:
            for lv in store.levels(run_id):
                if lv.key in done:
                    outcome.skipped.append(lv.key)
                    if on_level:
                        on_level(lv)
        todo = [k for k in spec.levels() if k not in done]
        levels = _Levels(spec, session, headers, facts, options, latency, store, run_id, todo, on_progress)
        try:
            for key in todo:
                level = await levels.measure(key, _ThermalWatch(thermal_probe, thermal_interval))
                if store is not None:
                    store.record_level(level)
                outcome.levels.append(level)
                if on_level:
                    on_level(level)
                if "failure" in level.metrics and spec.on_failure == "pause":
                    outcome.paused_after = key
                    break
        finally:
            levels.watch.close()
        if store is not None and outcome.paused_after is None:
            store.finish_run(run_id)
        return outcome
