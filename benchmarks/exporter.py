"""Exporter figures: scrape time at 2 and 32 nodes, and the exporter's CPU at 32 nodes × 2 Hz.

    .venv/bin/python benchmarks/exporter.py [--nodes 2,32] [--scrapes 200] [--seconds 20]
    .venv/bin/python benchmarks/exporter.py --load [--clients 20] [--seconds 20] [--nodes 2]
    .venv/bin/python benchmarks/exporter.py --smoke       # both, a few seconds each

Every node replays a real agent recording (tests/fixtures/agent-h100-load.jsonl, with the vLLM container added on
every fourth tick as the agent sends it) through the real ClusterMonitor and its line parsing, at 2 Hz; one
endpoint per node carries a full set of engine figures (a fixed snapshot: no HTTP server is polled). The alert
engine is fed on every tick, as in `sparkconsole exporter`.

1. Scrape time: GET /metrics over loopback HTTP (aiohttp server, urllib client in a thread), per scrape; and the
   collector alone (prometheus_client's generate_latest) in process. Median and p95 (target: under 50 ms at 32).
2. Exporter CPU at 32 nodes × 2 Hz: this process's CPU time over a window while scraped once a second, as a share
   of one core. The replayed nodes' side (reading the recording) runs in this process too, so this is an upper
   bound for the exporter's own work; an SSH connection's encryption (asyncssh) is not in it.

3. Load (--load): the exporter in a process of its own (this script with --serve-child), 2 replayed nodes at 2 Hz;
   `--clients` concurrent keep-alive clients (aiohttp) scrape /metrics back to back for `--seconds`: scrapes per
   second, latency median / p95 / max, errors and non-200 answers, the exporter's RSS before, halfway and after.
   Then slowloris: 100 connections each sending a request's headers a byte per second, while one client scrapes
   once a second; its latencies beside the same scrape with no slow connection open.

Prints one JSON object. The machine is shared: figures are medians taken in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import generate_latest  # noqa: E402

from sparkconsole.config import ClusterConfig, EndpointConfig, NodeConfig  # noqa: E402
from sparkconsole.exporter.listen import Listen  # noqa: E402
from sparkconsole.exporter.readings import Readings  # noqa: E402
from sparkconsole.exporter.server import ExporterServer  # noqa: E402
from sparkconsole.nodes.monitor import ClusterMonitor  # noqa: E402
from sparkconsole.nodes.recording import read_recording  # noqa: E402
from sparkconsole.nodes.replay import replay_factory  # noqa: E402
from sparkconsole.serving.endpoint import EndpointSnapshot, ServingMonitor  # noqa: E402

RECORDING = ROOT / "tests" / "fixtures" / "agent-h100-load.jsonl"
CONTAINER = {"name": "vllm_node", "image": "vllm-node", "state": "running", "health": "healthy",
             "started_at": "2026-11-24T20:00:00Z", "restart_count": 0, "memory_limit_b": 107374182400,
             "oom_killed": False, "exit_code": 0}


def lines_with_containers() -> list[str]:
    out = []
    for i, line in enumerate(read_recording(RECORDING)):
        d = json.loads(line)
        if d.get("type") == "tick" and i % 4 == 0:
            d["containers"] = [CONTAINER]
        out.append(json.dumps(d))
    return out


class FixedServing(ServingMonitor):
    """The real ServingMonitor over the endpoints, each endpoint's `latest` a fixed snapshot and nothing polled:
    the collector reads whatever it reads from the monitors it runs with, so no stand-in falls behind it."""

    def __init__(self, cluster: ClusterConfig) -> None:
        super().__init__(cluster)
        now = time.time()
        for e in cluster.endpoints:
            self.endpoints[e.name].latest = EndpointSnapshot(
                name=e.name, url=e.url, kind="vllm", time=now, healthy=True, model="openai/gpt-oss-120b",
                version="0.11.0", running=4, waiting=0, kv_usage=0.12, prefix_hit_rate=0.4, prompt_tps=420.0,
                gen_tps=61.0, ttft_p50_s=0.3, ttft_p95_s=0.9, itl_p50_s=0.019, itl_p95_s=0.04, error=None,
                max_model_len=131072, generation_tokens=123456.0, prompt_tokens=654321.0, health_latency_s=0.002)

    async def start(self) -> None:
        pass            # no polling: the snapshots stay as set


def build(n: int) -> Readings:
    nodes = tuple(NodeConfig(name=f"spark{i + 1:02d}", address="127.0.0.1") for i in range(n))
    eps = tuple(EndpointConfig(name=f"spark{i + 1:02d}", url=f"http://127.0.0.1:{8000 + i}", node=f"spark{i + 1:02d}")
                for i in range(n))
    cluster = ClusterConfig(nodes=nodes, endpoints=eps, agent_interval_s=0.5, source="<benchmark>")
    lines = lines_with_containers()
    mon = ClusterMonitor(cluster, transport_factory=replay_factory(lambda node: lines, interval=0.5), history=16)
    return Readings(cluster, monitor=mon, serving=FixedServing(cluster))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def measure(n: int, scrapes: int, cpu_seconds: float | None, *, settle_s: float = 2.5) -> dict:
    readings = build(n)
    server = ExporterServer(readings, Listen("127.0.0.1", 0), None)
    await server.start()
    try:
        await readings.monitor.wait_first_ticks(30)
        await asyncio.sleep(settle_s)        # a container tick and a few ticks per node
        url = f"http://127.0.0.1:{server.port}/metrics"

        def scrape() -> tuple[float, int]:
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=10) as r:
                body = r.read()
            return time.perf_counter() - t0, len(body)

        http, size = [], 0
        for _ in range(scrapes):
            dt, size = await asyncio.to_thread(scrape)
            http.append(dt)
        inproc = []
        for _ in range(scrapes):
            t0 = time.perf_counter()
            generate_latest(server.registry)
            inproc.append(time.perf_counter() - t0)
        text = generate_latest(server.registry).decode()
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        out = {"nodes": n, "series": series, "body_bytes": size,
               "scrape_http_ms_median": round(statistics.median(http) * 1e3, 2),
               "scrape_http_ms_p95": round(pct(http, 0.95) * 1e3, 2),
               "collect_ms_median": round(statistics.median(inproc) * 1e3, 2),
               "collect_ms_p95": round(pct(inproc, 0.95) * 1e3, 2),
               "live_nodes": sum(1 for nm in readings.monitor.nodes.values() if nm.last is not None)}
        if cpu_seconds:
            c0, w0 = time.process_time(), time.monotonic()
            ticks0 = sum(nm.last.seq for nm in readings.monitor.nodes.values() if nm.last)
            while time.monotonic() - w0 < cpu_seconds:
                await asyncio.to_thread(scrape)       # Prometheus at a 1 s scrape interval
                await asyncio.sleep(1.0)
            cpu, wall = time.process_time() - c0, time.monotonic() - w0
            ticks = sum(nm.last.seq for nm in readings.monitor.nodes.values() if nm.last) - ticks0
            out.update({"cpu_window_s": round(wall, 1), "cpu_share_of_one_core": round(cpu / wall, 3),
                        "ticks_per_s": round(ticks / wall, 1)})
        return out
    finally:
        await server.stop()


async def serve_child(n: int) -> None:
    """The exporter alone in this process: prints its port, serves until stdin closes."""
    readings = build(n)
    server = ExporterServer(readings, Listen("127.0.0.1", 0), None)
    await server.start()
    await readings.monitor.wait_first_ticks(30)
    print(server.port, flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await server.stop()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


async def load(n: int, clients: int, seconds: float, *, quiet_scrapes: int = 10, slow_conns: int = 100,
               every_s: float = 1.0) -> dict:
    import aiohttp
    child = await asyncio.create_subprocess_exec(sys.executable, __file__, "--serve-child", str(n),
                                                 stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    port = int((await child.stdout.readline()).decode())
    url = f"http://127.0.0.1:{port}/metrics"
    lat: list[float] = []
    bad = {"errors": 0, "non_200": 0}
    rss = {"before": rss_mib(child.pid)}

    async def client(session: aiohttp.ClientSession, until: float) -> None:
        while time.monotonic() < until:
            t0 = time.perf_counter()
            try:
                async with session.get(url) as r:
                    await r.read()
                    bad["non_200"] += r.status != 200
            except aiohttp.ClientError:
                bad["errors"] += 1
            lat.append(time.perf_counter() - t0)

    async def halfway() -> None:
        await asyncio.sleep(seconds / 2)
        rss["halfway"] = rss_mib(child.pid)

    async def one_a_second(session: aiohttp.ClientSession, count: int) -> list[float]:
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            async with session.get(url) as r:
                await r.read()
            out.append((time.perf_counter() - t0) * 1e3)
            await asyncio.sleep(every_s)
        return out

    async def slow(stop: asyncio.Event) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 4000
        for byte in req:
            if stop.is_set():
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except OSError:
                break
            await asyncio.sleep(1.0)
        writer.close()

    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
            until = time.monotonic() + seconds
            t0 = time.monotonic()
            await asyncio.gather(halfway(), *(client(session, until) for _ in range(clients)))
            wall = time.monotonic() - t0
            rss["after"] = rss_mib(child.pid)
            quiet = await one_a_second(session, quiet_scrapes)
            stop = asyncio.Event()
            slows = [asyncio.create_task(slow(stop)) for _ in range(slow_conns)]
            await asyncio.sleep(2 * every_s)           # the slow connections are open
            loris = await one_a_second(session, quiet_scrapes)
            stop.set()
            await asyncio.gather(*slows)
        ms = [x * 1e3 for x in lat]
        return {"nodes": n, "clients": clients, "seconds": round(wall, 1), "scrapes": len(lat),
                "scrapes_per_s": round(len(lat) / wall, 1), "latency_ms_median": round(statistics.median(ms), 2),
                "latency_ms_p95": round(pct(ms, 0.95), 2), "latency_ms_max": round(max(ms), 2), **bad,
                "rss_mib": rss, f"slowloris_{slow_conns}_conns_scrape_ms": {"median": round(statistics.median(loris), 2),
                                                                  "max": round(max(loris), 2)},
                "quiet_scrape_ms": {"median": round(statistics.median(quiet), 2), "max": round(max(quiet), 2)}}
    finally:
        child.stdin.close()
        await child.wait()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="2,32")
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=20.0, help="CPU window at the largest node count; load duration")
    ap.add_argument("--load", action="store_true", help="concurrent clients and slowloris against a child exporter")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--serve-child", type=int, metavar="N", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs every benchmark so)")
    args = ap.parse_args()
    if args.serve_child:
        await serve_child(args.serve_child)
        return
    if args.smoke:
        results = [await measure(2, 5, 1.0, settle_s=1.0)]
        out = await load(2, 2, 1.0, quiet_scrapes=2, slow_conns=5, every_s=0.25)
        print(json.dumps({"exporter": results, "load": out, "smoke": True}, indent=1))
        return
    if args.load:
        out = await load(int(args.nodes.split(",")[0]) if args.nodes != "2,32" else 2, args.clients, args.seconds)
        print(json.dumps({"load": out, "cpu_cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)},
                         indent=1))
        return
    counts = [int(x) for x in args.nodes.split(",")]
    results = [await measure(n, args.scrapes, args.seconds if n == max(counts) else None) for n in counts]
    # The machine may be shared: the load average says how much the figures were disturbed.
    print(json.dumps({"exporter": results, "cpu_cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)},
                     indent=1))


if __name__ == "__main__":
    asyncio.run(main())
