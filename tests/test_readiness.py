"""A v2 recipe's readiness probe against a real HTTP server on loopback (aiohttp): ready at the first streamed text,
retried on 503 within its budget, failed on a refusal or an empty stream; a pooling model is not asked to chat."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from sparkconsole.launch.readiness import ProbeFailed, generates, inference_probe, ready_timeout
from sparkconsole.recipes import Readiness


async def serve(behaviour):
    calls = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        calls.append(body)
        kind = behaviour(len(calls))
        if isinstance(kind, int):
            return web.Response(status=kind, text="no")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for delta in kind:
            event = {"choices": [{"index": 0, "delta": delta}]}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}", calls


@pytest.mark.parametrize("behaviour, ok, words", [
    (lambda n: [{"role": "assistant", "content": ""}, {"content": "ready"}], True, None),
    (lambda n: 503 if n < 3 else [{"reasoning_content": "thinking"}], True, None),
    (lambda n: 400, False, "HTTP 400"),
    (lambda n: [{"role": "assistant", "content": ""}], False, "ended without any text"),
])
def test_the_probe(behaviour, ok, words, monkeypatch):
    real_sleep = asyncio.sleep
    monkeypatch.setattr("sparkconsole.launch.readiness.asyncio.sleep", lambda s: real_sleep(0))   # no backoff wait

    async def go():
        runner, url, calls = await serve(behaviour)
        try:
            if ok:
                assert await inference_probe(url, None, Readiness(inference_timeout_s=30, inference_prompt="hi")) >= 0
                assert calls[-1]["model"] == "m" and calls[-1]["stream"] and calls[-1]["messages"][0]["content"] == "hi"
            else:
                with pytest.raises(ProbeFailed, match=words):
                    await inference_probe(url, "m", Readiness(inference_timeout_s=30))
        finally:
            await runner.cleanup()
    asyncio.run(go())


def test_budgets_and_pooling_models():
    assert ready_timeout(None, 1800) == 1800
    assert ready_timeout(Readiness(port_timeout_s=60, health_timeout_s=30), 1800) == 90
    assert ready_timeout(Readiness(health_timeout_s=30), 1800) == 1830
    assert not generates(["vllm", "serve", "m", "--runner", "pooling"])
    assert not generates(["vllm", "serve", "m", "--task=embed"])
    assert generates(["vllm", "serve", "m", "--max-model-len", "4096"])
