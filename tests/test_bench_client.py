"""The streaming client against real HTTP servers on loopback: token counting, timing, and every failure mode."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from sparkconsole.bench.client import chat_payload, stream_chat
from tests.test_bench_helpers import Behaviour, FakeVllm, count_prompt

MSGS = [{"role": "user", "content": "one two three four"}]


async def _one(b: Behaviour, max_tokens: int = 20, *, stall: float = 5.0, token_ids: bool = True):
    srv = await FakeVllm(b).start()
    try:
        async with aiohttp.ClientSession() as s:
            return await stream_chat(s, srv.url + "/v1/chat/completions",
                                     chat_payload(srv.model, MSGS, max_tokens, token_ids=token_ids),
                                     stall_timeout=stall)
    finally:
        await srv.stop()


@pytest.mark.parametrize("spaced", [False, True])
async def test_counts_every_token_including_empty_content_chunks(spaced):
    r = await _one(Behaviour(spaced_json=spaced), 20)
    assert r.ok, r.error
    # Every 7th token is an empty-content chunk that carries only token_ids: they still count.
    assert r.completion_tokens == 20 and len(r.token_times) == 20
    assert r.prompt_tokens == count_prompt(MSGS)
    assert not r.tokens_estimated
    assert r.start <= r.first_response <= r.first_token <= r.token_times[-1] <= r.end
    assert r.token_times == sorted(r.token_times)


async def test_without_token_ids_usage_decides_the_count():
    r = await _one(Behaviour(token_ids=False), 21)
    assert r.ok and r.completion_tokens == 21 and len(r.token_times) == 21
    assert not r.tokens_estimated


async def test_without_usage_or_ids_the_count_is_flagged_estimated():
    r = await _one(Behaviour(token_ids=False, usage=False), 21)
    assert r.ok
    assert r.tokens_estimated
    assert r.completion_tokens == 18      # 3 of 21 chunks had empty content: a chunk count undercounts


async def test_pacing_is_measured():
    delay = 0.02
    r = await _one(Behaviour(token_delay=delay, first_delay=0.15), 12)
    assert r.ok
    span = r.token_times[-1] - r.token_times[0]
    per_token = span / 11
    assert delay * 0.9 <= per_token <= delay * 3
    assert r.first_response - r.start >= 0.15    # prefill delays the role chunk too, as in vLLM
    assert r.first_response <= r.first_token


async def test_stall_mid_stream_is_a_failed_request():
    r = await _one(Behaviour(stall_after=4), 20, stall=0.5)
    assert r.error and r.error.startswith("stalled")
    assert 0.4 <= r.end - r.start < 5


async def test_server_dying_mid_stream_is_a_failed_request():
    r = await _one(Behaviour(die_after=5), 20)
    assert r.error and "connection lost" in r.error


async def test_malformed_sse_is_a_failed_request():
    r = await _one(Behaviour(malformed_after=3), 20)
    assert r.error and r.error.startswith("malformed SSE event")


async def test_error_event_in_stream_is_reported_with_its_message():
    r = await _one(Behaviour(error_after=3), 20)
    assert r.error == "server error in stream: KV cache exhausted"


async def test_http_error_is_reported_on_one_line():
    r = await _one(Behaviour(http_status=503), 20)
    assert r.status == 503 and r.error.startswith("HTTP 503:") and "\n" not in r.error


async def test_refused_connection_is_a_failed_request():
    async with aiohttp.ClientSession() as s:
        r = await stream_chat(s, "http://127.0.0.1:9/v1/chat/completions", chat_payload("m", MSGS, 4))
    assert not r.ok and r.first_token is None


async def _raw_server(chunks: list[bytes], delay: float = 0.0):
    """A raw asyncio HTTP/1.1 server that writes the response in the exact byte pieces given."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0].split(b":")[1])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for c in chunks:
            writer.write(c)
            await writer.drain()
            if delay:
                await asyncio.sleep(delay)
        writer.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def _events(n: int, crlf: bool = False) -> bytes:
    nl = "\r\n" if crlf else "\n"
    sep = nl + nl
    out = [": keep-alive comment" + sep,
           "data: " + json.dumps({"choices": [{"delta": {"role": "assistant", "content": ""}}]},
                                 separators=(",", ":")) + sep]
    for i in range(n):
        ids = [7, 8] if i == 2 else [i]      # one chunk with two tokens (e.g. speculative decoding)
        out.append("data: " + json.dumps({"choices": [{"delta": {"content": f"t{i}"}, "token_ids": ids}]},
                                         separators=(",", ":")) + sep)
    out.append("event: ignored" + nl + "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 9,
                                                                                "completion_tokens": n + 1}},
                                                     separators=(",", ":")) + sep)
    out.append("data: [DONE]" + sep)
    return "".join(out).encode()


@pytest.mark.parametrize("crlf", [False, True])
async def test_events_split_at_any_byte_boundary(crlf):
    body = _events(10, crlf)
    pieces = [body[i:i + 7] for i in range(0, len(body), 7)]     # cuts through lines, keys and separators
    server, url = await _raw_server(pieces, delay=0.0005)
    try:
        async with aiohttp.ClientSession() as s:
            r = await stream_chat(s, url + "/v1/chat/completions", chat_payload("m", MSGS, 11))
    finally:
        server.close()
    assert r.ok, r.error
    assert r.completion_tokens == 11 and len(r.token_times) == 11 and r.prompt_tokens == 9
    assert r.token_times == sorted(r.token_times)


async def test_stream_without_done_is_a_failed_request():
    body = _events(3).replace(b"data: [DONE]\n\n", b"")
    server, url = await _raw_server([body])
    try:
        async with aiohttp.ClientSession() as s:
            r = await stream_chat(s, url + "/v1/chat/completions", chat_payload("m", MSGS, 4))
    finally:
        server.close()
    assert r.error == "stream ended before data: [DONE]"


def test_payload_asks_for_exact_length_usage_and_token_ids():
    p = chat_payload("m", MSGS, 128)
    assert p["max_tokens"] == p["min_tokens"] == 128 and p["ignore_eos"] is True
    assert p["stream"] is True and p["stream_options"] == {"include_usage": True} and p["return_token_ids"]
    q = chat_payload("m", MSGS, 8, exact_tg=False, token_ids=False)
    assert "min_tokens" not in q and "ignore_eos" not in q and "return_token_ids" not in q


async def _watched(b: Behaviour, watch, max_tokens: int = 12):
    srv = await FakeVllm(b).start()
    try:
        async with aiohttp.ClientSession() as s:
            return await stream_chat(s, srv.url + "/v1/chat/completions", chat_payload(srv.model, MSGS, max_tokens),
                                     watch=watch)
    finally:
        watch.close()
        await srv.stop()


async def test_shared_stall_watch_allows_a_long_prefill_but_ends_a_silent_stream():
    from sparkconsole.bench.client import StallWatch
    slow_prefill = await _watched(Behaviour(first_delay=1.0), StallWatch(stall_timeout=0.3, first_timeout=5))
    assert slow_prefill.ok and slow_prefill.first_token - slow_prefill.start >= 1.0
    stalled = await _watched(Behaviour(stall_after=4), StallWatch(stall_timeout=0.3, first_timeout=5))
    assert stalled.error == "stalled: no data for 0.3 s" and stalled.end - stalled.start < 3
    never = await _watched(Behaviour(first_delay=30), StallWatch(stall_timeout=5, first_timeout=0.4))
    assert never.error == "no response within 0.4 s" and never.end - never.start < 3


def test_first_event_tokens_share_its_time_and_decode_counts_tokens_after_it():
    # llama-benchy 0.4.0's rules: a first event carrying n tokens puts all n at its arrival (TTFT is when the
    # first token arrived, not start + wait / n), and decode t/s counts only tokens after the first read.
    from sparkconsole.bench.client import RequestResult, _finish
    from sparkconsole.bench.metrics import request_figures

    res = RequestResult(start=10.0)
    times = [10.4, 10.5, 10.6]                      # first event 3 tokens (a stall), then 1, then 2
    usage = b'data: {"usage":{"prompt_tokens":8,"completion_tokens":6}}'
    _finish(res, times, {0: 3, 2: 2}, True, usage)
    assert res.token_times == pytest.approx([10.4, 10.4, 10.4, 10.5, 10.55, 10.6])
    assert res.first_token == pytest.approx(10.4)
    f = request_figures(res, expected_prompt=8)
    assert f.ttft_s == pytest.approx(0.4)
    assert f.decode_tps == pytest.approx(3 / 0.2)   # 3 tokens after the first read, over 0.2 s
