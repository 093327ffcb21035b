"""A small vLLM-like streaming server for the bench tests (real aiohttp HTTP on loopback), with controllable pacing
and failures: slow tokens, a stall mid-stream, malformed SSE, a server error event, a dropped connection, HTTP 500.

It counts prompt tokens with a whitespace tokenizer plus a fixed chat-template overhead, answers /tokenize the
same way, streams one token per event with `token_ids` (every 7th token an empty-content partial-UTF-8 chunk,
as vLLM sends them), then a usage chunk and [DONE]. Imported by the other test_bench_* files.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field

from aiohttp import web

TEMPLATE_OVERHEAD = 5       # tokens the "chat template" adds to every prompt
PER_MESSAGE = 3


def count_prompt(messages: list[dict]) -> int:
    return TEMPLATE_OVERHEAD + sum(PER_MESSAGE + len(str(m.get("content", "")).split()) for m in messages)


@dataclass
class Behaviour:
    token_delay: float = 0.0          # seconds between tokens
    first_delay: float = 0.0          # extra prefill time before the first token
    stall_after: int | None = None    # stop sending (keep the connection open) after this many tokens
    die_after: int | None = None      # drop the connection after this many tokens
    malformed_after: int | None = None
    error_after: int | None = None    # send an {"error": ...} event
    http_status: int = 200
    token_ids: bool = True            # honour return_token_ids
    usage: bool = True                # send the usage chunk
    spaced_json: bool = False         # '": ' separators like Python's json.dumps
    tokenize: bool = True             # expose /tokenize
    sim_speed: float | None = None    # expose /sim/clock {"speed": F}
    fail_every: int | None = None     # every Nth request fails with HTTP 500
    refuse_fields: tuple[str, ...] = ()   # answer HTTP 400 to requests carrying these fields (a strict proxy)


@dataclass
class FakeVllm:
    behaviour: Behaviour = field(default_factory=Behaviour)
    model: str = "fake/model-1"
    version: str = "0.32.0-fake"
    requests: list[dict] = field(default_factory=list)
    inflight: int = 0
    max_inflight: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self, port: int = 0) -> FakeVllm:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/version", self._version)
        app.router.add_get("/sim/clock", self._clock)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, handler_cancellation=True)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", port))
        site = web.SockSite(self._runner, sock)
        await site.start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    def dumps(self, obj: dict) -> str:
        return json.dumps(obj) if self.behaviour.spaced_json else json.dumps(obj, separators=(",", ":"))

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model",
                                                              "max_model_len": 65536}]})

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version})

    async def _clock(self, request: web.Request) -> web.Response:
        if self.behaviour.sim_speed is None:
            raise web.HTTPNotFound()
        return web.json_response({"speed": self.behaviour.sim_speed, "now": time.time()})

    async def _tokenize(self, request: web.Request) -> web.Response:
        if not self.behaviour.tokenize:
            raise web.HTTPNotFound()
        body = await request.json()
        return web.json_response({"count": count_prompt(body["messages"]), "max_model_len": 65536, "tokens": []})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        b = self.behaviour
        body = await request.json()
        self.requests.append(body)
        refused = [f for f in b.refuse_fields if f in body]
        if refused:
            return web.json_response({"error": {"message": f"unsupported parameter: {refused[0]}"}}, status=400)
        if b.http_status != 200 or (b.fail_every and len(self.requests) % b.fail_every == 0):
            return web.json_response({"error": {"message": "boom: engine dead"}}, status=b.http_status
                                     if b.http_status != 200 else 500)
        n = body.get("max_tokens", 16)
        if not body.get("ignore_eos"):
            n = min(n, 8)
        want_ids = body.get("return_token_ids") and b.token_ids
        if not body.get("stream"):
            pt = count_prompt(body["messages"])
            return web.json_response({"id": "chatcmpl-1", "object": "chat.completion", "model": self.model,
                                      "choices": [{"index": 0, "message": {"role": "assistant",
                                                                           "content": " ".join(f"w{i}" for i in range(n))},
                                                   "finish_reason": "length"}],
                                      "usage": {"prompt_tokens": pt, "completion_tokens": n, "total_tokens": pt + n}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": self.model}

            async def send(obj: dict | str) -> None:
                data = obj if isinstance(obj, str) else self.dumps(obj)
                await resp.write(f"data: {data}\n\n".encode())

            if b.first_delay:
                await asyncio.sleep(b.first_delay)
            await send({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None}]})
            for i in range(n):
                if b.stall_after is not None and i == b.stall_after:
                    await asyncio.sleep(3600)
                if b.die_after is not None and i == b.die_after:
                    request.transport.close()
                    return resp
                if b.malformed_after is not None and i == b.malformed_after:
                    await resp.write(b"data: {\"choices\": [{\"delta\": {\"content\": \"x\n\n")
                    await resp.write(b"garbage without a field name\n\n")
                if b.error_after is not None and i == b.error_after:
                    await send({"error": {"object": "error", "message": "KV cache exhausted", "code": 500}})
                    await send("[DONE]")
                    return resp
                if b.token_delay:
                    await asyncio.sleep(b.token_delay)
                content = "" if i % 7 == 6 else f"w{i} "
                choice = {"index": 0, "delta": {"content": content}, "finish_reason": None}
                if want_ids:
                    choice["token_ids"] = [1000 + i]
                await send({**base, "choices": [choice]})
            await send({**base, "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "length",
                                             **({"token_ids": []} if want_ids else {})}]})
            if b.usage:
                pt = count_prompt(body["messages"])
                await send({**base, "choices": [], "usage": {"prompt_tokens": pt, "completion_tokens": n,
                                                             "total_tokens": pt + n}})
            await send("[DONE]")
            await resp.write_eof()
            return resp
        finally:
            self.inflight -= 1
