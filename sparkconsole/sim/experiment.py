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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkconsole.errors import UserError
from sparkconsole.sim.engine import EngineArgs, SimEngine
from sparkconsole.sim.profiles import GB10, MODELS, HardwareProfile, ModelProfile
from sparkconsole.sim.routing import InflightTracker, RoutingPolicy, make_policy


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
    # one prefill engine, one decode engine; the prompt's KV crosses the link (NIXL-style)
    Topology("disagg", 2, 1, "disagg"),
)}


@dataclass(frozen=True)
class ProxyProfile:
    """The LiteLLM proxy every published request went through, and the client and server front ends.

    The proxy is one asyncio event loop: every piece of work it does is a task on one FIFO queue served
    by one core. A request costs `route_s` (parse, auth, pick a backend from the in-flight counts),
    then — queued behind whatever arrived meanwhile — `forward_s` (the pre-call hook that counts it in
    flight, and the upstream call); each streamed chunk costs `chunk_s`; the success callback that
    uncounts it costs `done_s`. A burst that arrives faster than it is routed is routed on counts
    that do not yet include its own first requests: that is least-busy's pile-on, not a constant.
    """

    route_s: float = 0.002
    forward_s: float = 0.002
    chunk_s: float = 1 / 1500            # ~1,500 chunks/s per core
    done_s: float = 0.0005
    upstream_s: float = 0.002            # network + vLLM front end (tokenize, hand to the engine core)
    client_gap_s: float = 0.0001         # llama-benchy starting one request after another (asyncio.gather)
    client_jitter_s: float = 0.004       # random extra delay before a request reaches the proxy
    engine_wakeup_s: float = 0.004       # an idle engine core starts its first step this long after a request
    latency_probe_s: float = 0.020       # what llama-benchy's latency probe measures and subtracts
    # requests the proxy keeps open to one backend; more wait in the proxy until one finishes
    # (inferred from the published c64 rows, docs/SIMULATION.md); None = unlimited
    max_inflight_per_backend: int | None = 48


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
    # requests each backend received over the level's runs, and the mean over runs of the busiest
    # backend's count divided by the idlest's (at least 1); 1.0 for a single engine or disagg
    backend_requests: list[int] = field(default_factory=list)
    imbalance: float = 1.0


class _OneRun:
    """One run of a level as discrete events on a virtual clock: `c` requests through the proxy's one event loop to
    the engines, each engine stepping while it has work, every streamed chunk back through the proxy."""

    def __init__(self, engines: list[SimEngine], topo: Topology, pp: int, tg: int, proxy: ProxyProfile,
                 policy: RoutingPolicy | None, tracker: InflightTracker) -> None:
        self.engines, self.pp, self.tg = engines, pp, tg
        self.proxy, self.policy, self.tracker = proxy, policy, tracker
        self.timings: dict[str, RequestTiming] = {}
        self.heap: list[tuple[float, int, Callable[[float, Any], None], Any]] = []   # (time, seq, handler, payload)
        self.seq = 0
        self.loop_free = 0.0                                   # when the proxy's event loop is next idle
        self.busy = [False] * len(engines)
        self.upstream = [0] * len(engines)                     # requests the proxy has open to each backend
        self.queued: list[deque[str]] = [deque() for _ in engines]
        self.cap = proxy.max_inflight_per_backend or 1 << 30
        self.disagg = topo.routing == "disagg"
        self.kv_link_s = 0.0
        if self.disagg:
            # prompt KV over the link: NIXL over ConnectX-7, same bandwidth as the all-reduces
            hw = engines[0].hw
            self.kv_link_s = (pp * engines[0].kv_bytes_per_token / (hw.link_bytes_s * hw.link_efficiency)
                              + hw.allreduce_latency_s)

    def push(self, t: float, handler: Callable[[float, Any], None], payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, handler, payload))

    def proxy_task(self, t: float, cost: float, handler: Callable[[float, Any], None], payload: Any) -> None:
        """Queue a task on the proxy's event loop; `handler` runs when it has run."""
        self.loop_free = max(t, self.loop_free) + cost
        self.push(self.loop_free, handler, payload)

    def start_step(self, k: int, now: float) -> None:
        res = self.engines[k].step()
        self.push(now + res.duration_s, self.on_step_end, (k, res))

    def forward(self, rid: str, k: int, t: float) -> None:
        self.upstream[k] += 1
        self.push(t + self.proxy.upstream_s, self.on_arrive, rid)

    def wake(self, k: int, now: float) -> None:
        if not self.busy[k]:
            self.busy[k] = True
            self.push(now + self.proxy.engine_wakeup_s, self.on_wake, k)

    def run(self, c: int, rng: random.Random) -> list[RequestTiming]:
        for i in range(c):
            self.push(i * self.proxy.client_gap_s + rng.random() * self.proxy.client_jitter_s, self.on_request, f"r{i}")
        while self.heap:
            now, _, handler, payload = heapq.heappop(self.heap)
            handler(now, payload)
        return list(self.timings.values())

    # -------- the events, one method each
    def on_request(self, now: float, rid: str) -> None:
        self.timings[rid] = RequestTiming(start=now, backend=-1)
        self.proxy_task(now, self.proxy.route_s, self.on_routed, rid)

    def on_routed(self, now: float, rid: str) -> None:
        self.timings[rid].backend = self.policy.choose(self.tracker.view(now)) if self.policy else 0
        self.proxy_task(now, self.proxy.forward_s, self.on_counted, rid)

    def on_counted(self, now: float, rid: str) -> None:
        k = self.timings[rid].backend
        self.tracker.started(k, now)
        if self.upstream[k] < self.cap:
            self.forward(rid, k, now)
        else:
            self.queued[k].append(rid)

    def on_arrive(self, now: float, rid: str) -> None:
        k = self.timings[rid].backend
        self.engines[k].add_request(rid, self.pp, 1 if self.disagg else self.tg)
        self.wake(k, now)

    def on_kv_ready(self, now: float, rid: str) -> None:
        self.engines[1].add_request(rid, self.pp, self.tg, prefilled_tokens=self.pp)
        self.wake(1, now)

    def on_wake(self, now: float, k: int) -> None:
        self.start_step(k, now)

    def on_step_end(self, now: float, payload: tuple[int, Any]) -> None:
        k, res = payload
        for ev in res.events:
            if self.disagg and k == 0:
                # the prefill instance's one token is not streamed; hand the KV to the decode side
                self.upstream[0] -= 1
                if self.queued[0]:
                    self.forward(self.queued[0].popleft(), 0, now)
                self.push(now + self.kv_link_s, self.on_kv_ready, ev.req_id)
                continue
            self.proxy_task(now, self.proxy.chunk_s, self.on_chunk, (k, ev))
        if self.engines[k].has_work():
            self.start_step(k, now)
        else:
            self.busy[k] = False

    def on_chunk(self, now: float, payload: tuple[int, Any]) -> None:
        k, ev = payload
        rt = self.timings[ev.req_id]
        rt.tokens += ev.new_tokens
        if ev.first:
            rt.first = now
        if ev.finished:
            rt.end = now
            self.upstream[k] -= 0 if self.disagg else 1
            if self.queued[k]:
                self.forward(self.queued[k].popleft(), k, now)
            self.proxy_task(now, self.proxy.done_s, self.on_done, k)

    def on_done(self, now: float, k: int) -> None:
        self.tracker.finished(k, now)


@dataclass(frozen=True)
class _Finished:
    start: float
    first: float
    end: float
    tokens: int


def _finished(timings: list[RequestTiming]) -> list[_Finished]:
    """The requests of a run that has ended: each has its first token and its end."""
    out = []
    for r in timings:
        if r.first is None or r.end is None:
            raise ValueError(f"the request started at {r.start:g} s has not finished")
        out.append(_Finished(r.start, r.first, r.end, r.tokens))
    return out


def benchy_metrics(timings: list[RequestTiming], pp: int, latency: float) -> tuple[float, float, float]:
    """(prefill t/s, decode t/s, mean e2e ttft s) of one run, the way llama-benchy computes them."""
    done = _finished(timings)
    ttft = statistics.fmean(r.first - r.start for r in done)
    if len(done) == 1:
        r = done[0]
        est_ppt = max(1e-9, (r.first - r.start) - latency)
        prefill = pp / est_ppt
        decode = (r.tokens - 1) / (r.end - r.first) if r.tokens > 1 and r.end > r.first else 0.0
        return prefill, decode, ttft
    min_start = min(r.start for r in done)
    prefill = pp * len(done) / (max(r.first for r in done) - min_start)
    span = max(r.end for r in done) - min(r.first for r in done)
    gen = sum(r.tokens for r in done) - len(done)
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
    if pp + tg > args.max_model_len:
        raise UserError(f"pp {pp} + tg {tg} exceeds max_model_len {args.max_model_len}", field="max_model_len",
                        fix=f"raise max_model_len to at least {pp + tg} or shorten the prompt")
    targs = EngineArgs(**{**args.__dict__, "tensor_parallel_size": topo.tp})
    engines = [SimEngine(prof, targs, hw, nodes=topo.tp) for _ in range(topo.engines)]
    rng = random.Random(f"{seed}:{topo.name}:{c}")
    # one router for the whole level, as in the published runs: its state carries over between runs
    policy = (make_policy(topo.routing, seed=rng.randrange(1 << 30))
              if topo.engines > 1 and topo.routing != "disagg" else None)
    tracker = InflightTracker(topo.engines)   # lateness comes from the proxy's event loop here
    pre, dec, ttf = [], [], []
    per_backend = [0] * topo.engines
    shares = []
    for _ in range(runs):
        timings = _OneRun(engines, topo, pp, tg, proxy, policy, tracker).run(c, rng)
        p, d, t = benchy_metrics(timings, pp, proxy.latency_probe_s)
        pre.append(p)
        dec.append(d)
        ttf.append(t)
        counts = [0] * topo.engines
        for rt in timings:
            counts[rt.backend] += 1
        for k, n in enumerate(counts):
            per_backend[k] += n
        shares.append(max(counts) / max(1, min(counts)) if policy else 1.0)
    return LevelResult(
        concurrency=c, decode_tps=statistics.fmean(dec), decode_std=_std(dec),
        prefill_tps=statistics.fmean(pre), prefill_std=_std(pre),
        ttft_ms=1000 * statistics.fmean(ttf), ttft_std=1000 * _std(ttf), runs=runs,
        backend_requests=per_backend, imbalance=statistics.fmean(shares))


def run_sweep(topology: str | Topology, model: str | ModelProfile, args: EngineArgs,
              concurrency: Sequence[int], pp: int, tg: int, runs: int, seed: int = 0, *,
              hw: HardwareProfile = GB10, proxy: ProxyProfile = LITELLM,
              on_level: Callable[[LevelResult], None] | None = None) -> list[LevelResult]:
    """One LevelResult per concurrency level, in the order given (`on_level` sees each as it lands)."""
    if runs < 1 or pp < 1 or tg < 1 or any(c < 1 for c in concurrency):
        raise UserError("runs, pp, tg and every concurrency level must be at least 1", field="sweep",
                        fix="use positive integers")
    out = []
    for c in concurrency:
        out.append(run_level(topology, model, args, c, pp, tg, runs, seed, hw=hw, proxy=proxy))
        if on_level:
            on_level(out[-1])
    return out
