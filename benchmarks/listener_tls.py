"""What TLS and basic auth cost a scrape: the exporter over 2 replayed nodes (benchmarks/exporter.py's `build`),
scraped over loopback by aiohttp's client in this process.

    .venv/bin/python benchmarks/listener_tls.py [--scrapes 200] [--smoke]

1. Scrape latency, median and p95, for: plain HTTP with no auth; HTTP with a bearer token; HTTPS + basic auth on a
   kept-alive connection (the password verified once, then remembered); HTTPS + basic auth with a new connection
   (a TLS handshake) per scrape, as a scraper without keep-alive would.
2. One bcrypt check at cost 10 (what the first scrape, or a wrong password, costs), and how many bcrypt checks the
   keep-alive run above did (1: the cache at work).
3. A flood of wrong passwords (20 in flight at a time, each a new one, for 5 s) while a scraper with the right one
   scrapes every 0.1 s: its latency (the checks run in worker threads, two at a time, so the event loop keeps
   answering; past the checks allowed to wait, a wrong password is answered 429 at once, and its client waits 10 ms).

Prints one JSON object. The machine is shared: figures are medians taken in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import ssl
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import bcrypt

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.exporter import build, pct  # noqa: E402
from sparkconsole.exporter.listener import make_listener  # noqa: E402
from sparkconsole.exporter.server import ExporterServer  # noqa: E402
from tests.tlsca import TestCA  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"
PASSWORD = "bench-password"


def basic(password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()}


async def timed(url: str, n: int, headers: dict[str, str], ssl_ctx: ssl.SSLContext | bool, *,
                keep_alive: bool = True) -> dict[str, float]:
    times = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=not keep_alive)) as s:
        for _ in range(n):
            t0 = time.perf_counter()
            async with s.get(url, headers=headers, ssl=ssl_ctx) as r:
                await r.read()
                assert r.status == 200, r.status
            times.append((time.perf_counter() - t0) * 1000)
    return {"median_ms": round(pct(times, 0.5), 2), "p95_ms": round(pct(times, 0.95), 2)}


async def flood(url: str, ctx: ssl.SSLContext, seconds: float) -> dict[str, float]:
    stop = time.monotonic() + seconds
    wrong = busy = 0

    async def attacker(s: aiohttp.ClientSession) -> None:
        nonlocal wrong, busy
        while time.monotonic() < stop:
            async with s.get(url, headers=basic(f"wrong-{wrong}-{busy}"), ssl=ctx) as r:
                await r.read()
                wrong += r.status == 401
                busy += r.status == 429
            if r.status == 429:
                await asyncio.sleep(0.01)

    async def scraper(s: aiohttp.ClientSession) -> list[float]:
        times = []
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            async with s.get(url, headers=basic(PASSWORD), ssl=ctx) as r:
                await r.read()
            times.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.1)
        return times

    async with aiohttp.ClientSession() as s:
        got = await asyncio.gather(scraper(s), *(attacker(s) for _ in range(20)))
    times = got[0]
    return {"wrong_passwords_refused": wrong, "answered_429_at_once": busy, "right_scrape_median_ms": round(pct(times, 0.5), 2),
            "right_scrape_p95_ms": round(pct(times, 0.95), 2), "right_scrape_max_ms": round(max(times), 2)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs every benchmark so)")
    args = ap.parse_args()
    if args.smoke:
        args.scrapes = 5
    flood_s = 0.2 if args.smoke else 5.0
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ca = TestCA(Path(tmp))
        ca.issue("server")
        cfg = Path(tmp) / "web.yml"
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10))
        cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                       f"basic_auth_users:\n  prometheus: {hashed.decode()}\n")
        t0 = time.perf_counter()
        bcrypt.checkpw(PASSWORD.encode(), hashed)
        out["bcrypt_cost10_check_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        client_ctx = ssl.create_default_context(cafile=str(ca.ca_file))
        servers = {"http": make_listener("127.0.0.1:0"), "http_bearer": make_listener("127.0.0.1:0", token=TOKEN),
                   "https_basic": make_listener("127.0.0.1:0", web_config_file=str(cfg))}
        started = {}
        for name, listener in servers.items():
            started[name] = ExporterServer(build(2), listener)
            await started[name].start()
        try:
            await asyncio.sleep(0.5 if args.smoke else 2)       # a few replayed ticks: the scrape has its full size
            n = args.scrapes
            out["http_no_auth"] = await timed(started["http"].url(), n, {}, False)
            out["http_bearer"] = await timed(started["http_bearer"].url(), n, {"Authorization": f"Bearer {TOKEN}"},
                                             False)
            users = servers["https_basic"].access.users
            assert users is not None
            out["https_basic_keepalive"] = await timed(started["https_basic"].url(), n, basic(PASSWORD), client_ctx)
            out["bcrypt_checks_during_keepalive_run"] = users.bcrypt_runs
            out["https_basic_new_connection_each"] = await timed(started["https_basic"].url(), n, basic(PASSWORD),
                                                                 client_ctx, keep_alive=False)
            out[f"wrong_password_flood_{flood_s:g}s"] = await flood(started["https_basic"].url(), client_ctx, flood_s)
        finally:
            for s in started.values():
                await s.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
