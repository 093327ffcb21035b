"""How long after its clock starts each client's request reaches the server (the part of TTFT that is the client's).

    .venv/bin/python benchmarks/client_dispatch.py [--requests 200] [--smoke]

Runs with llama-benchy's interpreter (the test bed's venv, re-executed if needed), pinned to one CPU. A
streaming server in the same process stamps each request's arrival with the same clock the clients start
theirs with (time.perf_counter), so arrival minus start is what a client adds to every TTFT it reports:
- sparkconsole: `bench.client.stream_chat` on a session opened as `bench.sweep` opens it;
- llama-benchy 0.4.0: `LLMClient.run_generation`, its session opened as its runner opens it (`trust_env=True`:
  aiohttp looks up ~/.netrc and the proxy variables in a thread for every request), and with `trust_env=False`.
The lockstep cross-check (tests/testbed/lockstep.py) runs llama-benchy's session without trust_env for this reason.
`--smoke`: 20 requests per client, llama-benchy's only where the test bed's cache holds its venv (never built).
Measured figures are in docs/BENCHMARKS.md ("Cross-check with llama-benchy").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def reexec_in_benchy_venv(build: bool) -> bool:
    """True once running under llama-benchy's venv (re-executed into it, built first when `build`); False when
    it is not built and `build` is off."""
    try:
        import llama_benchy  # noqa: F401  (present: already in its venv)
        return True
    except ImportError:
        pass
    from tests.testbed.benchy import BENCHY_VENV
    from tests.testbed.cache import cached_venv, ensure_venv
    venv = ensure_venv(BENCHY_VENV) if build else cached_venv(BENCHY_VENV)
    if venv is None:
        return False
    os.execv(str(venv.python), [str(venv.python), __file__, *sys.argv[1:]])


async def measure(n: int, with_benchy: bool = True) -> dict[str, list[float]]:
    from aiohttp import web

    from sparkconsole.bench.client import chat_payload, open_session, stream_chat

    arrivals: list[float] = []

    async def handler(req: web.Request) -> web.StreamResponse:
        arrivals.append(time.perf_counter())
        await req.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        for _ in range(3):
            await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"x"},"token_ids":[5]}]}\n\n')
        await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":128,"completion_tokens":3}}\n\n'
                         b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    text = "hello world " * 50
    out: dict[str, list[float]] = {}
    warm = n // 10

    async def one(name: str, make_session, send) -> None:
        async with make_session() as s:
            d = []
            for _ in range(n):
                arrivals.clear()
                start = await send(s)
                d.append((arrivals[0] - start) * 1e3)
                await asyncio.sleep(0.01)          # the same quiet between requests for every client
            out.setdefault(name, []).extend(d[warm:])


    body = json.dumps(chat_payload("m", [{"role": "user", "content": text}], 3)).encode()

    async def ours_send(s):
        return (await stream_chat(s, base + "/v1/chat/completions", body)).start

    if with_benchy:
        from llama_benchy.client import LLMClient

        from tests.testbed.lockstep import benchy_session
        client = LLMClient(base + "/v1", "EMPTY", "m", exact_tg=True)

        async def benchy_send(s):
            return (await client.run_generation(s, "", text, 3, False, None)).start_ts

    for _ in range(2):                                 # interleaved, twice, so drift falls on all three
        if with_benchy:
            await one("llama-benchy (its session: trust_env=True)", lambda: benchy_session(1, True), benchy_send)
            await one("llama-benchy, trust_env=False", lambda: benchy_session(1, False), benchy_send)
        await one("sparkconsole", lambda: open_session(1), ours_send)
    await runner.cleanup()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    args = ap.parse_args()
    if args.smoke:
        args.requests = 20
    with_benchy = reexec_in_benchy_venv(build=not args.smoke)
    if not with_benchy:
        print("skipped: llama-benchy (its venv is not in the test bed's cache; a run without --smoke builds it)")
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[-1]})
    out = asyncio.run(measure(args.requests, with_benchy))
    print(f"request reaches the server, after the client's clock started (one CPU, {args.requests} requests x 2):")
    for name, v in out.items():
        v.sort()
        print(f"  {name:45s} median {statistics.median(v):6.3f} ms  p90 {v[int(0.9 * len(v))]:6.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
