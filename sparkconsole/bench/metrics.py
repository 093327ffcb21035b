"""Per-request and per-level figures from streamed requests, with llama-benchy's definitions.

A level is `runs` batches of `concurrency` simultaneous requests. Totals ("t/s (total)") are computed per
batch and reported as mean ± std over batches; per-request figures over all requests of the level.
`scale` multiplies every measured interval (a simulated server running `--speed F` faster reports F).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .client import RequestResult

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Metric:
    mean: float
    std: float
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Metric | None:
        vals = tuple(float(v) for v in values if v is not None and math.isfinite(v))
        if not vals:
            return None
        return cls(statistics.fmean(vals), statistics.pstdev(vals) if len(vals) > 1 else 0.0, vals)

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "values": list(self.values)}

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Metric | None:
        if not d:
            return None
        return cls(float(d["mean"]), float(d.get("std") or 0.0), tuple(float(v) for v in d.get("values") or ()))


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """p50/p90/p99 with linear interpolation between closest ranks (numpy's default)."""
    vals = sorted(values)
    if not vals:
        return None
    out = {}
    for p in PERCENTILES:
        pos = (len(vals) - 1) * p / 100
        lo = math.floor(pos)
        hi = min(lo + 1, len(vals) - 1)
        out[f"p{p}"] = vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)
    return out


@dataclass(frozen=True)
class RequestFigures:
    """What one request measured, in (scaled) seconds and tokens per second."""

    ttfr_s: float | None           # time to first response chunk
    ttft_s: float | None           # time to first content token (end to end)
    est_ppt_s: float | None        # estimated prefill time: ttfr minus the probed network/API latency
    prefill_tps: float | None
    decode_tps: float | None       # tokens after the first / (last token - first token)
    tpot_s: float | None           # mean time per output token after the first
    prompt_tokens: int
    completion_tokens: int


def request_figures(r: RequestResult, *, expected_prompt: int, latency_s: float = 0.0,
                    scale: float = 1.0) -> RequestFigures:
    prompt = prompt_tokens_used(r, expected_prompt)
    ttfr = (r.first_response - r.start) * scale if r.first_response is not None else None
    ttft = (r.first_token - r.start) * scale if r.first_token is not None else None
    est_ppt = max(0.0, ttfr - latency_s) if ttfr is not None else None
    prefill = prompt / est_ppt if est_ppt else None
    decode = tpot = None
    tt = r.token_times
    n = decode_tokens(tt)
    if n and tt[-1] > tt[0]:
        span = (tt[-1] - tt[0]) * scale
        decode = n / span
        tpot = span / n
    return RequestFigures(ttfr, ttft, est_ppt, prefill, decode, tpot, prompt, r.completion_tokens)


def decode_tokens(times: Sequence[float]) -> int:
    """Tokens that arrived after the first token's read (llama-benchy's `_count_tokens_after_first_timestamp`):
    tokens delivered in the same read as the first one were made before the decode span began."""
    if len(times) < 2:
        return 0
    first = times[0]
    return sum(1 for t in times if t > first)


def prompt_tokens_used(r: RequestResult, expected: int) -> int:
    # llama-benchy's rule: trust the server's count unless it is more than 20% off what was sent.
    if r.prompt_tokens and (expected <= 0 or abs(r.prompt_tokens - expected) < expected * 0.2):
        return r.prompt_tokens
    return expected


def peak_rate(times: Sequence[float], window: float) -> float | None:
    """Most tokens seen inside any `window`-long span, per second (llama-benchy's peak t/s)."""
    if len(times) < 2:
        return None
    ts = sorted(times)
    span = ts[-1] - ts[0]
    if 0 < span < window:
        return len(ts) / span
    best = 0
    lo = 0
    for hi, t in enumerate(ts):
        while ts[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best / window


class _LevelFigures:
    """A level's figures as its batches land: per request (llama-benchy's req_ keys, TTFT, ITL, TPOT) and per batch
    (its total prefill and decode rates across the batch's span, its peak)."""

    def __init__(self, expected_prompt: int, latency_s: float, scale: float) -> None:
        self.expected_prompt, self.latency_s, self.scale = expected_prompt, latency_s, scale
        self.pp_req: list[float] = []
        self.tg_req: list[float] = []
        self.ttfr: list[float] = []
        self.est_ppt: list[float] = []
        self.e2e: list[float] = []
        self.tpot: list[float] = []
        self.itl: list[float] = []
        self.pp_total: list[float] = []
        self.tg_total: list[float] = []
        self.peak_total: list[float] = []
        self.peak_req: list[float] = []
        self.ok = self.failed = 0
        self.prompt_sum = self.completion_sum = 0
        self.errors: dict[str, int] = {}

    def add_batch(self, batch: Sequence[RequestResult]) -> None:
        good = [r for r in batch if r.ok]
        self.failed += len(batch) - len(good)
        for r in batch:
            if r.error:
                self.errors[r.error] = self.errors.get(r.error, 0) + 1
        self.ok += len(good)
        if not good:
            return
        figs = [request_figures(r, expected_prompt=self.expected_prompt, latency_s=self.latency_s, scale=self.scale)
                for r in good]
        for r, f in zip(good, figs, strict=False):
            self._add_request(r, f)
        self._add_totals(good, sum(f.prompt_tokens for f in figs))

    def _add_request(self, r: RequestResult, f: RequestFigures) -> None:
        scale = self.scale
        self.prompt_sum += f.prompt_tokens
        self.completion_sum += f.completion_tokens
        if f.ttfr_s is not None:
            self.ttfr.append(f.ttfr_s * 1000)
        if f.ttft_s is not None:
            self.e2e.append(f.ttft_s * 1000)
            if f.est_ppt_s is not None:
                self.est_ppt.append(f.est_ppt_s * 1000)
        if f.prefill_tps:
            self.pp_req.append(f.prefill_tps)
        if f.decode_tps:
            self.tg_req.append(f.decode_tps)
            if f.tpot_s is not None:          # always, with decode_tps
                self.tpot.append(f.tpot_s * 1000)
        tt = r.token_times
        self.itl.extend((tt[i] - tt[i - 1]) * scale * 1000 for i in range(1, len(tt)))
        pk = peak_rate([t * scale for t in tt], 1.0)
        if pk:
            self.peak_req.append(pk)

    def _add_totals(self, good: list[RequestResult], prompt_tokens: int) -> None:
        scale = self.scale
        starts = [r.start for r in good]
        firsts = [r.first_token for r in good if r.first_token is not None]
        lasts = [r.token_times[-1] for r in good if r.token_times]
        if firsts:
            pp_span = (max(firsts) - min(starts)) * scale
            if pp_span > 0:
                self.pp_total.append(prompt_tokens / pp_span)
            tg_span = (max(lasts) - min(firsts)) * scale
            n_decode = sum(decode_tokens(r.token_times) for r in good)
            if tg_span > 0 and n_decode > 0:
                self.tg_total.append(n_decode / tg_span)
        pk = peak_rate([t * scale for r in good for t in r.token_times], 1.0)
        if pk:
            self.peak_total.append(pk)

    def result(self, single: bool) -> dict[str, Any]:
        m = {
            "pp_throughput": Metric.of(self.pp_req if single else self.pp_total),
            "pp_req_throughput": Metric.of(self.pp_req),
            "tg_throughput": Metric.of(self.tg_req if single else self.tg_total),
            "tg_req_throughput": Metric.of(self.tg_req),
            "peak_throughput": Metric.of(self.peak_total),
            "peak_req_throughput": Metric.of(self.peak_req),
            "ttfr": Metric.of(self.ttfr),
            "est_ppt": Metric.of(self.est_ppt),
            "e2e_ttft": Metric.of(self.e2e),
        }
        out: dict[str, Any] = {k: (v.to_json() if v else None) for k, v in m.items()}
        out["ttft_ms"] = percentiles(self.e2e)
        out["itl_ms"] = percentiles(self.itl)
        out["tpot_ms"] = percentiles(self.tpot)
        out["requests_ok"] = self.ok
        out["requests_failed"] = self.failed
        out["prompt_tokens_mean"] = self.prompt_sum / self.ok if self.ok else None
        out["completion_tokens_mean"] = self.completion_sum / self.ok if self.ok else None
        out["errors"] = self.errors
        return out


def level_metrics(batches: Sequence[Sequence[RequestResult]], *, expected_prompt: int, latency_s: float = 0.0,
                  scale: float = 1.0) -> dict[str, Any]:
    """Aggregate a level. Keys follow llama-benchy's JSON (pp_throughput, tg_throughput, ttfr, est_ppt, e2e_ttft,
    … in t/s and ms) plus percentiles of TTFT, ITL and TPOT in ms, and request counts."""
    figures = _LevelFigures(expected_prompt, latency_s, scale)
    for batch in batches:
        figures.add_batch(batch)
    return figures.result(single=max((len(b) for b in batches), default=1) == 1)
