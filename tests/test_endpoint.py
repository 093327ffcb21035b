"""serving.endpoint: real aiohttp servers on 127.0.0.1 answering like vLLM, LiteLLM — or down, slow, broken."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
from aiohttp import web

from sparkconsole.config import ClusterConfig, EndpointConfig, NodeConfig
from sparkconsole.serving import metrics as m
from sparkconsole.serving import prom
from sparkconsole.serving.endpoint import EndpointMonitor, ServingMonitor, backoff_s
from tests.helpers import free_port
from tests.test_serving_metrics import VllmExporter, fixture, seeded_workload

MODEL = "openai/gpt-oss-120b"


class Server:
    """A real HTTP server on loopback; `routes` maps path → async handler; hits counts requests per path."""

    def __init__(self, routes: dict):
        self.routes = routes
        self.hits: dict[str, int] = {}
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> Server:
        app = web.Application()
        for path, handler in self.routes.items():
            app.router.add_get(path, self._counted(path, handler))
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    def _counted(self, path, handler):
        async def wrapped(request):
            self.hits[path] = self.hits.get(path, 0) + 1
            return await handler(request)
        return wrapped

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


def vllm_routes(exp: VllmExporter, *, health_status: int = 200, metrics=None) -> dict:
    async def health(_):
        return web.Response(status=health_status, text="" if health_status == 200 else "engine dead")

    async def models(_):
        return web.json_response({"object": "list", "data": [
            {"id": MODEL, "object": "model", "owned_by": "vllm", "root": MODEL, "max_model_len": 4096}]})

    async def version(_):
        return web.json_response({"version": "0.32.0"})

    async def metrics_text(_):
        return web.Response(text=exp.text(), content_type="text/plain")

    return {"/health": health, "/v1/models": models, "/version": version, "/metrics": metrics or metrics_text}


def ep(url: str, kind: str = "vllm", name: str = "spark1") -> EndpointConfig:
    return EndpointConfig(name=name, url=url, kind=kind)


async def test_healthy_vllm_snapshot():
    exp = seeded_workload(VllmExporter("v1"))
    async with Server(vllm_routes(exp)) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.2)
        try:
            s = await mon.poll()
        finally:
            await mon.stop()
    assert s.healthy is True and s.state == "UP" and s.error is None and s.warning is None
    assert (s.model, s.max_model_len, s.version) == (MODEL, 4096, "0.32.0")
    assert (s.running, s.waiting) == (8, 3) and s.kv_usage == pytest.approx(0.41)
    assert 0.2 < s.prefix_hit_rate < 0.3
    assert s.generation_tokens == 40 * 128
    assert s.gen_tps is None and s.ttft_p50_s is None      # one scrape: no window yet
    assert mon.latest is s and list(mon.history) == [s]


async def test_rates_and_window_percentiles_from_changing_counters():
    exp, rng = VllmExporter("v1"), random.Random(4)
    exp.serve(rng, 20, ttft_s=0.03, itl_s=0.01)
    async with Server(vllm_routes(exp)) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.2)
        try:
            t0 = time.monotonic()
            await mon.poll()
            t1 = time.monotonic()
            exp.serve(rng, 6, ttft_s=1.2, itl_s=0.06, prompt_tokens=900, gen_tokens=50)
            await asyncio.sleep(0.3)
            t2 = time.monotonic()
            s = await mon.poll()
            t3 = time.monotonic()
        finally:
            await mon.stop()
    assert 6 * 50 / (t3 - t0) <= s.gen_tps <= 6 * 50 / (t2 - t1)
    assert 6 * 900 / (t3 - t0) <= s.prompt_tps <= 6 * 900 / (t2 - t1)
    assert 1.0 <= s.ttft_p50_s <= 2.5 and s.ttft_p95_s >= s.ttft_p50_s   # the window, not the fast past
    assert 0.05 <= s.itl_p50_s <= 0.075


async def test_simulated_server_rates_are_in_its_own_seconds():
    """A simulated server running 4× real time says so in X-Sim-Speed; rates are per simulated second."""
    exp, rng = VllmExporter("v1"), random.Random(6)

    async def metrics(_):
        return web.Response(text=exp.text(), headers={"X-Sim-Speed": "4.0"})
    async with Server(vllm_routes(exp, metrics=metrics)) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.2)
        try:
            t0 = time.monotonic()
            await mon.poll()
            t1 = time.monotonic()
            exp.serve(rng, 4, gen_tokens=100)
            await asyncio.sleep(0.3)
            t2 = time.monotonic()
            s = await mon.poll()
            t3 = time.monotonic()
        finally:
            await mon.stop()
    assert s.time_scale == 4.0
    assert 400 / (t3 - t0) / 4 <= s.gen_tps <= 400 / (t2 - t1) / 4


async def test_down_endpoint_is_one_line_and_backs_off():
    url = f"http://127.0.0.1:{free_port()}"
    mon = EndpointMonitor(ep(url), interval=0.05)
    seen: list[float] = []
    unsub = mon.subscribe(lambda m: seen.append(time.monotonic()))
    try:
        await mon.start()
        await asyncio.sleep(0.6)
    finally:
        await mon.stop()
    unsub()
    s = mon.latest
    assert s.healthy is False and s.state == "DOWN"
    assert "refused" in s.error and "\n" not in s.error
    assert len(seen) == 1          # next try only after backoff_s(0.05) = 5 s
    assert backoff_s(0.05) == 5 and backoff_s(4) == 8 and backoff_s(60) == 30


async def test_healthy_endpoint_polls_at_the_interval():
    exp = seeded_workload(VllmExporter("v1"))
    async with Server(vllm_routes(exp)) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.1)
        try:
            await mon.start()
            await asyncio.sleep(0.75)
        finally:
            await mon.stop()
        assert 3 <= srv.hits["/health"] <= 9
        assert srv.hits["/v1/models"] == 1          # info is re-read every 30 s, not every poll


async def test_slow_server_times_out():
    answered = []

    async def slow(_):
        await asyncio.sleep(3)
        answered.append(True)
        return web.Response(text="ok")
    async with Server({"/health": slow}) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.2, timeout=0.3)
        try:
            s = await mon.poll()
            gave_up_first = not answered        # the poll ended on its timeout, before the server's answer
        finally:
            await mon.stop()
    assert s.healthy is False and "timed out" in s.error
    assert gave_up_first


async def test_a_version_read_that_timed_out_is_tried_again_soon():
    """Under load one /version read can time out while /health and /v1/models answer: the version is read again a
    couple of seconds later (not a whole INFO_REFRESH_S), and a model already known is kept meanwhile."""
    from sparkconsole.serving import endpoint as endpoint_mod
    exp = seeded_workload(VllmExporter("v1"))
    routes = vllm_routes(exp)
    answer_version = routes["/version"]
    stall = {"version": 1}

    async def version(request):
        if stall["version"]:
            stall["version"] -= 1
            await asyncio.sleep(2)          # past the monitor's timeout
        return await answer_version(request)
    routes["/version"] = version
    async with Server(routes) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.2, timeout=1.0)
        try:
            first = await mon.poll()
            assert (first.model, first.version) == (MODEL, None)
            assert srv.hits["/version"] == 1
            second = await mon.poll()                       # at once: not yet time to retry
            assert srv.hits["/version"] == 1 and second.model == MODEL
            t0 = time.monotonic()
            # polled until the version is read (a poll whose /health misses its timeout on a loaded machine reads
            # nothing else), for at most a third of the refresh interval: "soon" is well before a refresh
            while srv.hits["/version"] < 2 and time.monotonic() - t0 < endpoint_mod.INFO_REFRESH_S / 3:
                await asyncio.sleep(0.2)
                third = await mon.poll()
        finally:
            await mon.stop()
    assert srv.hits["/version"] == 2 and (third.model, third.version) == (MODEL, "0.32.0")
    assert endpoint_mod.INFO_RETRY_S < endpoint_mod.INFO_REFRESH_S / 5


async def test_unhealthy_status_carries_the_reason():
    exp = seeded_workload(VllmExporter("v1"))
    async with Server(vllm_routes(exp, health_status=503)) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.2)
        try:
            s = await mon.poll()
        finally:
            await mon.stop()
    assert s.healthy is False and s.error == "HTTP 503 from /health: engine dead"
    assert s.running == 8        # metrics still read: they help explain the failure


async def test_garbage_metrics_keep_the_endpoint_up_with_a_warning():
    async def html(_):
        return web.Response(text="<html><body>Bad gateway</body></html>", content_type="text/html")
    exp = VllmExporter("v1")
    async with Server(vllm_routes(exp, metrics=html)) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.2)
        try:
            s = await mon.poll()
        finally:
            await mon.stop()
    assert s.healthy is True and s.model == MODEL
    assert s.running is None and s.ttft_p50_s is None
    assert "unreadable" in s.warning


async def test_oversized_metrics_are_refused():
    async def huge(_):
        return web.Response(body=b"x 1\n" * (3 * 1024 * 1024))
    exp = VllmExporter("v1")
    async with Server(vllm_routes(exp, metrics=huge)) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.2)
        try:
            s = await mon.poll()
        finally:
            await mon.stop()
    assert s.healthy is True and s.running is None and "larger than" in s.warning


async def test_recovery_after_restart_with_counter_reset():
    exp = seeded_workload(VllmExporter("v1"))
    port = free_port()
    mon = EndpointMonitor(ep(f"http://127.0.0.1:{port}"), interval=0.2)

    async def serve(exporter):
        app = web.Application()
        for path, h in vllm_routes(exporter).items():
            app.router.add_get(path, h)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    try:
        runner = await serve(exp)
        assert (await mon.poll()).healthy
        await runner.cleanup()
        down = await mon.poll()
        assert down.healthy is False and down.failures == 1
        assert down.model == MODEL and down.version == "0.32.0"     # what it served last, for context
        fresh, rng = VllmExporter("v1"), random.Random(9)     # restarted server: counters from zero
        fresh.serve(rng, 2, gen_tokens=30)
        runner = await serve(fresh)
        up = await mon.poll()
        await runner.cleanup()
    finally:
        await mon.stop()
    assert up.healthy and up.failures == 0 and up.model == MODEL
    assert up.gen_tps is not None and up.gen_tps > 0       # never negative after the reset
    assert up.generation_tokens == 60


async def test_litellm_router_uses_liveliness_and_follows_the_metrics_redirect():
    async def alive(_):
        return web.Response(text="\"I'm alive!\"")

    async def health_needs_key(_):
        return web.json_response({"error": "Authentication Error"}, status=401)

    async def metrics_redirect(_):
        raise web.HTTPTemporaryRedirect("/metrics/")

    async def metrics(_):
        return web.Response(text=fixture("metrics-litellm.txt"))

    async def models_needs_key(_):
        return web.json_response({"error": "Authentication Error"}, status=401)

    routes = {"/health/liveliness": alive, "/health": health_needs_key, "/metrics": metrics_redirect,
              "/metrics/": metrics, "/v1/models": models_needs_key}
    async with Server(routes) as srv:
        mon = EndpointMonitor(ep(srv.url, kind="router", name="router"), interval=0.2)
        try:
            s = await mon.poll()
        finally:
            await mon.stop()
        assert "/health" not in srv.hits          # LiteLLM's /health would send real completions
    assert s.healthy is True
    assert (s.backends_up, s.backends_total) == (1, 2)
    assert "needs an API key" in s.warning


async def test_vllm_router_metrics_on_their_own_port():
    async def ok(_):
        return web.Response(text="")
    async def rmetrics(_):
        return web.Response(text=fixture("metrics-vllm-router.txt"))
    async with Server({"/health": ok}) as router, Server({"/metrics": rmetrics}) as metrics_server:
        mon = EndpointMonitor(ep(router.url, kind="router"), interval=0.2, metrics_url=metrics_server.url + "/metrics")
        try:
            s = await mon.poll()
        finally:
            await mon.stop()
    assert s.healthy and (s.backends_up, s.backends_total) == (1, 2)
    assert dict(s.backend_load)["http://127.0.0.1:8001"] == 5


async def test_serving_monitor_fans_out():
    exp = seeded_workload(VllmExporter("v1"))
    async with Server(vllm_routes(exp)) as srv:
        cfg = ClusterConfig(nodes=(NodeConfig(name="spark1", address="127.0.0.1"),),
                            endpoints=(ep(srv.url, name="a"), ep(f"http://127.0.0.1:{free_port()}", name="b")))
        sm = ServingMonitor(cfg, interval=0.2)
        got: list[str] = []
        sm.subscribe(lambda mon: got.append(mon.name))
        try:
            snaps = await sm.poll()
        finally:
            await sm.stop()
        assert snaps["a"].healthy is True and snaps["b"].healthy is False
        assert sorted(got) == ["a", "b"]
        assert set(sm.snapshots()) == {"a", "b"}
        try:                                   # stopped, then started again: polls still work
            await sm.start()
            await asyncio.sleep(0.3)
        finally:
            await sm.stop()
    assert sm.endpoints["a"].latest.healthy is True and sm.endpoints["a"].latest.error is None


async def test_a_failing_subscriber_does_not_stop_polling():
    exp = seeded_workload(VllmExporter("v1"))
    async with Server(vllm_routes(exp)) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.05)
        mon.subscribe(lambda m: 1 / 0)
        try:
            await mon.start()
            # three polls, each one's subscriber raising (0.15 s idle; up to 10 s on a loaded CI machine)
            deadline = time.monotonic() + 10
            while len(mon.history) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await mon.stop()
    assert len(mon.history) >= 3 and mon.latest.healthy


@pytest.mark.slow
async def test_real_vllm_server(vllm_server):
    """The monitor against a real vLLM (CPU build, tiny model): identity, then counters moving with real requests."""
    from tests.testbed.vllm import chat

    mon = EndpointMonitor(ep(vllm_server.url), interval=0.5)
    try:
        before = await mon.poll()
        n, max_tokens = 3, 16
        for _ in range(n):    # ignore_eos: exactly max_tokens each
            await asyncio.to_thread(chat, vllm_server.url, vllm_server.model.name, "Hello there", max_tokens=max_tokens)
        after = await mon.poll()
    finally:
        await mon.stop()
    assert before.healthy and before.error is None and before.warning is None
    assert before.model == vllm_server.model.name and before.max_model_len == 2048
    assert before.version and before.version[0].isdigit()
    assert before.kv_usage is not None and before.running == 0
    assert after.generation_tokens - before.generation_tokens == n * max_tokens
    assert after.gen_tps > 0 and after.prompt_tps > 0
    assert after.ttft_p50_s is not None and after.ttft_p50_s <= after.ttft_p95_s
    assert after.itl_p50_s is not None


async def test_recorded_vllm_page_served_over_http():
    """The /metrics page recorded from a real vLLM 0.32, served as it was: the snapshot carries its figures."""
    text = next(p for p in (Path(__file__).parent / "fixtures").glob("metrics-vllm-0.32*-recorded.txt")).read_text()

    async def page(_):
        return web.Response(text=text, content_type="text/plain")
    exp = VllmExporter("v1")
    async with Server(vllm_routes(exp, metrics=page)) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.2)
        try:
            s = await mon.poll()
        finally:
            await mon.stop()
    want = m.engine_metrics(prom.parse(text))
    assert s.healthy and s.warning is None
    assert (s.running, s.waiting, s.kv_usage, s.generation_tokens) == (
        want.running, want.waiting, want.kv_usage, want.generation_tokens)
    assert s.generation_tokens > 0
