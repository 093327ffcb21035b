"""Streaming chat-completions client for load generation (aiohttp), built so the client is never the bottleneck.

Each network read is timestamped once; the SSE events inside it are classified with a few byte searches
(token ids present? content non-empty?) instead of `json.loads` per chunk, which halves a Python client's
ceiling (the reference notes, client-ceilings.md). Only the rare chunks a metric needs (the final usage
chunk, an error event) are parsed. Tokens are counted from the server's usage or `token_ids`, never from
chunks: vLLM sends empty-content chunks for partial UTF-8 bytes.

Times are `time.perf_counter()` seconds, unscaled; `bench.metrics` turns them into figures.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

perf = time.perf_counter

# Servers differ in JSON spacing (vLLM: compact; Python json.dumps: '": '), detected once per request.
_COMPACT = (b'"token_ids":[', (b'"content":"', b'"reasoning_content":"', b'"reasoning":"'), b'"usage":{',
            b'"choices":[{')
_SPACED = (b'"token_ids": [', (b'"content": "', b'"reasoning_content": "', b'"reasoning": "'), b'"usage": {',
           b'"choices": [{')
_DATA_OBJ = (b"data: {", b"data:{")
_DONE = (b"data: [DONE]", b"data:[DONE]")


@dataclass
class RequestResult:
    """One streamed request as the client saw it. `token_times` holds one arrival time per generated token."""

    start: float
    end: float = 0.0
    first_response: float | None = None   # first event carrying choices (vLLM: the role chunk)
    first_token: float | None = None      # first event carrying a generated token
    prompt_tokens: int | None = None      # from usage
    completion_tokens: int = 0            # from usage, else token_ids, else one per content event (estimated)
    token_times: list[float] = field(default_factory=list)
    tokens_estimated: bool = False        # no usage and no token_ids: counted one per content event
    error: str | None = None
    status: int | None = None
    stale: bool = False                   # failed writing to a pooled connection the server had closed (retried once)
    last_read: float = 0.0                # arrival of the latest read (the stall watch reads it)

    @property
    def ok(self) -> bool:
        return self.error is None


class StreamError(Exception):
    """A stream the measurement cannot trust (malformed SSE, server error event, no [DONE])."""


def api_base(url: str) -> str:
    """'http://h:8000', 'http://h:8000/', 'http://h:8000/v1' -> 'http://h:8000/v1'."""
    u = url.rstrip("/")
    return u if u.endswith("/v1") else u + "/v1"


def server_root(url: str) -> str:
    u = url.rstrip("/")
    return u[:-3] if u.endswith("/v1") else u


def open_session(max_concurrency: int) -> aiohttp.ClientSession:
    """The session a sweep measures with: enough pooled keep-alive connections for the level in flight plus
    the probes, no session-wide timeout (stream_chat bounds each request), no environment lookups per request."""
    connector = aiohttp.TCPConnector(limit=max_concurrency + 8, force_close=False, keepalive_timeout=600)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


def chat_payload(model: str, messages: Sequence[dict[str, Any]], max_tokens: int, *, exact_tg: bool = True,
                 token_ids: bool = True, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request body, llama-benchy compatible: usage in the stream, exact length via min_tokens + ignore_eos."""
    body: dict[str, Any] = {
        "model": model,
        "messages": list(messages),
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if token_ids:
        body["return_token_ids"] = True
    if exact_tg:
        body["min_tokens"] = max_tokens
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
    return body


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


class StallWatch:
    """One task for every request in flight: ends a stream that went silent, without a timer per read.

    Before its first response chunk a request may wait `first_timeout` (queueing and prefill at high load
    take long); once streaming, `stall_timeout` of silence ends it as stalled.
    """

    def __init__(self, stall_timeout: float = 60.0, first_timeout: float = 600.0) -> None:
        self.stall_timeout, self.first_timeout = stall_timeout, first_timeout
        self._live: dict[int, tuple[RequestResult, aiohttp.ClientResponse]] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, res: RequestResult, resp: aiohttp.ClientResponse) -> None:
        self._live[id(res)] = (res, resp)
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    def forget(self, res: RequestResult) -> None:
        self._live.pop(id(res), None)

    async def _loop(self) -> None:
        period = max(0.05, min(1.0, self.stall_timeout / 4, self.first_timeout / 4))
        while True:
            await asyncio.sleep(period)
            now = perf()
            for key, (res, resp) in list(self._live.items()):
                waiting = res.first_response is None
                limit = self.first_timeout if waiting else self.stall_timeout
                if now - (res.start if waiting else res.last_read) > limit:
                    res.error = (f"no response within {limit:g} s" if waiting
                                 else f"stalled: no data for {limit:g} s")
                    del self._live[key]
                    resp.close()       # the pending read fails; stream_chat keeps the error set here

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


async def stream_chat(session: aiohttp.ClientSession, url: str, body: bytes | dict[str, Any], *,
                      headers: dict[str, str] | None = None, stall_timeout: float | None = 60.0,
                      timeout: float | None = 3600.0, watch: StallWatch | None = None) -> RequestResult:
    """POST one streaming chat completion to `url` (…/v1/chat/completions) and time every token.

    Never raises for a failed request: the error is on the result, so a sweep records it and goes on.
    `timeout` bounds the whole request. Silence is bounded by `watch` (a sweep's shared StallWatch, which
    allows a long wait for the first chunk) or, without one, by `stall_timeout` between any two reads.
    """
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if headers:
        hdrs.update(headers)
    ct = aiohttp.ClientTimeout(total=timeout, sock_connect=30, sock_read=None if watch else stall_timeout)
    res = await _post(session, url, body, hdrs, ct, watch, stall_timeout, timeout)
    if res.status is None and res.stale:
        # The pooled connection was closed by the server before this request reached it: llama.cpp's llama-server
        # ends a kept-alive connection after a streamed answer without saying so. Nothing was received: once more,
        # on a fresh connection.
        res = await _post(session, url, body, hdrs, ct, watch, stall_timeout, timeout)
    return res


async def _post(session: aiohttp.ClientSession, url: str, body: bytes, hdrs: dict[str, str], ct: aiohttp.ClientTimeout,
                watch: StallWatch | None, stall_timeout: float | None, timeout: float | None) -> RequestResult:
    res = RequestResult(start=perf())
    res.last_read = res.start
    try:
        async with session.post(url, data=body, headers=hdrs, timeout=ct) as resp:
            res.status = resp.status
            if resp.status != 200:
                text = (await resp.content.read(4000)).decode("utf-8", "replace")
                res.error = f"HTTP {resp.status}: {_one_line(text)}"
            elif watch is None:
                await _consume(resp.content, res)
            else:
                watch.watch(res, resp)
                try:
                    await _consume(resp.content, res)
                finally:
                    watch.forget(res)
    except (TimeoutError, aiohttp.ServerTimeoutError):
        if res.error is None:
            res.error = (f"stalled: no data for {stall_timeout:g} s" if res.first_response is not None
                         else f"timed out waiting for the server ({timeout:g} s)")
    except aiohttp.ClientPayloadError as exc:
        res.error = res.error or f"connection lost mid-stream ({_one_line(str(exc), 120)})"
    except aiohttp.ClientError as exc:
        res.error = res.error or f"{type(exc).__name__}: {_one_line(str(exc), 160)}"
        # a write to a pooled connection the server had already closed: the request never reached it
        res.stale = res.status is None and isinstance(exc, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError))
    except StreamError as exc:
        res.error = res.error or str(exc)
    except ConnectionError as exc:
        res.error = res.error or f"connection lost ({type(exc).__name__})"
    res.end = perf()
    return res


async def _consume(content: aiohttp.StreamReader, res: RequestResult) -> None:
    times: list[float] = []           # arrival of each event that carried tokens
    multi: dict[int, int] = {}        # event index -> tokens, for events with other than one token
    ids_seen = False
    usage_ev: bytes | None = None
    done = False
    tail = b""
    keys = None
    sep = b"\n\n"
    first_response = None
    readany = content.readany
    ev: bytes | None
    while True:
        block = await readany()
        if not block:
            break
        t = res.last_read = perf()
        if tail:
            block = tail + block
        if keys is None and b"\r\n" in block:
            sep = b"\r\n\r\n"
        cut = block.rfind(sep)
        if cut < 0:
            tail = block
            continue
        tail = block[cut + len(sep):]
        if keys is None:
            # JSON spacing, from the first complete JSON event: vLLM is compact, Python's json.dumps is not.
            first = block.find(b"{", 0, cut)
            if first >= 0:
                end = block.find(sep, first)
                keys = _SPACED if b'": ' in block[first:end] else _COMPACT
        ids_key, text_keys, usage_key, choices_key = keys or _COMPACT
        for ev in block[:cut].split(sep):
            if not ev.startswith(_DATA_OBJ):
                ev = _data_of(ev, sep)
                if ev is None:
                    continue  # comment, keep-alive, event:/id: only
                if ev.startswith(_DONE):
                    done = True
                    continue
                if not ev.startswith(_DATA_OBJ):
                    raise StreamError(f"malformed SSE event: {_one_line(ev[:80].decode('utf-8', 'replace'), 80)!r}")
            if not ev.endswith(b"}"):
                raise StreamError(f"malformed SSE event: {_one_line(ev[:80].decode('utf-8', 'replace'), 80)!r}")
            i = ev.find(ids_key)
            if i >= 0:
                ids_seen = True
                j = i + len(ids_key)
                n = 0 if ev[j:j + 1] == b"]" else ev.count(b",", j, ev.find(b"]", j)) + 1
            else:
                n = 0
                for k in text_keys:
                    i = ev.find(k)
                    if i >= 0:
                        j = i + len(k)
                        if ev[j:j + 1] != b'"':
                            n = 1
                        break
            if n:
                if n != 1:
                    multi[len(times)] = n
                times.append(t)
                if first_response is None:
                    first_response = res.first_response = t
                continue
            if first_response is None and choices_key in ev:
                first_response = res.first_response = t
            if usage_key in ev:
                usage_ev = ev
            elif ev.startswith((b'data: {"error"', b'data:{"error"')):
                raise StreamError(_error_message(ev))
    if tail.strip():
        ev = _data_of(tail.strip(), sep)
        if ev is not None and ev.startswith(_DONE):
            done = True
    if not done:
        raise StreamError("stream ended before data: [DONE]")
    _finish(res, times, multi, ids_seen, usage_ev)


def _data_of(ev: bytes, sep: bytes) -> bytes | None:
    """The slow path: an event with several lines (event:, id:, comments, multi-line data) -> 'data: …' or None."""
    nl = b"\r\n" if sep == b"\r\n\r\n" else b"\n"
    data = [line[5:].lstrip(b" ") for line in ev.split(nl) if line.startswith(b"data:")]
    if not data:
        if all(not line.strip() or line.startswith((b":", b"event:", b"id:", b"retry:")) for line in ev.split(nl)):
            return None
        raise StreamError(f"malformed SSE event: {_one_line(ev[:80].decode('utf-8', 'replace'), 80)!r}")
    return b"data: " + b"\n".join(data)


def _error_message(ev: bytes) -> str:
    try:
        err = json.loads(ev[5:])["error"]
        msg = err.get("message") if isinstance(err, dict) else err
    except (ValueError, KeyError, TypeError, AttributeError):
        msg = ev[:120].decode("utf-8", "replace")
    return f"server error in stream: {_one_line(str(msg), 160)}"


def _finish(res: RequestResult, times: list[float], multi: dict[int, int], ids_seen: bool,
            usage_ev: bytes | None) -> None:
    usage_completion = None
    if usage_ev is not None:
        try:
            usage = json.loads(usage_ev[5:])["usage"]
            pt, ctok = usage.get("prompt_tokens"), usage.get("completion_tokens")
            res.prompt_tokens = pt if isinstance(pt, int) else None
            usage_completion = ctok if isinstance(ctok, int) and ctok >= 0 else None
        except (ValueError, KeyError, TypeError, AttributeError):
            raise StreamError("malformed usage chunk in stream") from None
    observed = len(times) + sum(n - 1 for n in multi.values())
    if usage_completion is not None:
        total = usage_completion
    elif ids_seen:
        total = observed
    else:
        total = observed
        res.tokens_estimated = True
    res.completion_tokens = total
    if not times or total <= 0:
        return
    if (ids_seen or usage_completion is None) and observed == total:
        res.token_times = _spread(times, multi, res.start)
    elif not multi and len(times) == total:
        res.token_times = times
    else:
        res.token_times = _interpolate(times, total)
    res.first_token = res.token_times[0]


def _spread(times: list[float], multi: dict[int, int], start: float) -> list[float]:
    """Expand events that carried n tokens into n times spread since the previous event (gap / n each).

    The first token event's tokens all get its arrival time (llama-benchy 0.4.0 does the same): spreading them
    back towards the request's start would put TTFT before anything arrived — a stalled server that delivers
    the whole answer in one chunk would read as a TTFT of 1/n of the real wait.
    """
    if not multi:
        return times
    out: list[float] = []
    prev = times[0]
    for idx, t in enumerate(times):
        n = multi.get(idx, 1)
        if n == 1:
            out.append(t)
        elif n > 1:
            step = (t - prev) / n
            out.extend(prev + step * (k + 1) for k in range(n))
        prev = t
    return out


def _interpolate(times: list[float], total: int) -> list[float]:
    """Token counts from usage disagree with the events seen: place `total` tokens evenly over the stream."""
    if total == 1 or len(times) == 1:
        return [times[0]] * total if total > 1 else [times[0]]
    first, last = times[0], times[-1]
    step = (last - first) / (total - 1)
    return [first + step * i for i in range(total)]
