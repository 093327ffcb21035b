"""A sweep: pp × tg × depth × concurrency levels, `runs` batches per level, each level stored as it finishes.

This module holds what a sweep is (SweepSpec, its Progress and SweepOutcome, the ETA's BatchClock) and what it
learns of its endpoint before it measures (reachable, the model, vLLM's version, a simulator's clock, the latency
probe, the request options the endpoint accepts, the KV connector's counters); bench/measure.py measures it.

Order and definitions follow llama-benchy (depth, pp, tg, then concurrency; one unrecorded warm-up batch per
level unless `warmup=False`; latency probe api | generation | none subtracted from TTFR for the prefill
estimate). Failed requests are stored with their error; a level with any failed request is marked failed
(`metrics["failure"]`: how many and the commonest reason) and the sweep goes on, or with `on_failure="pause"`
stops right after recording it (the run stays open: `--resume` goes on with the next level). Knows nothing of
nodes: the caller injects `thermal_probe`, and the TUI draws curves from `on_level`.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from ..errors import UserError
from .client import api_base, chat_payload, server_root, stream_chat
from .results import LevelKey, LevelResult

if TYPE_CHECKING:
    from ..serving.prom import Scrape

LATENCY_MODES = ("api", "generation", "none")
ON_FAILURE = ("continue", "pause")
API_KEY_ENV = ("SPARKCONSOLE_API_KEY", "OPENAI_API_KEY")


@dataclass(frozen=True)
class SweepSpec:
    url: str
    model: str | None = None              # None: the first model /v1/models lists
    pp: tuple[int, ...] = (1024,)
    tg: tuple[int, ...] = (128,)
    depth: tuple[int, ...] = (0,)
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    runs: int = 3
    warmup: bool = True
    latency_mode: str = "api"
    exact_tg: bool = True
    token_ids: bool = True
    stall_timeout: float = 60.0           # silence mid-stream that fails a request
    first_timeout: float = 600.0          # wait for the first chunk (queueing + prefill at high load)
    request_timeout: float = 3600.0
    topology: str | None = None
    recipe: str | None = None
    recipe_hash: str | None = None
    label: str | None = None              # what reports compare by (default: topology, else the URL)
    on_failure: str = "continue"          # after a failed level: "continue", or "pause" (stop; --resume goes on)
    # A batch starts at least this many seconds after the one before it started (0: back to back). A steady load
    # that leaves the servers room, e.g. beside a rolling restart; the figures are per batch, so they keep their
    # meaning, and the pace is not part of what the sweep measures.
    pace: float = 0.0
    # /metrics of the servers that receive a KV cache (a disaggregated launch's decode side): read before and after
    # each level's measured batches, so a level says how many bytes crossed per request, and whether any did
    kv_metrics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("pp", "tg", "concurrency", "depth"):
            vals = getattr(self, name)
            low = 0 if name == "depth" else 1
            if not vals or any((not isinstance(v, int)) or v < low for v in vals):
                raise UserError(f"needs whole numbers ≥ {low}", field=f"--{name}",
                                fix=f"e.g. --{name} {'0,4096' if name == 'depth' else '1,2,4'}")
        if self.runs < 1:
            raise UserError("must be at least 1", field="--runs", fix="e.g. --runs 3")
        if not (math.isfinite(self.pace) and self.pace >= 0):
            raise UserError(f"must be 0 or more seconds, not {self.pace}", field="--pace", fix="e.g. --pace 0.5")
        if self.latency_mode not in LATENCY_MODES:
            raise UserError(f"unknown latency mode {self.latency_mode!r}", field="--latency-mode",
                            fix="use one of " + ", ".join(LATENCY_MODES))
        if self.on_failure not in ON_FAILURE:
            raise UserError(f"unknown choice {self.on_failure!r}", field="--on-failure",
                            fix="use one of " + ", ".join(ON_FAILURE))
        if not self.url.startswith(("http://", "https://")):
            raise UserError(f"not an http(s) URL: {self.url!r}", field="--url", fix="e.g. --url http://127.0.0.1:8000")

    def levels(self) -> list[LevelKey]:
        return [LevelKey(p, t, d, c) for d in self.depth for p in self.pp for t in self.tg for c in self.concurrency]

    @property
    def run_label(self) -> str:
        return self.label or self.topology or self.url

    def identity(self) -> dict[str, Any]:
        """What makes two sweeps the same measurement (for --resume); the URL only when no topology names it."""
        d = asdict(self)
        for k in ("stall_timeout", "first_timeout", "request_timeout", "label", "on_failure", "kv_metrics", "pace"):
            d.pop(k)
        if self.topology:
            d.pop("url")
        return d


@dataclass(frozen=True)
class Progress:
    level: LevelKey
    level_index: int        # 1-based
    levels: int
    run_index: int          # 1-based; 0 while warming up
    runs: int
    eta_s: float | None
    failed: int             # failed requests so far in this sweep

    def line(self) -> str:
        eta = "?" if self.eta_s is None else _fmt_duration(self.eta_s)
        run = "warm-up" if self.run_index == 0 else f"run {self.run_index}/{self.runs}"
        fail = f"  failed {self.failed}" if self.failed else ""
        return f"level {self.level_index}/{self.levels} {self.level}  {run}  ETA {eta}{fail}"


@dataclass
class SweepOutcome:
    run_id: str
    resumed: bool
    levels: list[LevelResult] = field(default_factory=list)
    skipped: list[LevelKey] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    paused_after: LevelKey | None = None      # on_failure="pause": the failed level the sweep stopped after


@dataclass(frozen=True)
class EndpointFacts:
    model: str
    vllm_version: str | None
    speed: float                 # /sim/clock speed; 1.0 for a real server
    simulated: bool


class BatchClock:
    """The time a sweep has left, from the batches timed so far: a batch takes a + b·concurrency seconds, fitted by
    least squares (with one concurrency timed, that level's mean for every batch, never less than what was seen).
    A time proportional to concurrency alone read a c64 batch as 64 c1 batches: decode-bound batches of a few
    hundred tokens take a few times a c1 batch, so the first ETA of a c1…c64 sweep was ten times too long.
    A paced sweep's batches start `pace` seconds apart at the least, so none counts for less."""

    def __init__(self, pace: float = 0.0) -> None:
        self.timed: list[tuple[int, float]] = []
        self.pace = pace

    def add(self, concurrency: int, seconds: float) -> None:
        self.timed.append((concurrency, seconds))

    def predict(self, concurrency: int) -> float | None:
        if not self.timed:
            return None
        n = len(self.timed)
        mc = sum(c for c, _ in self.timed) / n
        mt = sum(t for _, t in self.timed) / n
        var = sum((c - mc) ** 2 for c, _ in self.timed)
        if var == 0:
            return mt
        slope = max(0.0, sum((c - mc) * (t - mt) for c, t in self.timed) / var)
        return max(mt + slope * (concurrency - mc), min(t for _, t in self.timed))

    def left(self, batches: Sequence[int]) -> float | None:
        """Seconds for these batches (their concurrencies), or None before the first one is timed."""
        if not self.timed:
            return None
        return sum(max(self.predict(c) or 0.0, self.pace) for c in batches)


def _fmt_duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


async def kv_scrapes(session: aiohttp.ClientSession, urls: Sequence[str]) -> list[Scrape | None]:
    """One /metrics page per receiving server (None where it did not answer), parsed for the KV figures."""
    from ..serving import metrics as m
    from ..serving import prom
    out: list[Scrape | None] = []
    for url in urls:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                out.append(prom.parse(await r.text(), only=m.CONSOLE_NAMES) if r.status == 200 else None)
        except (TimeoutError, aiohttp.ClientError):
            out.append(None)
    return out


def kv_level(before: Sequence[Scrape | None], after: Sequence[Scrape | None], requests: int) -> dict[str, Any]:
    """What crossed the KV connector during a level's measured batches, over its receiving servers: transfers,
    bytes per request, mean seconds per transfer, and the share of prompt tokens that arrived rather than being
    computed again (1.0: no recompute)."""
    from ..serving import metrics as m
    from ..serving import prom
    transfers = moved = xfer_s = ext = local = 0.0
    seen = False
    for b, a in zip(before, after, strict=False):
        if b is None or a is None:
            continue
        n = prom.counter_increase(b, a, m.KV_BYTES[0] + "_count")
        if n is None:
            continue
        seen = True
        transfers += n
        moved += prom.counter_increase(b, a, m.KV_BYTES[0] + "_sum") or 0.0
        xfer_s += prom.counter_increase(b, a, m.KV_XFER_TIME[0] + "_sum") or 0.0
        ext += m.source_increase(b, a, m.SOURCE_EXTERNAL) or 0.0
        local += m.source_increase(b, a, m.SOURCE_LOCAL) or 0.0
    if not seen:
        return {"read": False}
    return {"read": True, "transfers": transfers, "bytes_per_request": moved / requests if requests else None,
            "xfer_ms_mean": xfer_s / transfers * 1000 if transfers else None,
            "prompt_external_share": ext / (ext + local) if ext + local else None}


def api_headers() -> dict[str, str]:
    for name in API_KEY_ENV:
        key = os.environ.get(name)
        if key:
            return {"Authorization": f"Bearer {key}"}
    return {}


async def _get_json(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Any:
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None


def connect_problem(exc: BaseException) -> str:
    """'connection refused' for aiohttp's ClientConnectorError: the OS's words, not the exception's repr."""
    err = getattr(exc, "os_error", None) or exc
    if isinstance(err, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    words = getattr(err, "strerror", None) or " ".join(str(err).split()) or type(err).__name__
    return words[:1].lower() + words[1:160]


async def reachable(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> None:
    """A UserError naming the URL when nothing answers there: before a run is recorded, not one failed request
    per level after it."""
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            await resp.read()
    except (TimeoutError, aiohttp.ClientConnectionError, OSError) as exc:
        if isinstance(exc, aiohttp.ServerDisconnectedError):
            return      # it answered, then hung up: the sweep records what its requests get
        why = "no answer within 10 s" if isinstance(exc, asyncio.TimeoutError) else connect_problem(exc)
        raise UserError(f"cannot connect to {server_root(url.removesuffix('/models'))}: {why}", field="--url",
                        fix="start the server, or check the address and port") from None


async def check_reachable(url: str) -> None:
    """reachable() in a session of its own: the CLI asks before it opens (or creates) a results file."""
    async with aiohttp.ClientSession() as session:
        await reachable(session, api_base(url) + "/models", api_headers())


async def discover(session: aiohttp.ClientSession, spec: SweepSpec, headers: dict[str, str]) -> EndpointFacts:
    root, base = server_root(spec.url), api_base(spec.url)
    await reachable(session, base + "/models", headers)
    models, version, clock = await asyncio.gather(
        _get_json(session, base + "/models", headers), _get_json(session, root + "/version", headers),
        _get_json(session, root + "/sim/clock", headers))
    ids = [m.get("id") for m in (models or {}).get("data", []) if isinstance(m, dict)] if isinstance(models, dict) else []
    model = spec.model or (ids[0] if ids else None)
    if model is None:
        raise UserError(f"{base}/models lists no model and none was given", field="--model",
                        fix="start the server, check --url, or pass --model NAME")
    ver = version.get("version") if isinstance(version, dict) else None
    speed = clock.get("speed") if isinstance(clock, dict) else None
    simulated = isinstance(speed, (int, float)) and speed > 0
    return EndpointFacts(model, str(ver) if ver else None,
                         float(speed) if simulated and isinstance(speed, (int, float)) else 1.0, simulated)


async def probe_latency(session: aiohttp.ClientSession, spec: SweepSpec, model: str, headers: dict[str, str],
                        probes: int = 3) -> float:
    """llama-benchy's latency modes: api = GET /v1/models; generation = first chunk of a 1-token stream."""
    if spec.latency_mode == "none":
        return 0.0
    vals = []
    for i in range(probes + (1 if spec.latency_mode == "generation" else 0)):
        t0 = time.perf_counter()
        if spec.latency_mode == "api":
            try:
                async with session.get(api_base(spec.url) + "/models", headers=headers) as resp:
                    await resp.read()
            except aiohttp.ClientError:
                continue
            vals.append(time.perf_counter() - t0)
        else:
            body = chat_payload(model, [{"role": "user", "content": "hello"}], 1, exact_tg=False, token_ids=False)
            r = await stream_chat(session, api_base(spec.url) + "/chat/completions", body, headers=headers,
                                  stall_timeout=spec.stall_timeout)
            if i > 0 and r.ok and r.first_response is not None:   # the first probe warms up
                vals.append(r.first_response - r.start)
    return sum(vals) / len(vals) if vals else 0.0


async def accepted_options(session: aiohttp.ClientSession, spec: SweepSpec, model: str,
                           headers: dict[str, str]) -> tuple[bool, bool]:
    """(token_ids, exact_tg) this endpoint accepts. vLLM takes both; a router or proxy may refuse a field it does
    not know with HTTP 400: drop return_token_ids first (usage still counts tokens), then min_tokens/ignore_eos.
    Doubles as the sweep's first warm-up request."""
    tries = [(spec.token_ids, spec.exact_tg)]
    if spec.token_ids:
        tries.append((False, spec.exact_tg))
    if spec.exact_tg:
        tries.append((False, False))
    for token_ids, exact in tries:
        body = chat_payload(model, [{"role": "user", "content": "hello"}], 2, exact_tg=exact, token_ids=token_ids)
        r = await stream_chat(session, api_base(spec.url) + "/chat/completions", body, headers=headers,
                              stall_timeout=spec.stall_timeout, timeout=spec.first_timeout)
        if r.status != 400:
            return token_ids, exact        # accepted, or failing for another reason the sweep will record
    return spec.token_ids, spec.exact_tg
