"""How many requests and token events per second the bench client sustains on one core, beside llama-benchy.

    .venv/bin/python benchmarks/bench_client.py [--benchy-python PATH] [--concurrency 64,256] [--duration 4] [--smoke]

A raw-asyncio OpenAI-compatible streaming server (one token per SSE event, each event its own HTTP chunk, as
vLLM sends them, with token_ids and a final usage chunk) runs in its own process pinned to one core and answers
at line rate; each client runs in its own process pinned to the other core, keeps `c` requests in flight for
`--duration` seconds, and reports requests/s, token events/s and its CPU time per token event. The server's
CPU use is printed beside each figure, to show it was not the limit. Clients measured in the same run:

- sparkconsole: `sparkconsole.bench.client.stream_chat` (aiohttp, one timestamp per read, byte searches per event)
- llama-benchy: `llama_benchy.client.LLMClient.run_generation` 0.4.0, from its own venv (`--benchy-python`)
- aiohttp-lines: `async for line in resp.content`, counting `data:` lines, no JSON (the library's line ceiling)

`--paced` makes the server write one event per loop iteration (fewer events share a read, as with a real
server that paces tokens), an upper bound on per-event cost. Targets: ≥ 2× llama-benchy's token-event rate
at c64 and c256, and under 20 µs of client CPU per token event.

This file runs under both interpreters: it imports sparkconsole only in the sparkconsole worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time

TOKENS = 512
MODEL = "bench/line-rate"


# ---------------------------------------------------------------------------------------------- the server
def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _response_events(tokens: int, token_ids: bool) -> list[bytes]:
    head = b'{"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"' + MODEL.encode() + b'",'
    events = [_chunk(b"data: " + head + b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                     b'"logprobs":null,"finish_reason":null}]}\n\n')]
    for i in range(tokens):
        ids = b',"token_ids":[%d]' % (1000 + i % 5000) if token_ids else b""
        events.append(_chunk(b"data: " + head + b'"choices":[{"index":0,"delta":{"content":" tok%d"},'
                             b'"logprobs":null,"finish_reason":null%s}]}\n\n' % (i, ids)))
    events.append(_chunk(b"data: " + head + b'"choices":[],"usage":{"prompt_tokens":12,"total_tokens":%d,'
                         b'"completion_tokens":%d}}\n\n' % (12 + tokens, tokens)))
    events.append(_chunk(b"data: [DONE]\n\n"))
    events.append(b"0\r\n\r\n")
    return events


async def _serve(port: int, paced: bool) -> None:
    cache: dict[tuple[int, bool], tuple[bytes, list[bytes]]] = {}
    models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
    head_sse = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: keep-alive\r\n\r\n")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, _, rest = head.partition(b"\r\n")
                length = 0
                for h in rest.split(b"\r\n"):
                    if h[:15].lower() == b"content-length:":
                        length = int(h[15:])
                body = await reader.readexactly(length) if length else b""
                path = line.split(b" ")[1]
                if path.endswith(b"/models"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(models), models))
                    continue
                if path == b"/stats":
                    s = json.dumps({"cpu_s": time.process_time()}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(s), s))
                    continue
                req = json.loads(body)
                key = (int(req.get("max_tokens") or TOKENS), bool(req.get("return_token_ids")))
                if key not in cache:
                    ev = _response_events(*key)
                    cache[key] = (head_sse + b"".join(ev), ev)
                whole, events = cache[key]
                if paced:
                    writer.write(head_sse)
                    for e in events:
                        writer.write(e)
                        await asyncio.sleep(0)
                else:
                    writer.write(whole)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


# ---------------------------------------------------------------------------------------------- the clients
async def _drive(one, concurrency: int, duration: float) -> dict:
    """Keep `concurrency` requests in flight for `duration` s; `one()` returns the tokens a request counted."""
    counts = {"requests": 0, "events": 0, "errors": 0}
    deadline = time.perf_counter() + duration

    async def worker() -> None:
        while time.perf_counter() < deadline:
            n = await one()
            if n is None:
                counts["errors"] += 1
            else:
                counts["requests"] += 1
                counts["events"] += n

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {**counts, "wall_s": wall, "cpu_s": cpu}


async def _worker(kind: str, url: str, concurrency: int, duration: float, tokens: int) -> dict:
    import aiohttp
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        if kind == "sparkconsole":
            from sparkconsole.bench.client import chat_payload, stream_chat
            body = json.dumps(chat_payload(MODEL, [{"role": "user", "content": "hello"}], tokens)).encode()

            async def one():
                r = await stream_chat(session, url + "/v1/chat/completions", body)
                return r.completion_tokens if r.ok and len(r.token_times) == r.completion_tokens else None
        elif kind == "llama-benchy":
            from llama_benchy.client import LLMClient
            client = LLMClient(url + "/v1", "EMPTY", MODEL, exact_tg=True)

            async def one():
                r = await client.run_generation(session, context_text="", prompt_text="hello", max_tokens=tokens,
                                                no_cache=False)
                return r.total_tokens if not r.error else None
        elif kind == "aiohttp-lines":
            body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": True,
                               "max_tokens": tokens}).encode()

            async def one():
                n = 0
                async with session.post(url + "/v1/chat/completions", data=body,
                                        headers={"Content-Type": "application/json"}) as resp:
                    async for line in resp.content:
                        if line.startswith(b"data:"):
                            n += 1
                return n - 3       # role, usage and [DONE] carry no token
        else:
            raise SystemExit(f"unknown client {kind}")
        await _drive(one, min(concurrency, 8), 0.3)          # warm the connection pool and the code paths
        return await _drive(one, concurrency, duration)


# ---------------------------------------------------------------------------------------------- orchestration
def _pin(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if _have_taskset() and os.cpu_count() and os.cpu_count() > 1 else []


def _have_taskset() -> bool:
    return any(os.access(os.path.join(p, "taskset"), os.X_OK) for p in os.environ.get("PATH", "").split(os.pathsep))


def _server_cpu(url: str) -> float:
    import urllib.request
    with urllib.request.urlopen(url + "/stats", timeout=10) as r:
        return json.loads(r.read())["cpu_s"]


def _default_benchy_python() -> str:
    if os.environ.get("BENCHY_PYTHON"):
        return os.environ["BENCHY_PYTHON"]
    root = os.environ.get("SPARKCONSOLE_TESTBED_CACHE") or os.path.expanduser("~/.cache/sparkconsole-testbed")
    testbed = os.path.join(root, "venvs", "llama-benchy-0.4.0", "bin", "python")
    return testbed if os.access(testbed, os.X_OK) else "/tmp/benchy-venv/bin/python"


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _run_client(python: str, kind: str, url: str, c: int, duration: float, tokens: int, cpu: int) -> dict:
    cmd = [*_pin(cpu), python, os.path.abspath(__file__), "--worker", kind, "--url", url, "-c", str(c),
           "--duration", str(duration), "--tokens", str(tokens)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration * 10 + 120, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{kind} worker failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", "-c", default="64,256")
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--repeat", type=int, default=2, help="runs per client and level; the best is reported")
    ap.add_argument("--benchy-python", default=_default_benchy_python(),
                    help="python of a venv with llama-benchy==0.4.0 (default: $BENCHY_PYTHON, else the test bed's "
                         "venv, else /tmp/benchy-venv)")
    ap.add_argument("--clients", default="sparkconsole,llama-benchy,aiohttp-lines")
    ap.add_argument("--paced", action="store_true", help="server writes one event per loop iteration")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    args = ap.parse_args()
    if args.smoke:
        args.concurrency, args.duration, args.tokens, args.repeat = "4", 0.5, 64, 1

    if args.serve is not None:
        asyncio.run(_serve(args.serve, args.paced))
        return 0
    if args.worker:
        c = int(args.concurrency)
        print(json.dumps(asyncio.run(_worker(args.worker, args.url, c, args.duration, args.tokens))))
        return 0

    levels = [int(x) for x in args.concurrency.split(",")]
    clients = args.clients.split(",")
    if "llama-benchy" in clients and not os.access(args.benchy_python, os.X_OK):
        print(f"llama-benchy skipped: no {args.benchy_python} (python -m venv DIR && DIR/bin/pip install "
              "llama-benchy==0.4.0, then pass --benchy-python DIR/bin/python)", file=sys.stderr)
        clients.remove("llama-benchy")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([*_pin(1), sys.executable, os.path.abspath(__file__), "--serve", str(port)]
                              + (["--paced"] if args.paced else []))
    try:
        for _ in range(100):
            try:
                _server_cpu(url)
                break
            except OSError:
                time.sleep(0.05)
        print(f"server: {'paced, one event per write' if args.paced else 'line rate'}, {args.tokens} tokens per "
              f"request, one SSE event per HTTP chunk; client pinned to CPU 0, server to CPU 1; "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
        table = {}
        for c in levels:
            for kind in clients:
                best = None
                for _ in range(args.repeat):
                    s0 = _server_cpu(url)
                    r = _run_client(sys.executable if kind != "llama-benchy" else args.benchy_python,
                                    kind, url, c, args.duration, args.tokens, 0)
                    r["server_cpu_pct"] = (_server_cpu(url) - s0) / r["wall_s"] * 100
                    if best is None or r["events"] / r["wall_s"] > best["events"] / best["wall_s"]:
                        best = r
                table[(kind, c)] = best
                ev_s = best["events"] / best["wall_s"]
                cpu = max(best["cpu_s"], 1e-9)
                print(f"c{c:<4} {kind:14} {best['requests'] / best['wall_s']:7.0f} req/s {ev_s:8.0f} events/s"
                      f" | per CPU-second: {best['requests'] / cpu:6.0f} req {best['events'] / cpu:8.0f} events"
                      f" | {cpu / max(1, best['events']) * 1e6:5.2f} µs/event"
                      f" | client CPU {cpu / best['wall_s'] * 100:3.0f}%, server CPU {best['server_cpu_pct']:3.0f}%"
                      f", errors {best['errors']}", flush=True)
        if "llama-benchy" in clients and "sparkconsole" in clients:
            print()
            # At line rate the server idles and each client is CPU-bound, so events per CPU-second is the rate
            # the client sustains on one whole core; wall-clock rates also measure how much of its core another
            # load left it (the client CPU column), so they decide nothing on a shared machine.
            print("Ratios: per CPU-second (the one-core ceiling; decides the targets) and wall-clock in this run.")
            for c in levels:
                ours, theirs = table[("sparkconsole", c)], table[("llama-benchy", c)]
                ratio = (ours["events"] / ours["wall_s"]) / (theirs["events"] / theirs["wall_s"])
                rq = (ours["requests"] / ours["wall_s"]) / (theirs["requests"] / theirs["wall_s"])
                per_cpu = (ours["events"] / ours["cpu_s"]) / (theirs["events"] / theirs["cpu_s"])
                us = ours["cpu_s"] / max(1, ours["events"]) * 1e6
                rq_cpu = (ours["requests"] / ours["cpu_s"]) / (theirs["requests"] / theirs["cpu_s"])
                print(f"c{c}: sparkconsole / llama-benchy = {per_cpu:.2f}x token events and {rq_cpu:.2f}x requests "
                      f"per CPU-second ({ratio:.2f}x and {rq:.2f}x wall-clock); {us:.2f} µs client CPU per token "
                      f"event (targets ≥ 2x and < 20 µs: {'met' if per_cpu >= 2 and us < 20 else 'NOT met'})")
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
