"""The HTTP face of a simulated `vllm serve`: the routes vLLM answers (/health, /version, /v1/models, /metrics,
/tokenize, /detokenize, chat and text completions, streamed as vLLM streams them) and GET /sim/clock.

`VllmHttpApi` is mixed into `SimVllmServer` (sim/vllm_server.py), which owns the engine, the clock and the
requests; the handlers here only read and write HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..launch import drain_gate
from .engine import RequestRejected
from .tokens import chat_prompt, detokenize, token_ids, word_for
from .vllm_args import SIM_VERSION

if TYPE_CHECKING:
    import argparse

    from .engine import SimEngine
    from .profiles import ModelProfile
    from .vllm_metrics import Metrics, SimClock
    from .vllm_request import Req


class VllmHttpApi:
    """Routes and handlers; the server class provides ns, speed, clock, engine, metrics, served, names, model_arg,
    max_model_len, profile, submit() and abort()."""

    if TYPE_CHECKING:      # what the server class (sim/vllm_server.SimVllmServer) provides
        ns: argparse.Namespace
        speed: float
        clock: SimClock
        engine: SimEngine | None
        metrics: Metrics
        served: str
        names: tuple[str, ...]
        model_arg: str
        max_model_len: int
        profile: ModelProfile
        _engine_t: float

        def submit(self, ids: list[int], body: dict[str, Any]) -> Req: ...

        def abort(self, req: Req) -> None: ...

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.h_health)
        r.add_get("/ping", self.h_health)
        r.add_get("/version", self.h_version)
        r.add_get("/v1/models", self.h_models)
        r.add_get("/metrics", self.h_metrics)
        r.add_get("/sim/clock", self.h_clock)
        r.add_post("/tokenize", self.h_tokenize)
        r.add_post("/detokenize", self.h_detokenize)
        r.add_post("/v1/chat/completions", self.h_chat)
        r.add_post("/v1/completions", self.h_completions)
        return app

    def _closed(self) -> bool:
        """launch/drain_gate.py, loaded as middleware and closed: its own rule (the flag fresh within its lease) on
        the flag in the container's files (the shim empties its tmpfs when the container starts again)."""
        if drain_gate.MIDDLEWARE not in (self.ns.middleware or ()):
            return False
        if not (self.ns.sim_node_dir and self.ns.sim_container):
            return False
        fs = Path(str(self.ns.sim_node_dir)) / "containers" / str(self.ns.sim_container) / "fs"
        return drain_gate.closed(str(fs / drain_gate.FLAG.lstrip("/")))

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        closed = self._closed()
        if closed and drain_gate.generates(request.path):
            resp: web.StreamResponse = self.error("this server is draining for a restart: retry on another", 503,
                                                  "ServiceUnavailable")
            resp.headers[drain_gate.HEADER] = "closed"
            return resp
        key = self.ns.api_key or os.environ.get("VLLM_API_KEY")
        if key and request.path.startswith("/v1/") and request.headers.get("Authorization", "") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        resp = await handler(request)
        if not resp.prepared:
            resp.headers["X-Sim-Speed"] = repr(self.speed)
            if closed:
                resp.headers[drain_gate.HEADER] = "closed"
        return resp

    @staticmethod
    def error(message: str, status: int = 400, kind: str = "BadRequestError", param: str | None = None) -> web.Response:
        return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                                 status=status)

    async def h_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def h_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": SIM_VERSION, "simulated": True, "profile": self.profile.name})

    async def h_clock(self, request: web.Request) -> web.Response:
        return web.json_response({"speed": self.speed, "sim_time": self.clock.now(), "simulated": True,
                                  "engine_lag_s": max(0.0, self._engine_t - self.clock.now())})

    async def h_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": self.model_arg, "parent": None, "max_model_len": self.max_model_len,
            "permission": []} for name in self.names]})

    async def h_metrics(self, request: web.Request) -> web.Response:
        if self.engine:
            self.metrics.running.set(self.engine.running)
            self.metrics.waiting.set(self.engine.waiting)
            self.metrics.kv_usage.set(self.engine.kv_usage)
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise web.HTTPBadRequest(text=json.dumps({"error": {"message": "Invalid JSON body", "type": "BadRequestError",
                                                                "param": None, "code": 400}}),
                                     content_type="application/json") from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text='{"error": {"message": "body must be a JSON object", "code": 400}}',
                                     content_type="application/json")
        return body

    def _model_ok(self, body: dict[str, Any]) -> web.Response | None:
        model = body.get("model")
        if model is not None and model not in self.names:
            return self.error(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
        return None

    async def h_tokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if (bad := self._model_ok(body)) is not None:
            return bad
        if isinstance(body.get("messages"), list):
            text = chat_prompt(body["messages"], body.get("add_generation_prompt", True))
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return self.error("tokenize needs 'prompt' (text) or 'messages'")
        ids = token_ids(text)
        return web.json_response({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids})

    async def h_detokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        toks = body.get("tokens")
        if not isinstance(toks, list):
            return self.error("detokenize needs 'tokens'")
        return web.json_response({"prompt": detokenize(toks)})

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if (bad := self._model_ok(body)) is not None:
            return bad
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return self.error("'messages' must be a non-empty list", param="messages")
        ids = token_ids(chat_prompt(msgs))
        return await self._generate(request, body, ids, chat=True)

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if (bad := self._model_ok(body)) is not None:
            return bad
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1:
            p = p[0]
        if isinstance(p, str):
            ids = token_ids(p)
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            ids = list(p)
        else:
            return self.error("'prompt' must be a text or a list of token ids", param="prompt")
        return await self._generate(request, body, ids, chat=False)

    async def _generate(self, request: web.Request, body: dict[str, Any], ids: list[int], *, chat: bool) -> web.StreamResponse:
        if not self.engine:
            return self.error("engine not ready", 503, "ServiceUnavailableError")
        try:
            req = self.submit(ids, body)
        except RequestRejected as exc:
            return self.error(str(exc))
        def head(obj: str) -> dict[str, Any]:       # vLLM's answer's first keys, in its order
            return {"id": ("chatcmpl-" if chat else "cmpl-") + req.rid, "object": obj, "created": int(time.time()),
                    "model": self.served}
        if not body.get("stream"):
            return await self._whole(req, head("chat.completion" if chat else "text_completion"), chat)
        return await self._stream(request, req, head("chat.completion.chunk" if chat else "text_completion"), chat,
                                  body.get("stream_options") or {})

    async def _whole(self, req: Req, head: dict[str, Any], chat: bool) -> web.Response:
        """A non-streaming answer: every token, then one JSON body."""
        produced = 0
        try:
            while not req.done:
                n, _, _ = await req.queue.get()
                produced += n
        except asyncio.CancelledError:
            self.abort(req)
            raise
        text = _text_of(req, 0, produced).lstrip()
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                              "tool_calls": []}, "logprobs": None,
                      "finish_reason": req.finish_reason, "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": req.finish_reason,
                      "stop_reason": None}
        return web.json_response({**head, "choices": [choice], "usage": _usage(req, produced)},
                                 headers={"X-Sim-Speed": repr(self.speed)})

    async def _stream(self, request: web.Request, req: Req, head: dict[str, Any], chat: bool,
                      opts: dict[str, Any]) -> web.StreamResponse:
        """Server-sent events as vLLM sends them: a chunk per engine output, the usage if asked, then [DONE]."""
        include_usage = bool(opts.get("include_usage"))
        continuous = bool(opts.get("continuous_usage_stats"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache", "X-Sim-Speed": repr(self.speed)})
        await resp.prepare(request)

        def chunk(choices: list[dict[str, Any]], u: dict[str, Any] | None = None) -> bytes:
            d = dict(head, choices=choices)
            if u is not None:
                d["usage"] = u
            return b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"

        produced = 0
        try:
            while True:
                n, finished, _ = await req.queue.get()
                if chat and produced == 0:
                    # vLLM sends the role chunk with the first engine output, not before the prefill
                    await resp.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}],
                                           _usage(req, 0) if continuous else None))
                text = _text_of(req, produced, n)
                produced += n
                fr = req.finish_reason if finished else None
                if chat:
                    ch = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": fr}
                else:
                    ch = {"index": 0, "text": text, "logprobs": None, "finish_reason": fr, "stop_reason": None}
                await resp.write(chunk([ch], _usage(req, produced) if continuous else None))
                if finished:
                    break
            if include_usage:
                await resp.write(chunk([], _usage(req, produced)))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.abort(req)
            raise
        return resp


def _usage(req: Req, done: int) -> dict[str, Any]:
    """The usage block of an answer with `done` tokens generated."""
    u: dict[str, Any] = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + done,
                         "completion_tokens": done}
    if req.cached_tokens:
        u["prompt_tokens_details"] = {"cached_tokens": req.cached_tokens}
    return u


def _text_of(req: Req, start: int, n: int) -> str:
    """Tokens start … start+n of the request's answer, as words (sim/tokens.py)."""
    return "".join(" " + word_for(req.key, i) for i in range(start, start + n))

