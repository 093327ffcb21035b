"""A vLLM `--middleware` that lets a server be drained behind a router with no API to take it out (LiteLLM
without its database): once its flag file exists, new generation requests are answered 503 before anything
streams, so the router retries them on another server and cools this one down, while the requests already
running finish. /health, /metrics and everything else still answer, so the drain can be watched.

vLLM 0.32 has no such mode of its own: its SIGTERM drain answers new requests with an empty, aborted 200 stream
(which a router passes on as a finished answer), and /pause holds them. This file is written to the node and
mounted into the container (launch/gate.py); it runs inside vLLM's own Python, so it imports nothing but the
standard library and is named so that nothing of sparkconsole's can shadow it.
"""

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

FLAG = os.environ.get("SPARKCONSOLE_DRAIN_FLAG", "/tmp/sparkconsole-draining")
MODULE = "sparkconsole_drain_gate"          # its name on the node and in vLLM's `--middleware MODULE.DrainGate`
MIDDLEWARE = MODULE + ".DrainGate"
MIDDLEWARE_ARGS = ("--middleware", MIDDLEWARE)
GENERATION_PREFIXES = ("/v1/", "/v2/", "/invocations", "/pooling", "/classify", "/score", "/rerank")
BODY = json.dumps({"error": {"message": "this server is draining for a restart: retry on another",
                             "type": "ServiceUnavailable", "code": 503}}).encode()


class DrainGate:
    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope.get("method") == "POST"
                and scope.get("path", "").startswith(GENERATION_PREFIXES) and os.path.exists(FLAG)):
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                    (b"content-length", str(len(BODY)).encode())]})
            await send({"type": "http.response.body", "body": BODY})
            return
        await self.app(scope, receive, send)
