"""SGLang's and llama.cpp's /metrics in the console: the engine figures (serving/metrics.py), the endpoint panel's
snapshot over real HTTP (serving/endpoint.py), the silent-stall alert (alerts.py) and the exporter.

SGLang's page is the one SGLang's documentation records (tests/fixtures/metrics-sglang-docs.txt, its source in the
file's header: SGLang's CPU build cannot run here, docs/TESTBED.md). llama.cpp's is a real llama-server's, recorded
on the test bed (tests/fixtures/metrics-llamacpp-recorded.txt); the live one is read in tests/test_llamacpp.py."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from sparkconsole.alerts import AlertEngine
from sparkconsole.config import Thresholds
from sparkconsole.serving import metrics as m
from sparkconsole.serving import prom
from sparkconsole.serving.endpoint import EndpointMonitor
from tests.test_endpoint import Server, ep

FIXTURES = Path(__file__).parent / "fixtures"
SGLANG = (FIXTURES / "metrics-sglang-docs.txt").read_text()
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def test_sglang_names_map_onto_the_engine_figures():
    s = prom.parse(SGLANG, only=m.CONSOLE_NAMES)
    e = m.engine_metrics(s)
    assert s.bad_lines == 0
    assert (e.running, e.waiting, e.kv_usage) == (162.0, 2826.0, 0.28)
    assert e.prefix_hit_rate == 0.007507552643049313                   # its cache_hit_rate gauge
    assert (e.prompt_tokens, e.generation_tokens) == (8.128902e6, 7.557572e6)
    assert e.models == (MODEL,)
    # TTFT: 11008 requests, 2513 of them within 30 s: the median is past the last finite bucket (Prometheus' rule)
    assert e.ttft is not None and e.ttft.observations == 11008 and e.pct("ttft", 0.5) == 30.0
    assert 0.02 < e.pct("ttft", 0.00005) < 0.04                         # the first request's bucket: 20-40 ms
    # time per output token (SGLang's ITL): 4.95M of 7.40M under 0.1 s, 0.43M under 0.075 s
    assert 0.075 < e.pct("itl", 0.5) < 0.1
    # the same page through the parser unfiltered gives the same figures
    assert m.engine_metrics(prom.parse(SGLANG)) == e


def test_a_later_sglang_name_for_itl_is_read_too():
    renamed = SGLANG.replace("sglang:time_per_output_token_seconds", "sglang:inter_token_latency_seconds")
    e = m.engine_metrics(prom.parse(renamed, only=m.CONSOLE_NAMES))
    assert e.itl is not None and 0.075 < e.pct("itl", 0.5) < 0.1


def test_llamacpp_names_map_onto_the_engine_figures():
    text = (FIXTURES / "metrics-llamacpp-recorded.txt").read_text()
    s = prom.parse(text, only=m.CONSOLE_NAMES)
    e = m.engine_metrics(s)
    assert s.bad_lines == 0 and e.runtime == "llama.cpp"
    assert (e.running, e.waiting, e.prompt_tokens, e.generation_tokens) == (0, 0, 22, 8)
    # llama-server publishes no KV usage, prefix hits or latency histograms: shown as unknown, never as zero
    assert (e.kv_usage, e.prefix_hit_rate, e.ttft, e.itl) == (None, None, None, None)
    assert m.engine_metrics(prom.parse(text)) == e


def sglang_routes(text: str) -> dict:
    async def health(_):
        return web.Response(text="")

    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "sglang",
                                                              "root": MODEL, "max_model_len": 131072}]})

    async def page(_):
        return web.Response(text=text, content_type="text/plain")
    return {"/health": health, "/v1/models": models, "/metrics": page}


async def test_endpoint_panel_shows_sglang_and_a_stall_of_its_counters_is_a_silent_stall():
    async with Server(sglang_routes(SGLANG)) as srv:
        mon = EndpointMonitor(ep(srv.url), interval=0.2)
        try:
            first = await mon.poll()
            again = await mon.poll()
        finally:
            await mon.stop()
    assert first.healthy and first.warning is None and first.model == MODEL and first.runtime == "SGLang"
    assert (first.running, first.waiting, first.kv_usage) == (162.0, 2826.0, 0.28)
    assert first.generation_tokens == 7.557572e6 and first.prompt_tokens == 8.128902e6
    assert srv.hits["/health"] == 2 and srv.hits["/metrics"] == 2
    # the same counters poll after poll while 162 requests run: SGLang made no token
    assert again.gen_tps == 0 and again.prompt_tps == 0
    t = Thresholds()
    eng = AlertEngine(t, clock=lambda: 0.0)
    assert eng.observe_endpoint(replace(again, time=1000.0), gpu_power_w=12.0) == []
    fired = eng.observe_endpoint(replace(again, time=1000.0 + t.stall_seconds + 1), gpu_power_w=12.0)
    assert [(a.key, a.severity) for a in fired] == [("endpoint:spark1:stall", "bad")]
    assert "162 request(s) running, no new tokens" in fired[0].message


def test_the_exporter_publishes_sglangs_figures(monkeypatch):
    from prometheus_client import CollectorRegistry, generate_latest

    from sparkconsole.exporter.collector import ConsoleCollector
    from sparkconsole.serving.endpoint import EndpointSnapshot
    from tests.test_exporter import replayed_readings, samples

    em = m.engine_metrics(prom.parse(SGLANG))
    snap = EndpointSnapshot("spark1", "http://127.0.0.1:30000", "vllm", time.time(), True, MODEL, None, em.running,
                            em.waiting, em.kv_usage, em.prefix_hit_rate, None, None, em.pct("ttft", 0.5),
                            em.pct("ttft", 0.95), em.pct("itl", 0.5), em.pct("itl", 0.95), None,
                            generation_tokens=em.generation_tokens, prompt_tokens=em.prompt_tokens)
    readings = replayed_readings(FIXTURES / "agent-h100-idle.jsonl")
    monkeypatch.setattr(readings, "endpoint_snapshots", lambda: [snap])
    registry = CollectorRegistry()
    registry.register(ConsoleCollector(readings))
    s = samples(generate_latest(registry).decode())
    e = (("endpoint", "spark1"),)
    assert (s[("sparkconsole_endpoint_requests_running", e)], s[("sparkconsole_endpoint_requests_waiting", e)]) == (
        162, 2826)
    assert s[("sparkconsole_endpoint_kv_cache_usage_ratio", e)] == 0.28
    assert s[("sparkconsole_endpoint_generation_tokens_total", e)] == 7.557572e6
