"""A v2 recipe's readiness, honoured by the launch: how long it waits for the server (the port, then /health), and
then a real inference probe, as sparkrun's: one streamed chat completion (temperature 0, at most 64 tokens) that
counts as ready at its first non-empty text or reasoning delta. 408, 429, 502, 503, 504 and a refused or reset
connection are retried with backoff (2, 4, 8, 16, then 30 s) inside the probe's own budget; anything else, an
empty stream or the budget spent fails the launch, naming the server and what it answered.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence

import httpx

from ..recipes import Readiness

RETRY_STATUS = {408, 429, 502, 503, 504}
POOLING = {"pooling", "embed", "embedding", "score", "reward", "classify"}
MAX_TOKENS = 64


def ready_timeout(readiness: Readiness | None, default: float) -> float:
    """The launch's wait for the servers: the port's budget (the runner's own unless the recipe says) plus the
    health check's."""
    if readiness is None:
        return default
    port = readiness.port_timeout_s if readiness.port_timeout_s is not None else default
    return port + (readiness.health_timeout_s or 0.0)


def generates(argv: Sequence[str]) -> bool:
    """False for a pooling model (`--runner pooling`, `--task embed` …): it answers no chat, so the probe is not
    asked of it (its /health and /v1/models still are)."""
    for i, a in enumerate(argv):
        flag, eq, val = a.partition("=")
        if flag in ("--runner", "--task", "--convert"):
            value = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if value in POOLING:
                return False
    return True


class ProbeFailed(Exception):
    pass


async def inference_probe(url: str, model: str | None, readiness: Readiness) -> float:
    """Seconds until the first generated text; raises ProbeFailed with the reason."""
    budget = readiness.inference_timeout_s if readiness.inference_timeout_s is not None else 1200.0
    deadline = time.monotonic() + (budget if math.isfinite(budget) else 1e9)
    delay, last = 2.0, "no answer"
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=min(budget, 300.0)), trust_env=False) as client:
        if model is None:
            model = await _first_model(client, url)
        body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": readiness.inference_prompt}],
                "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
        while time.monotonic() < deadline:
            try:
                got = await asyncio.wait_for(_stream(client, url, body), max(1.0, deadline - time.monotonic()))
                if got is None:
                    return round(time.monotonic() - t0, 2)
                raise ProbeFailed(got)
            except _Retry as exc:
                last = str(exc)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            except TimeoutError:
                break
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 30.0)
    raise ProbeFailed(f"no generated text within {budget:g} s (last: {last})")


class _Retry(Exception):
    pass


async def _first_model(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        r = await client.get(url + "/v1/models")
        data = r.json().get("data") or []
        return data[0].get("id") if data and isinstance(data[0], dict) else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, object]) -> str | None:
    """None once text arrived; else why it failed for good. Raises _Retry for what is worth another try."""
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code in RETRY_STATUS:
            raise _Retry(f"HTTP {r.status_code}")
        if r.status_code != 200:
            text = (await r.aread()).decode("utf-8", "replace")
            return f"HTTP {r.status_code}: {' '.join(text.split())[:160]}"
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            try:
                event = json.loads(payload)
            except ValueError:
                return f"not a stream event: {payload[:80]}"
            if isinstance(event, dict) and event.get("error"):
                return f"error: {str(event['error'])[:160]}"
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                if any(isinstance(delta.get(k), str) and delta[k] for k in ("content", "reasoning", "reasoning_content")):
                    return None
        return "the stream ended without any text"
