"""A headless llama-benchy sweep against simulated topologies, on a virtual clock.

Reproduces how the published gpt-oss-120b numbers were measured (llama-benchy 0.3.5 through a LiteLLM
proxy): for each concurrency level, `runs` times, `c` streaming requests of `pp` prompt tokens and `tg`
output tokens are issued at once (asyncio.gather) and the next run starts when all have finished.
Per run (llama-benchy results.py):
  prefill t/s = total prompt tokens / (latest first token - earliest request start)      (c > 1)
              = prompt tokens / (time to first response - measured latency)               (c = 1)
  decode t/s  = (total output tokens - requests) / (latest end - earliest first token)    (c > 1)
              = (output tokens - 1) / (end - first token)                                 (c = 1)
  ttft        = mean over requests of (first token - request start)   ("e2e_ttft")
and each level reports the mean and standard deviation of those over its runs.
"""

from __future__ import annotations

import heapq
import random
import statistics
from dataclasses import dataclass, field
from collections.abc import Sequence

from sparkconsole.errors import UserError
from sparkconsole.sim.engine import EngineArgs, SimEngine
from sparkconsole.sim.profiles import GB10, HardwareProfile, MODELS, ModelProfile
from sparkconsole.sim.routing import InflightTracker, make_policy, update_lag_for


@dataclass(frozen=True)
class Topology:
    name: str
    engines: int          # independent vLLM engines behind the router
    tp: int               # tensor parallel size of each engine (one GB10 per rank)
    routing: str = "simple-shuffle"

    @property
    def nodes(self) -> int:
        return self.engines * self.tp


TOPOLOGIES: dict[str, Topology] = {t.name: t for t in (
    Topology("solo", 1, 1),
    Topology("cluster-tp2", 1, 2),
    Topology("2x-solo-simple-shuffle", 2, 1, "simple-shuffle"),
    Topology("2x-solo-least-busy", 2, 1, "least-busy"),
    Topology("2x-solo-round-robin", 2, 1, "round-robin"),
)}


@dataclass(frozen=True)
class ProxyProfile:
    """The LiteLLM proxy every published request went through (and the client side of the benchmark)."""

    first_token_s: float = 0.012     # added to the first token (request parsing, routing, upstream connect)
    chunk_s: float = 1 / 1500        # proxy CPU per streamed chunk (~1,500 chunks/s per core)
    request_s: float = 0.002         # proxy CPU per request intake, serial on its event loop
    client_stagger_s: float = 0.0005  # gap between the benchmark's successive request starts
    jitter_s: float = 0.002          # random extra per request start (scheduling noise)
    latency_probe_s: float = 0.020   # what llama-benchy's latency probe measures and subtracts


LITELLM = ProxyProfile()


@dataclass
class RequestTiming:
    start: float
    backend: int
    first: float | None = None
    end: float | None = None
    tokens: int = 0


@dataclass
class LevelResult:
    concurrency: int
    decode_tps: float
    decode_std: float
    prefill_tps: float
    prefill_std: float
    ttft_ms: float
    ttft_std: float
    runs: int
    # requests each backend received over the level's runs, and the mean per-run max/min share
    backend_requests: list[int] = field(default_factory=list)
    imbalance: float = 1.0


def _run_once(engines: list[SimEngine], topo: Topology, c: int, pp: int, tg: int, rng: random.Random,
              proxy: ProxyProfile, seed: int) -> list[RequestTiming]:
    policy = make_policy(topo.routing, seed=seed) if topo.engines > 1 else None
    tracker = InflightTracker(len(engines), update_lag_for(topo.routing) if policy else 0.0)
    timings: dict[str, RequestTiming] = {}
    heap: list[tuple[float, int, str, object]] = []   # (time, seq, kind, payload)
    seq = 0

    def push(t: float, kind: str, payload: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, payload))

    proxy_free = 0.0
    for i in range(c):
        start = i * proxy.client_stagger_s + rng.random() * proxy.jitter_s
        push(start, "request", f"r{i}")
    busy = [False] * len(engines)
    owner: dict[str, int] = {}

    def start_step(k: int, now: float) -> None:
        res = engines[k].step()
        busy[k] = True
        push(now + res.duration_s, "step_end", (k, res))

    while heap:
        now, _, kind, payload = heapq.heappop(heap)
        if kind == "request":
            rid = payload
            t = max(now, proxy_free) + proxy.request_s
            proxy_free = t
            k = policy.choose(tracker.view(t)) if policy else 0
            tracker.started(k, t)
            owner[rid] = k
            timings[rid] = RequestTiming(start=now, backend=k)
            push(t + proxy.first_token_s, "arrive", rid)
        elif kind == "arrive":
            k = owner[payload]
            engines[k].add_request(payload, pp, tg)
            if not busy[k]:
                start_step(k, now)
        elif kind == "step_end":
            k, res = payload
            busy[k] = False
            for ev in res.events:
                # every token is one SSE chunk through the proxy's single event loop
                t = max(now, proxy_free) + proxy.chunk_s
                proxy_free = t
                rt = timings[ev.req_id]
                rt.tokens += ev.new_tokens
                if ev.first:
                    rt.first = t
                if ev.finished:
                    rt.end = t
                    tracker.finished(k, t)
            if engines[k].has_work():
                start_step(k, now)
    return list(timings.values())


def _metrics(timings: list[RequestTiming], pp: int, latency: float) -> tuple[float, float, float]:
    """(prefill t/s, decode t/s, mean e2e ttft s) of one run, the way llama-benchy computes them."""
    ttft = statistics.fmean(r.first - r.start for r in timings)
    if len(timings) == 1:
        r = timings[0]
        est_ppt = max(1e-9, (r.first - r.start) - latency)
        prefill = pp / est_ppt
        decode = (r.tokens - 1) / (r.end - r.first) if r.tokens > 1 and r.end > r.first else 0.0
        return prefill, decode, ttft
    min_start = min(r.start for r in timings)
    prefill = pp * len(timings) / (max(r.first for r in timings) - min_start)
    span = max(r.end for r in timings) - min(r.first for r in timings)
    gen = sum(r.tokens for r in timings) - len(timings)
    decode = gen / span if span > 0 else 0.0
    return prefill, decode, ttft


def _std(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0   # llama-benchy: np.std (population)


def resolve_topology(topology: str | Topology) -> Topology:
    if isinstance(topology, Topology):
        return topology
    try:
        return TOPOLOGIES[topology]
    except KeyError:
        raise UserError(f"unknown topology {topology!r}", field="topology",
                        fix="use one of " + ", ".join(TOPOLOGIES)) from None


def resolve_model(model: str | ModelProfile) -> ModelProfile:
    if isinstance(model, ModelProfile):
        return model
    try:
        return MODELS[model]
    except KeyError:
        raise UserError(f"unknown model {model!r}", field="model", fix="use one of " + ", ".join(MODELS)) from None


def run_level(topology: str | Topology, model: str | ModelProfile, args: EngineArgs, c: int, pp: int, tg: int,
              runs: int, seed: int = 0, *, hw: HardwareProfile = GB10, proxy: ProxyProfile = LITELLM) -> LevelResult:
    topo = resolve_topology(topology)
    prof = resolve_model(model)
    targs = EngineArgs(**{**args.__dict__, "tensor_parallel_size": topo.tp})
    engines = [SimEngine(prof, targs, hw, nodes=topo.tp) for _ in range(topo.engines)]
    rng = random.Random(f"{seed}:{topo.name}:{c}")
    pre, dec, ttf = [], [], []
    per_backend = [0] * topo.engines
    shares = []
    for r in range(runs):
        timings = _run_once(engines, topo, c, pp, tg, rng, proxy, seed=rng.randrange(1 << 30))
        p, d, t = _metrics(timings, pp, proxy.latency_probe_s)
        pre.append(p)
        dec.append(d)
        ttf.append(t)
        counts = [0] * topo.engines
        for rt in timings:
            counts[rt.backend] += 1
        for k, n in enumerate(counts):
            per_backend[k] += n
        shares.append(max(counts) / max(1, min(counts)) if topo.engines > 1 else 1.0)
    return LevelResult(
        concurrency=c, decode_tps=statistics.fmean(dec), decode_std=_std(dec),
        prefill_tps=statistics.fmean(pre), prefill_std=_std(pre),
        ttft_ms=1000 * statistics.fmean(ttf), ttft_std=1000 * _std(ttf), runs=runs,
        backend_requests=per_backend, imbalance=statistics.fmean(shares))


def run_sweep(topology: str | Topology, model: str | ModelProfile, args: EngineArgs,
              concurrency: Sequence[int], pp: int, tg: int, runs: int, seed: int = 0, *,
              hw: HardwareProfile = GB10, proxy: ProxyProfile = LITELLM) -> list[LevelResult]:
    """One LevelResult per concurrency level, in the order given."""
    if runs < 1 or pp < 1 or tg < 1 or any(c < 1 for c in concurrency):
        raise UserError("runs, pp, tg and every concurrency level must be at least 1", field="sweep",
                        fix="use positive integers")
    return [run_level(topology, model, args, c, pp, tg, runs, seed, hw=hw, proxy=proxy) for c in concurrency]
