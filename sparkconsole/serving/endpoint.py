"""Serving endpoints (vLLM servers and routers): poll /health, /v1/models, /version, /metrics; publish snapshots.

One EndpointMonitor per endpoint, one asyncio task each. A poll that fails makes a snapshot with
healthy=False and the error in one line, then waits min(max(2×interval, 5), 30) s before the next try (as
Dolphie does), so a dead server is not hammered. Token rates come from counter deltas over the last few
seconds; TTFT/ITL percentiles from histogram bucket deltas over a trailing window (`latency_window_s`), so
they describe recent requests, not the server's whole life.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx

from ..config import ClusterConfig, EndpointConfig
from ..subscribers import Subscribers
from . import metrics as m
from . import prom
from .http import FetchError, Reply, fetch, make_client

log = logging.getLogger(__name__)

# What launch/drain_gate.py adds to every answer while it is closed (it imports nothing of sparkconsole's, so the
# name is written twice: tests/test_rolling_restart.py holds them equal).
DRAIN_HEADER = "x-sparkconsole-drain"
# /v1/models and /version change only on a relaunch: re-read them this often (and after every recovery).
INFO_REFRESH_S = 30.0
# ...but a read that got no answer at all (timed out, reset) is tried again this soon, not a whole refresh later.
INFO_RETRY_S = 2.0


@dataclass(frozen=True)
class EndpointSnapshot:
    name: str
    url: str
    kind: str                              # vllm | router
    time: float                            # time.time() when the poll finished
    healthy: bool | None                   # None: not polled yet
    model: str | None
    version: str | None
    running: float | None
    waiting: float | None
    kv_usage: float | None                 # 0..1
    prefix_hit_rate: float | None          # 0..1, recent window (lifetime when the window saw no queries)
    prompt_tps: float | None
    gen_tps: float | None
    ttft_p50_s: float | None               # recent window; None when no request finished its first token in it
    ttft_p95_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    error: str | None                      # why it is unhealthy, one line
    # Additions beyond the contract (all optional):
    max_model_len: int | None = None
    models: tuple[str, ...] = ()
    generation_tokens: float | None = None  # lifetime counters: the alert engine's stall detector follows them
    prompt_tokens: float | None = None
    health_latency_s: float | None = None
    warning: str | None = None             # healthy, but part of the data is missing (e.g. /metrics 401)
    failures: int = 0                      # consecutive failed polls
    requests_per_s: float | None = None    # routers
    errors_per_s: float | None = None
    backends_up: int | None = None
    backends_total: int | None = None
    backend_load: tuple[tuple[str, float], ...] = ()      # routers: (backend, in-flight requests)
    backend_requests: tuple[tuple[str, float], ...] = ()  # routers: (backend, requests since start)
    latency_p50_s: float | None = None     # routers: request duration
    latency_p95_s: float | None = None
    time_scale: float = 1.0                # a simulated server running N× real time (its X-Sim-Speed header)
    # disaggregation, on the side that receives the KV cache (decode): lifetime, and per transfer in the window
    kv_in_bytes: float | None = None       # bytes moved in, since start
    kv_transfers: float | None = None      # transfers in, since start
    kv_bytes_per_transfer: float | None = None   # recent window (latency window): mean bytes per transfer
    kv_xfer_p50_s: float | None = None     # recent window: time per transfer
    kv_external_share: float | None = None  # recent window: share of prompt tokens that arrived, not computed
    runtime: str | None = None             # vLLM | SGLang | llama.cpp, from its /metrics names (None: unknown)
    drain_closed: bool = False             # its drain gate is closed (launch/drain_gate.py's header on /health)

    @property
    def state(self) -> str:
        """UP | DOWN | UNKNOWN — for a status column."""
        return "UNKNOWN" if self.healthy is None else ("UP" if self.healthy else "DOWN")


def backoff_s(interval: float) -> float:
    return min(max(2 * interval, 5.0), 30.0)


def _empty(ep: EndpointConfig, *, healthy: bool | None, error: str | None, t: float) -> EndpointSnapshot:
    return EndpointSnapshot(name=ep.name, url=ep.url, kind=ep.kind, time=t, healthy=healthy, model=None, version=None,
                            running=None, waiting=None, kv_usage=None, prefix_hit_rate=None, prompt_tps=None,
                            gen_tps=None, ttft_p50_s=None, ttft_p95_s=None, itl_p50_s=None, itl_p95_s=None, error=error)


def _sim_speed(headers: Mapping[str, str]) -> float:
    try:
        speed = float(headers.get("x-sim-speed", 1.0))
    except (TypeError, ValueError):
        return 1.0
    return speed if 0 < speed < 1e6 else 1.0


def _per(rate: float | None, scale: float) -> float | None:
    return None if rate is None else rate / scale


def _q(h: prom.Histogram | None, q: float) -> float | None:
    return h.quantile(q) if h is not None and h.observations > 0 else None


class EndpointMonitor:
    """Polls one endpoint. `latest` and `history` hold snapshots; subscribers get this monitor after each poll."""

    def __init__(self, ep: EndpointConfig, interval: float = 1.0, *, client: httpx.AsyncClient | None = None,
                 history: int = 600, timeout: float | None = None, metrics_url: str | None = None,
                 rate_window_s: float = 5.0, latency_window_s: float = 30.0) -> None:
        self.config = ep
        self.name = ep.name
        self.interval = max(0.05, float(interval))
        self.timeout = timeout if timeout is not None else min(5.0, max(1.0, 2 * self.interval))
        self.metrics_url = metrics_url or f"{ep.url}/metrics"
        self.rate_window_s = rate_window_s
        self.latency_window_s = max(latency_window_s, rate_window_s)
        self.latest: EndpointSnapshot | None = None
        self.history: deque[EndpointSnapshot] = deque(maxlen=history)
        self._client = client
        self._own_client = client is None
        self._task: asyncio.Task[None] | None = None
        self._subs: Subscribers[EndpointMonitor] = Subscribers("endpoint")
        self._scrapes: deque[prom.Scrape] = deque()      # recent successful scrapes (monotonic time)
        self._info: tuple[str | None, tuple[str, ...], int | None, str | None] = (None, (), None, None)
        self._info_at = -INFO_REFRESH_S
        self._health_path: str | None = None
        self._failures = 0
        self._closed = False

    # --- publishing ---------------------------------------------------------------------------------------
    def subscribe(self, cb: Callable[[EndpointMonitor], None]) -> Callable[[], None]:
        return self._subs.add(cb)

    def _publish(self, snap: EndpointSnapshot) -> None:
        self.latest = snap
        self.history.append(snap)
        self._subs.notify(self)            # one bad subscriber must not stop the polling

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        if self._client is None:
            self._client = make_client(self.timeout)
            self._own_client = True
        self._task = asyncio.create_task(self._run(), name=f"endpoint:{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            snap = await self.poll()
            wait = backoff_s(self.interval) if not snap.healthy else self.interval
            await asyncio.sleep(max(0.0, wait - (time.monotonic() - started)))

    # --- one poll -----------------------------------------------------------------------------------------
    async def poll(self) -> EndpointSnapshot:
        """Poll once, publish and return the snapshot (also usable without start(), e.g. `status`)."""
        if self._client is None:
            self._client = make_client(self.timeout)
            self._own_client = True
        try:
            snap = await self._poll(self._client)
        except Exception as exc:  # never let a surprise kill the poller; show it instead
            log.exception("endpoint poll failed")
            text = " ".join(f"internal error: {type(exc).__name__}: {exc}".split())[:200]
            snap = _empty(self.config, healthy=False, error=text, t=time.time())
        self._failures = 0 if snap.healthy else self._failures + 1
        snap = replace(snap, failures=self._failures)
        self._publish(snap)
        return snap

    async def _health(self, client: httpx.AsyncClient) -> tuple[bool, str | None, float | None]:
        """(healthy, why not, seconds); whether the drain gate said it is closed is kept in self._closed."""
        base = self.config.url
        # LiteLLM's /health needs the master key and sends a real completion to every backend; its
        # liveliness probe does not. vllm-router and vLLM answer /health.
        paths = [self._health_path] if self._health_path else (
            ["/health/liveliness", "/health"] if self.config.kind == "router" else ["/health"])
        reply: Reply | None = None
        for path in paths:
            reply = await fetch(client, base + path, limit=65536, timeout=self.timeout)
            if reply.status != 404:
                self._health_path = path
                break
        assert reply is not None
        self._closed = reply.headers.get(DRAIN_HEADER) == "closed"
        if reply.ok:
            return True, None, reply.seconds
        body = " ".join(reply.text.split())[:120]
        return False, f"HTTP {reply.status} from {self._health_path or paths[-1]}" + (f": {body}" if body else ""), reply.seconds

    async def _refresh_info(self, client: httpx.AsyncClient) -> str | None:
        """Served model(s), max_model_len, server version; returns a warning or None."""
        models_r, version_r = await asyncio.gather(
            fetch(client, self.config.url + "/v1/models", limit=1 << 20, timeout=self.timeout),
            fetch(client, self.config.url + "/version", limit=65536, timeout=self.timeout),
            return_exceptions=True)
        models: tuple[str, ...]
        model, models, max_len, version, warn = None, (), None, None, None
        # A read with no answer keeps what the last answer said; an HTTP answer (a 404 /version on a router) counts.
        last_model, last_models, last_max_len, last_version = self._info
        if not isinstance(models_r, Reply):
            model, models, max_len = last_model, last_models, last_max_len
        if not isinstance(version_r, Reply):
            version = last_version
        if isinstance(models_r, Reply) and models_r.ok:
            data = models_r.json()
            items = data.get("data") if isinstance(data, dict) else None
            if isinstance(items, list):
                ids = [i["id"] for i in items if isinstance(i, dict) and isinstance(i.get("id"), str)]
                models = tuple(ids)
                model = ids[0] if ids else None
                first = next((i for i in items if isinstance(i, dict)), {})
                ml = first.get("max_model_len")
                max_len = ml if isinstance(ml, int) and not isinstance(ml, bool) else None
        elif isinstance(models_r, Reply):
            warn = f"/v1/models: HTTP {models_r.status}" + (" (needs an API key)" if models_r.status in (401, 403) else "")
        else:
            warn = f"/v1/models: {models_r}"
        if isinstance(version_r, Reply) and version_r.ok:
            d = version_r.json()
            v = d.get("version") if isinstance(d, dict) else None
            version = v if isinstance(v, str) else None
        self._info = (model, models, max_len, version)
        answered = isinstance(models_r, Reply) and isinstance(version_r, Reply)
        self._info_at = time.monotonic() - (0.0 if answered else INFO_REFRESH_S - INFO_RETRY_S)
        return warn

    def _window_base(self, span: float, now: float) -> prom.Scrape | None:
        """The newest kept scrape at least `span` seconds older than now (else the oldest one)."""
        older = [s for s in self._scrapes if s.time < now]
        if not older:
            return None
        for s in reversed(older):
            if now - s.time >= span:
                return s
        return older[0]

    async def _poll(self, client: httpx.AsyncClient) -> EndpointSnapshot:
        ep = self.config
        try:
            healthy, error, latency = await self._health(client)
        except FetchError as exc:
            self._info_at = -INFO_REFRESH_S      # re-read models/version once it is back
            model, models, max_len, version = self._info   # what it served last: context for the DOWN row
            return replace(_empty(ep, healthy=False, error=str(exc), t=time.time()), model=model, models=models,
                           max_model_len=max_len, version=version)

        need_info = time.monotonic() - self._info_at >= INFO_REFRESH_S or (healthy and self._failures)
        info_task = asyncio.ensure_future(self._refresh_info(client)) if need_info else None
        scrape, metrics_warn, scale = await self._scrape(client)
        warning = await info_task if info_task is not None else None
        warning = "; ".join(w for w in (warning, metrics_warn) if w) or None
        model, models, max_len, version = self._info

        snap = _empty(ep, healthy=healthy, error=error, t=time.time())
        snap = replace(snap, model=model, models=models, max_model_len=max_len, version=version,
                       health_latency_s=latency, warning=warning, drain_closed=self._closed)
        if scrape is None:
            return snap
        rate_base = self._window_base(self.rate_window_s, scrape.time)
        lat_base = self._window_base(self.latency_window_s, scrape.time)
        self._scrapes.append(scrape)
        while self._scrapes and scrape.time - self._scrapes[0].time > self.latency_window_s + 2 * backoff_s(self.interval):
            self._scrapes.popleft()
        snap = _with_engine(snap, scrape, scale, rate_base, lat_base)
        return _with_router(snap, scrape, scale, rate_base, lat_base)

    async def _scrape(self, client: httpx.AsyncClient) -> tuple[prom.Scrape | None, str | None, float]:
        """(its /metrics page parsed, or None; what was wrong with it; a simulator's clock speed, else 1.0)."""
        try:
            reply = await fetch(client, self.metrics_url, timeout=self.timeout)
        except FetchError as exc:
            return None, f"/metrics: {exc}", 1.0
        if not reply.ok:
            return None, f"/metrics: HTTP {reply.status}", 1.0
        scrape = prom.parse(reply.text, time=time.monotonic(), only=m.CONSOLE_NAMES)
        warn = f"/metrics: {scrape.bad_lines} unreadable line(s) skipped" if scrape.bad_lines else None
        return scrape, warn, _sim_speed(reply.headers)


def _with_engine(snap: EndpointSnapshot, scrape: prom.Scrape, scale: float, rate_base: prom.Scrape | None,
                 lat_base: prom.Scrape | None) -> EndpointSnapshot:
    """An engine's figures: its queue and KV cache now, its token rates over the rate window, its latencies, prefix
    hits and KV transfers over the latency window (none before a window has a scrape at its start)."""
    em = m.engine_metrics(scrape)
    prompt_tps = gen_tps = None
    hit_rate = em.prefix_hit_rate
    ttft = itl = None
    kv: dict[str, Any] = {}
    if rate_base is not None:
        rw = m.engine_window(rate_base, scrape)
        # A simulated server's counters run `scale`× faster than the console's clock: rates in its seconds.
        prompt_tps, gen_tps = _per(rw.prompt_tps, scale), _per(rw.gen_tps, scale)
    if lat_base is not None:
        lw = m.engine_window(lat_base, scrape)
        ttft, itl = lw.ttft, lw.itl
        kv = {"kv_bytes_per_transfer": lw.kv_bytes_per_transfer, "kv_xfer_p50_s": _q(lw.kv_xfer, 0.5),
              "kv_external_share": lw.external_share}
        if lw.prefix_hit_rate is not None:
            hit_rate = lw.prefix_hit_rate
    return replace(snap, model=snap.model or (em.models[0] if em.models else None), running=em.running,
                   waiting=em.waiting, kv_usage=em.kv_usage, prefix_hit_rate=hit_rate, prompt_tps=prompt_tps,
                   gen_tps=gen_tps, ttft_p50_s=_q(ttft, 0.5), ttft_p95_s=_q(ttft, 0.95), itl_p50_s=_q(itl, 0.5),
                   itl_p95_s=_q(itl, 0.95), generation_tokens=em.generation_tokens, time_scale=scale,
                   prompt_tokens=em.prompt_tokens, kv_in_bytes=em.kv_in_bytes, kv_transfers=em.kv_transfers,
                   runtime=em.runtime, **kv)


def _with_router(snap: EndpointSnapshot, scrape: prom.Scrape, scale: float, rate_base: prom.Scrape | None,
                 lat_base: prom.Scrape | None) -> EndpointSnapshot:
    """A router's figures, where the page is a router's: requests and errors per second, its backends, its
    latencies, and the TTFT it measures when no engine figure gave one."""
    rm = m.router_metrics(scrape)
    if rm is None:
        return snap
    rps = eps = None
    if rate_base is not None:
        rwin = m.router_window(rate_base, scrape)
        rps, eps = _per(rwin.requests_per_s, scale), _per(rwin.errors_per_s, scale)
    lw = m.router_window(lat_base, scrape) if lat_base is not None else None
    lat = lw.latency if lw is not None else None
    snap = replace(snap, requests_per_s=rps, errors_per_s=eps, backends_up=rm.backends_up,
                   backends_total=rm.backends_total, backend_load=rm.backend_load,
                   backend_requests=rm.backend_requests,
                   latency_p50_s=_q(lat, 0.5), latency_p95_s=_q(lat, 0.95))
    if snap.ttft_p50_s is None and lw is not None:
        snap = replace(snap, ttft_p50_s=_q(lw.ttft, 0.5), ttft_p95_s=_q(lw.ttft, 0.95))
    return snap


class ServingMonitor:
    """Every endpoint of the cluster file, polled concurrently over one shared HTTP client."""

    def __init__(self, config: ClusterConfig, interval: float = 1.0, *, history: int = 600) -> None:
        self.config = config
        self.interval = interval
        self._history = history
        self._timeout = min(5.0, max(1.0, 2 * interval))
        self._client = make_client(self._timeout)
        self._started = False
        self._subs: Subscribers[EndpointMonitor] = Subscribers("serving")
        self.endpoints: dict[str, EndpointMonitor] = {ep.name: self._monitor(ep) for ep in config.endpoints}

    def _monitor(self, ep: EndpointConfig) -> EndpointMonitor:
        mon = EndpointMonitor(ep, self.interval, client=self._client, history=self._history, timeout=self._timeout,
                              metrics_url=ep.metrics_url)
        mon.subscribe(self._subs.notify)
        return mon

    async def follow(self, wanted: Iterable[EndpointConfig]) -> tuple[list[str], list[str], list[str]]:
        """Poll exactly `wanted` from now on (nodes/launches.served_endpoints: the cluster file's endpoints, moved
        to where launches serve). An endpoint whose URL changed starts afresh. Returns (added, moved, removed)."""
        by_name = {ep.name: ep for ep in wanted}
        added: list[str] = []
        moved: list[str] = []
        removed: list[str] = []
        for name in [n for n in self.endpoints if n not in by_name]:
            await self.endpoints.pop(name).stop()
            removed.append(name)
        for name, ep in by_name.items():
            old = self.endpoints.get(name)
            if old is not None and old.config == ep:
                continue
            if old is not None:
                await old.stop()
            self.endpoints[name] = mon = self._monitor(ep)
            (moved if old is not None else added).append(name)
            if self._started:
                await self._start_endpoint(name, mon)
        return added, moved, removed

    def subscribe(self, cb: Callable[[EndpointMonitor], None]) -> Callable[[], None]:
        """cb(endpoint_monitor) after any endpoint's poll; returns unsubscribe."""
        return self._subs.add(cb)

    def snapshots(self) -> dict[str, EndpointSnapshot | None]:
        return {name: mon.latest for name, mon in self.endpoints.items()}

    async def poll(self) -> dict[str, EndpointSnapshot]:
        """Poll every endpoint once, concurrently (headless `status`)."""
        snaps = await asyncio.gather(*(mon.poll() for mon in self.endpoints.values()))
        return dict(zip(self.endpoints, snaps, strict=False))

    async def start(self) -> None:
        if self._client.is_closed:      # started again after stop(): a fresh shared client
            self._client = make_client(self._timeout)
            for mon in self.endpoints.values():
                mon._client, mon._own_client = self._client, False
        self._started = True
        for name, mon in self.endpoints.items():
            await self._start_endpoint(name, mon)

    async def _start_endpoint(self, name: str, mon: EndpointMonitor) -> None:
        await mon.start()

    async def stop(self) -> None:
        self._started = False
        await asyncio.gather(*(mon.stop() for mon in self.endpoints.values()))
        await self._client.aclose()
