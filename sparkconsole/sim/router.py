"""A simulated router (LiteLLM proxy or vllm-router flavour) in front of simulated vLLM servers.

    python -m sparkconsole.sim.router --flavor litellm --config litellm.yaml [--port 4000]
    python -m sparkconsole.sim.router --flavor vllm-router --worker-urls URL... [--policy random]
    python -m sparkconsole.sim.router --backend URL --backend URL --policy least-busy   (plain form)

Requests are spread with the routing policies of sparkconsole/sim/routing.py (LiteLLM least-busy sees
its in-flight counts late, as the real one does), and the proxy's own cost is added in simulated time:
routing, forwarding, per-chunk relay and completion work queued on one event loop, and a cap on the
requests held open per backend (the experiment's fitted ProxyProfile for LiteLLM; near zero for the
Rust vllm-router). Exposes /health, /health/liveliness, /sim/routes (every routing decision, in order),
/health/readiness, /v1/models, /metrics (the metric names each real router publishes) and /sim/clock.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..errors import UserError
from . import routing
from .experiment import ProxyProfile
from .files import pid_alive, read_json
from .vllm_args import log
from .vllm_metrics import SimClock


@dataclass(frozen=True)
class Overhead:
    """What the proxy's one event loop spends per request and per chunk (simulated seconds)."""
    route_s: float = 0.0          # parse, auth, pick a backend
    forward_s: float = 0.0        # count it in flight, call upstream
    chunk_s: float = 0.0          # relay one streamed chunk
    done_s: float = 0.0           # success callback
    max_inflight_per_backend: int | None = None


def _litellm() -> Overhead:
    # The fitted LiteLLM profile of the headless experiment; read by name so either side can grow fields.
    p = ProxyProfile()
    return Overhead(route_s=getattr(p, "route_s", 0.001), forward_s=getattr(p, "forward_s", 0.001),
                    chunk_s=getattr(p, "chunk_s", 1 / 1500), done_s=getattr(p, "done_s", 0.0005),
                    max_inflight_per_backend=getattr(p, "max_inflight_per_backend", None))


OVERHEADS = {
    "litellm": _litellm(),
    # vllm-router (Rust): +0.5 ms to the first token, ~95k chunks/s (testbed notes)
    "vllm-router": Overhead(route_s=0.0005, chunk_s=1 / 95000),
}
VLLM_ROUTER_POLICIES = {"random": "simple-shuffle", "round_robin": "round-robin", "power_of_two": "least-busy",
                        "cache_aware": "least-busy", "consistent_hash": "simple-shuffle"}


LITELLM_DEFAULT_COOLDOWN_S = 5.0     # LiteLLM's cooldown_time when its config sets none


@dataclass
class Backend:
    url: str            # base, without /v1
    model: str | None   # served model name (None: whatever the client asks for)
    healthy: bool = False
    active: bool = True  # in the router's worker list (vllm-router's /remove_worker takes it out)
    cooled_until: float = 0.0  # LiteLLM: left out after a refused request until then (simulated time)


class SimRouter:
    def __init__(self, backends: list[Backend], *, policy: str, flavor: str, speed: float, host: str, port: int,
                 owner_pid: int | None = None, seed: int | None = None,
                 cooldown_s: float = LITELLM_DEFAULT_COOLDOWN_S) -> None:
        if not backends:
            raise UserError("a router needs at least one backend", field="backends",
                            fix="pass --backend URL (or --worker-urls / a LiteLLM config with model_list)")
        self.backends = backends
        self.policy_name = policy
        self.policy = routing.make_policy(policy, seed=seed)
        self.flavor = flavor
        self.cooldown_s = cooldown_s
        self.cost = OVERHEADS.get(flavor, OVERHEADS["litellm"])
        self.clock = SimClock(speed)
        self.speed = speed
        self.host, self.port = host, port
        self.owner_pid = owner_pid
        # The router's own (possibly late) view of in-flight counts, as the routing module models it.
        make_tracker = getattr(routing, "make_tracker", None)
        self.tracker = make_tracker(policy, len(backends)) if make_tracker else routing.InflightTracker(len(backends))
        self._busy_until = 0.0          # the proxy's single event loop, in simulated time
        cap = self.cost.max_inflight_per_backend
        self._slots = [asyncio.Semaphore(cap) if cap else None for _ in backends]
        self._session: aiohttp.ClientSession | None = None
        self._stop = asyncio.Event()
        # Routing decisions in order (backend index, max_tokens), for /sim/routes: a test can replay exactly
        # the spread this router drew instead of hoping the headless model draws the same.
        self.routes: deque[tuple[int, int | None]] = deque(maxlen=100_000)
        self._metrics()

    def _metrics(self) -> None:
        self.registry = reg = CollectorRegistry()
        if self.flavor == "vllm-router":
            self.m_requests = Counter("vllm_router_requests", "Requests routed.", ["worker"], registry=reg)
            self.m_errors = Counter("vllm_router_request_errors", "Requests that failed.", ["worker"], registry=reg)
            self.m_latency = Histogram("vllm_router_request_duration_seconds", "Request duration.", registry=reg,
                                       buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320))
            self.m_ttft = None
            self.m_health = Gauge("vllm_router_worker_health", "1 healthy, 0 not.", ["worker"], registry=reg)
            self.m_load = Gauge("vllm_router_running_requests", "In-flight requests per worker.", ["worker"], registry=reg)
            self.m_active = Gauge("vllm_router_active_workers", "Workers in the router's list.", registry=reg)
            self.m_active.set_function(lambda: sum(1 for b in self.backends if b.active))
            self.label = "worker"
        else:
            self.m_requests = Counter("litellm_proxy_total_requests_metric", "Requests to the proxy.", ["api_base"],
                                      registry=reg)
            self.m_errors = Counter("litellm_proxy_failed_requests_metric", "Failed requests.", ["api_base"], registry=reg)
            self.m_latency = Histogram("litellm_request_total_latency_metric", "Total latency (seconds).", registry=reg,
                                       buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320))
            self.m_ttft = Histogram("litellm_llm_api_time_to_first_token_metric", "Time to first token (seconds).",
                                    registry=reg, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40))
            self.m_health = Gauge("litellm_deployment_state", "0 healthy, 1 partial outage, 2 outage.", ["api_base"],
                                  registry=reg)
            self.m_load = Gauge("litellm_deployment_in_progress_requests", "In-flight requests per deployment.",
                                ["api_base"], registry=reg)
            self.label = "api_base"

    # ---- proxy cost, in simulated time ----------------------------------------------------------
    async def _spend(self, seconds: float) -> None:
        """Occupy the proxy's one event loop for `seconds` (simulated); callers queue behind each other."""
        now = self.clock.now()
        self._busy_until = max(self._busy_until, now) + seconds
        delay = (self._busy_until - now) / self.speed
        if delay > 0.001:
            await asyncio.sleep(delay)

    # ---- health ----------------------------------------------------------------------------------
    async def _probe(self) -> None:
        assert self._session is not None
        while not self._stop.is_set():
            for b in self.backends:
                try:
                    async with self._session.get(b.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        b.healthy = r.status == 200
                    if b.healthy and b.model is None:
                        # vllm-router learns the served model from its workers
                        async with self._session.get(b.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=2)) as r:
                            data = (await r.json()).get("data") or []
                            b.model = data[0]["id"] if data else None
                except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError, TypeError):
                    b.healthy = False
                if self.flavor == "vllm-router":
                    self.m_health.labels(b.url).set(1 if b.healthy else 0)
                else:
                    self.m_health.labels(b.url).set(0 if b.healthy else 2)
            if self.owner_pid and not pid_alive(self.owner_pid):
                log("simulated cluster is gone; shutting down", "router")
                self._stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 2.0)

    # ---- HTTP ------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.h_health)
        r.add_get("/health/liveliness", self.h_live)
        r.add_get("/health/liveness", self.h_live)
        r.add_get("/health/readiness", self.h_ready)
        r.add_get("/v1/models", self.h_models)
        r.add_get("/metrics", self.h_metrics)
        r.add_get("/sim/clock", self.h_clock)
        r.add_get("/sim/routes", self.h_routes)
        r.add_get("/version", self.h_version)
        r.add_post("/v1/chat/completions", self.h_forward)
        r.add_post("/v1/completions", self.h_forward)
        if self.flavor == "vllm-router":
            r.add_get("/list_workers", self.h_list_workers)
            r.add_post("/remove_worker", self.h_remove_worker)
            r.add_post("/add_worker", self.h_add_worker)
        return app

    # ---- vllm-router's worker API (launch/rolling.py's docstring: the real one's answers) -----------------
    def _worker(self, request: web.Request) -> Backend | None:
        url = _base(request.query.get("url", ""))
        return next((b for b in self.backends if b.url == url), None)

    async def h_list_workers(self, request: web.Request) -> web.Response:
        return web.json_response({"urls": [b.url for b in self.backends if b.active]})

    async def h_remove_worker(self, request: web.Request) -> web.Response:
        b = self._worker(request)
        if b is not None:
            b.active = False
        return web.Response(text=f"Successfully removed worker: {request.query.get('url', '')}")

    async def h_add_worker(self, request: web.Request) -> web.Response:
        url = request.query.get("url", "")
        b = self._worker(request)
        if b is None:
            return web.Response(status=400, text=f"Worker {url} is not one of this simulated router's backends")
        if b.active:
            return web.Response(status=400, text=f"Worker {url} already exists")
        deadline = time.monotonic() + 600
        while not b.healthy:          # the real one waits for the worker's health check too
            if time.monotonic() > deadline:
                return web.Response(status=400, text=f"Timeout waiting for worker {url} to become healthy")
            await asyncio.sleep(0.2)
        b.active = True
        return web.Response(text=f"Successfully added worker: {url}")

    async def h_health(self, request: web.Request) -> web.Response:
        up = [b.url for b in self.backends if b.healthy]
        down = [b.url for b in self.backends if not b.healthy]
        body = {"healthy_endpoints": [{"api_base": u} for u in up], "unhealthy_endpoints": [{"api_base": u} for u in down],
                "healthy_count": len(up), "unhealthy_count": len(down), "simulated": True}
        return web.json_response(body, status=200 if up else 503)

    async def h_live(self, request: web.Request) -> web.Response:
        return web.json_response("I'm alive!")

    async def h_ready(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy", "db": "Not connected", "simulated": True})

    async def h_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": f"{self.flavor}-sim", "simulated": True, "policy": self.policy_name})

    async def h_clock(self, request: web.Request) -> web.Response:
        return web.json_response({"speed": self.speed, "sim_time": self.clock.now(), "simulated": True})

    async def h_routes(self, request: web.Request) -> web.Response:
        return web.json_response({"simulated": True, "backends": [b.url for b in self.backends],
                                  "routes": [{"backend": b, "max_tokens": mt} for b, mt in self.routes]})

    async def h_models(self, request: web.Request) -> web.Response:
        names = sorted({b.model for b in self.backends if b.model})
        return web.json_response({"object": "list", "data": [
            {"id": n, "object": "model", "created": int(time.time()), "owned_by": "sim-router"} for n in names]})

    async def h_metrics(self, request: web.Request) -> web.Response:
        for i, b in enumerate(self.backends):
            self.m_load.labels(b.url).set(self.tracker.true[i])
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _candidates(self, model: str | None) -> list[int]:
        idx = [i for i, b in enumerate(self.backends)
               if b.active and (b.model is None or model is None or b.model == model)]
        if self.flavor == "vllm-router":
            healthy = [i for i in idx if self.backends[i].healthy]
            idx = healthy or idx
        else:
            now = self.clock.now()
            idx = [i for i in idx if self.backends[i].cooled_until <= now] or idx
        return idx

    async def h_forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return web.json_response({"error": {"message": "Invalid JSON body", "code": 400}}, status=400)
        model = body.get("model") if isinstance(body, dict) else None
        if not self._candidates(model):
            return web.json_response({"error": {"message": f"Invalid model name passed in model={model}", "type":
                                                "invalid_request_error", "param": "model", "code": "400"}}, status=400)
        tried: set[int] = set()
        while True:
            resp, pick = await self._attempt(request, body, raw, model, tried)
            refused = isinstance(resp, web.Response) and resp.status >= 500 and not resp.prepared
            if self.flavor == "vllm-router" or not refused:
                return resp
            # LiteLLM cools a refusing deployment down and (weighted failover) re-picks among the others
            self.backends[pick].cooled_until = self.clock.now() + self.cooldown_s
            tried.add(pick)
            if not [i for i in self._candidates(model) if i not in tried]:
                return resp

    async def _attempt(self, request: web.Request, body: object, raw: bytes, model: str | None,
                       tried: set[int]) -> tuple[web.StreamResponse, int]:
        cand = [i for i in self._candidates(model) if i not in tried] or self._candidates(model)
        await self._spend(self.cost.route_s)
        now = self.clock.now()
        view = self.tracker.view(now)
        pick = cand[self.policy.choose([view[i] for i in cand])]
        b = self.backends[pick]
        mt = body.get("max_completion_tokens", body.get("max_tokens")) if isinstance(body, dict) else None
        self.routes.append((pick, mt if isinstance(mt, int) else None))
        t0 = now
        sem = self._slots[pick]
        if sem is not None:
            await sem.acquire()       # the proxy holds extra requests until a connection to that backend frees
        self.tracker.started(pick, self.clock.now())
        self.m_requests.labels(b.url).inc()
        try:
            await self._spend(self.cost.forward_s)
            return await self._relay(request, b, raw, t0), pick
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self.m_errors.labels(b.url).inc()
            return web.json_response({"error": {"message": f"backend {b.url} failed: {str(exc)[:120]}",
                                                "type": "APIConnectionError", "code": "500"}}, status=500), pick
        finally:
            if sem is not None:
                sem.release()
            await self._spend(self.cost.done_s)
            self.tracker.finished(pick, self.clock.now())
            self.m_latency.observe(self.clock.now() - t0)

    async def _relay(self, request: web.Request, b: Backend, raw: bytes, t0: float) -> web.StreamResponse:
        assert self._session is not None
        headers = {"Content-Type": "application/json"}
        if request.headers.get("Authorization"):
            headers["Authorization"] = request.headers["Authorization"]
        async with self._session.post(b.url + request.path, data=raw, headers=headers,
                                      timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as up:
            ctype = up.headers.get("Content-Type", "application/json")
            if not ctype.startswith("text/event-stream"):
                data = await up.read()
                if up.status >= 500:
                    self.m_errors.labels(b.url).inc()
                return web.Response(body=data, status=up.status, headers={"Content-Type": ctype, "X-Sim-Speed": repr(self.speed)})
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": ctype, "Cache-Control": "no-cache",
                                                                 "X-Sim-Speed": repr(self.speed)})
            await resp.prepare(request)
            first = True
            async for line in up.content:
                if line.startswith(b"data:"):
                    await self._spend(self.cost.chunk_s)
                    if first and self.m_ttft is not None:
                        self.m_ttft.observe(self.clock.now() - t0)
                    first = False
                await resp.write(line)
            await resp.write_eof()
            return resp

    # ---- run -------------------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        probe = asyncio.create_task(self._probe())
        try:
            await runner.setup()
            await web.TCPSite(runner, self.host, self.port, reuse_address=True).start()
            log(f"simulated {self.flavor} router on http://{self.host}:{self.port} ({self.policy_name}) -> "
                + ", ".join(b.url for b in self.backends), "router")
            await self._stop.wait()
            return 0
        finally:
            probe.cancel()
            await runner.cleanup()
            await self._session.close()


# ---------------------------------------------------------------------------------------------------
# command lines of the real routers

def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _host_path(path: str, node_dir: Path | None, container: str | None) -> Path:
    """A path as the container sees it, mapped through its bind mounts to this machine."""
    p = Path(path)
    if node_dir and container:
        rec = read_json(node_dir / "containers" / container / "container.json") or {}
        for src, dst, _ in rec.get("mounts", []):
            if path == dst or path.startswith(dst.rstrip("/") + "/"):
                return Path(src + path[len(dst.rstrip("/")):])
    return p


def backends_from_litellm(path: Path) -> tuple[list[Backend], str, float]:
    """The deployments, the routing strategy and the cooldown of a LiteLLM config."""
    from ..yamlsrc import load_file
    doc = load_file(path)
    data = doc.data if isinstance(doc.data, dict) else {}
    out = []
    for i, m in enumerate(data.get("model_list") or []):
        params = (m or {}).get("litellm_params") or {}
        base = params.get("api_base")
        if not isinstance(base, str):
            raise doc.error(("model_list", i, "litellm_params", "api_base"), "no api_base",
                            "write api_base: http://IP:8000/v1")
        out.append(Backend(_base(base), m.get("model_name")))
    rs = data.get("router_settings") or {}
    cooldown = float(rs.get("cooldown_time") or LITELLM_DEFAULT_COOLDOWN_S)
    return out, str(rs.get("routing_strategy") or "simple-shuffle"), cooldown


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sim-router")
    p.add_argument("--flavor", choices=("litellm", "vllm-router"), default="litellm")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int)
    p.add_argument("--backend", action="append", default=[], help="backend base URL (plain form)")
    p.add_argument("--model", help="served model name for plain-form backends")
    p.add_argument("--worker-urls", nargs="+", default=[])
    p.add_argument("--policy", default=None)
    p.add_argument("--config")
    # vllm-router prefill/decode disaggregation: the simulated engines have no KV transfer, so requests
    # go to the decode servers, which prefill themselves.
    p.add_argument("--vllm-pd-disaggregation", action="store_true")
    p.add_argument("--prefill", nargs="+", default=[])
    p.add_argument("--decode", nargs="+", default=[])
    p.add_argument("--sim-exec", action="store_true")
    p.add_argument("--seed", type=int)
    p.add_argument("--sim-speed", type=float)
    p.add_argument("--sim-node-dir")
    p.add_argument("--sim-container")
    p.add_argument("--sim-memory-limit", type=int, default=0)
    ns, unknown = p.parse_known_args(argv)
    if unknown:
        log(f"simulated router ignores arguments: {' '.join(unknown)}", "router", "WARNING")
    node_dir = Path(ns.sim_node_dir) if ns.sim_node_dir else None
    sim = (read_json(node_dir / "sim.json") if node_dir else None) or {}
    speed = float(ns.sim_speed or sim.get("speed") or 1.0)
    address = sim.get("address")
    host: str = address if address and ns.host in ("0.0.0.0", "::") else ns.host
    cooldown = LITELLM_DEFAULT_COOLDOWN_S
    try:
        if ns.flavor == "vllm-router" and (ns.worker_urls or ns.decode):
            backends = [Backend(_base(u), ns.model) for u in (ns.worker_urls or ns.decode)]
            policy = VLLM_ROUTER_POLICIES.get(ns.policy or "random", ns.policy or "simple-shuffle")
            port = ns.port or 30000
        elif ns.config:
            backends, policy, cooldown = backends_from_litellm(_host_path(ns.config, node_dir, ns.sim_container))
            policy = ns.policy or policy
            port = ns.port or 4000
        else:
            backends = [Backend(_base(u), ns.model) for u in ns.backend]
            policy = ns.policy or "simple-shuffle"
            port = ns.port or 4000
        router = SimRouter(backends, policy=policy, flavor=ns.flavor, speed=speed, host=host, port=port,
                           owner_pid=sim.get("owner_pid"), seed=ns.seed, cooldown_s=cooldown)
        code = asyncio.run(router.run())
    except UserError as exc:
        log(f"error: {exc}", "router", "ERROR")
        code = 1
    except OSError as exc:
        log(f"OSError: {exc}", "router", "ERROR")
        code = 1
    if node_dir and ns.sim_container:
        d = node_dir / "containers" / ns.sim_container
        if d.is_dir():
            (d / "exitcode").write_text(f"{code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
