"""A vLLM `--middleware` that lets a server be drained behind a router with no API to take it out (LiteLLM
without its database): once its flag file exists, new generation requests are answered 503 before anything
streams, so the router retries them on another server and cools this one down, while the requests already
running finish. /health, /metrics and everything else still answer, so the drain can be watched; while it is
closed every answer carries `X-Sparkconsole-Drain: closed`, which `recipe status` and the console read.

What it refuses is what starts work on the engine, by path (GENERATING, read from vLLM 0.32's own routes: its
`build_app` with every task, tests/test_rolling_restart.py lists them again and fails on one not sorted here),
under `--root-path` too, and every websocket (vLLM's /v1/realtime). What it lets through: tokenizing, rendering,
cancelling and aborting requests, LoRA adapters, sleep / pause / weights, health, metrics.

The flag closes the server only while it is fresh: the roll that closed it touches it every LEASE_S / 3 seconds
(launch/rolling.py), so a roll that is gone without a word (a killed console) leaves a server that opens again by
itself LEASE_S later. The flag lives on a tmpfs of the container's own (launch/gate.py mounts it), which Docker
empties when the container starts again: `docker restart` opens it too.

vLLM 0.32 has no such mode of its own: its SIGTERM drain answers new requests with an empty, aborted 200 stream
(which a router passes on as a finished answer), and /pause holds them. This file is written to the node and
mounted into the container (launch/gate.py); it runs inside vLLM's own Python, so it imports nothing but the
standard library and is named so that nothing of sparkconsole's can shadow it.
"""

import json
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

FLAG_DIR = "/run/sparkconsole-drain"        # the container's own tmpfs (launch/gate.py): emptied by a restart
FLAG = os.environ.get("SPARKCONSOLE_DRAIN_FLAG", FLAG_DIR + "/closed")
LEASE_S = 30.0                              # a flag not touched for this long is a roll that is gone: open
MODULE = "sparkconsole_drain_gate"          # its name on the node and in vLLM's `--middleware MODULE.DrainGate`
MIDDLEWARE = MODULE + ".DrainGate"
MIDDLEWARE_ARGS = ("--middleware", MIDDLEWARE)
HEADER = "x-sparkconsole-drain"             # "closed" on every answer while the gate is closed
# The paths vLLM 0.32 serves that start work on the engine (generation, pooling, transcription), and /generate
# (vLLM's older api_server, SGLang).
GENERATING = frozenset({
    "/v1/chat/completions", "/v1/chat/completions/batch", "/v1/completions", "/v1/responses", "/v1/messages",
    "/v1/systemone", "/generative_scoring", "/inference/v1/generate", "/generate", "/invocations",
    "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/embeddings", "/v2/embed", "/pooling", "/classify",
    "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/cohere/v2/chat",
})
BODY = json.dumps({"error": {"message": "this server is draining for a restart: retry on another",
                             "type": "ServiceUnavailable", "code": 503}}).encode()


def closed(flag: str | None = None) -> bool:
    """Whether the gate is closed: its flag (FLAG unless given) exists and was touched within LEASE_S."""
    try:
        touched = os.stat(flag or FLAG).st_mtime
    except OSError:
        return False
    return time.time() - touched < LEASE_S


def reopen_command(node: str, container: str) -> str:
    """What an operator types to open a closed server at once (here, beside FLAG: the console shows it without
    importing the launch layer)."""
    return f"docker exec {container} rm -f {FLAG} (on {node})"


def generates(path: str, root_path: str = "") -> bool:
    """Whether a request to `path` starts work on the engine (under `--root-path` as well as without it)."""
    if root_path and path.startswith(root_path):
        path = path[len(root_path):]
    return (path.rstrip("/") or "/") in GENERATING


class DrainGate:
    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not closed():
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":        # a realtime session is generation: refused before it is accepted
            await receive()
            await send({"type": "websocket.close", "code": 1013, "reason": "draining for a restart"})
            return
        if generates(scope.get("path", ""), scope.get("root_path", "")):
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                    (HEADER.encode(), b"closed"), (b"content-length", str(len(BODY)).encode())]})
            await send({"type": "http.response.body", "body": BODY})
            return

        async def marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (HEADER.encode(), b"closed")]}
            await send(message)
        await self.app(scope, receive, marked)
