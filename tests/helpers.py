"""Small helpers the test modules share (ports on loopback, waiting on the event loop or inside a Textual pilot)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

# Ports handed to servers come from below the kernel's ephemeral range (ip_local_port_range starts at 32768):
# a port the OS picks with bind(0) is in that range, where every outgoing connection and every vLLM engine's
# ZMQ socket also takes its port, so a server started on it seconds later found it taken now and then
# ("Address already in use"). Each xdist worker owns a block of its own, handed out in order, so two workers
# never pick the same port and one worker reuses a port only after going round its whole block.
_PORT_FLOOR, _PORT_CEILING = 20000, 32768
_PORT_BLOCKS = 10      # the controller and up to 9 workers (tests/parallel.py starts at most 8)
_next_port: int | None = None


def _port_block() -> tuple[int, int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")          # "gw3", or "" in the controller / -n 0
    index = (int(worker[2:]) + 1 if worker[2:].isdigit() else 0) % _PORT_BLOCKS
    size = (_PORT_CEILING - _PORT_FLOOR) // _PORT_BLOCKS
    return _PORT_FLOOR + index * size, _PORT_FLOOR + (index + 1) * size


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, from this worker's own block below the ephemeral range (see above)."""
    global _next_port
    low, high = _port_block()
    if _next_port is None:      # a different start each session: a port a killed run left in use is skipped anyway
        _next_port = low + (os.getpid() * 7919) % (high - low)
    for _ in range(high - low):
        port, _next_port = _next_port, low + (_next_port + 1 - low) % (high - low)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in {low}-{high - 1}")


async def wait_for(pilot, cond, timeout: float = 10.0, what: str = "condition", step: float = 0.05) -> None:
    """Let the app run until cond() holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(step)


async def until(pred, timeout: float, what: str, interval: float = 0.02) -> float:
    """Poll pred() on the event loop every `interval` s; the seconds it took, or fail the test naming `what` after
    `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        await asyncio.sleep(interval)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def levels_done(path) -> int:
    """Finished levels in a results file, read-only while a sweep in another process writes it (0 if not there yet)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute("SELECT count(*) FROM levels").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0


RECORDED_METRICS = "metrics-vllm-0.32.0-cpu-recorded.txt"


async def recorded_vllm_endpoint():
    """A loopback HTTP server answering as a vLLM 0.32 (CPU) serving `tiny-llama`: /health, /v1/models, /version,
    and /metrics recorded from the real one. Returns (aiohttp runner: `await runner.cleanup()` stops it, base URL)."""
    from pathlib import Path

    from aiohttp import web
    text = (Path(__file__).parent / "fixtures" / RECORDED_METRICS).read_text()

    async def health(_):
        return web.Response(text="")

    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": "tiny-llama", "max_model_len": 2048}]})

    async def version(_):
        return web.json_response({"version": "0.32.0"})

    async def prom(_):
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.add_routes([web.get("/health", health), web.get("/v1/models", models), web.get("/version", version),
                    web.get("/metrics", prom)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def error_lines(stderr: str) -> list[str]:
    """A command's stderr lines less the one saying where its cluster came from (`cluster: …`, clusterfile.py)."""
    return [ln for ln in stderr.strip().splitlines() if not ln.startswith("cluster: ")]


async def cancel_tasks(tasks) -> None:
    """Cancel each task and wait for it, whatever it raised (a demo's bring-up and load, at teardown)."""
    import contextlib
    for t in tasks:
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t


def longest_alone(counts: list[tuple[float, int]]) -> float:
    """From (time, backends serving) samples of a restart: the longest stretch one backend carried everything."""
    best, since = 0.0, None
    for t, n in counts:
        if n == 1 and since is None:
            since = t
        elif n != 1 and since is not None:
            best, since = max(best, t - since), None
    return best


def git_repo(root: Path, files: dict[str, str]) -> Path:
    """A git repository at `root` holding `files` (path → text) in one commit: a registry for the real git."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for args in (["init", "-q", "-b", "main"], ["config", "uploadpack.allowFilter", "true"], ["add", "-A"],
                 ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return root


@contextlib.asynccontextmanager
async def sim_pair_runner(third_octet: int, topology: str, options: dict):
    """A simulated pair serving nothing on loopback addresses of its own (127.X.third_octet.2/.3: the bundled
    recipe's fixed router port must not meet a demo on .2/.3), the bundled gpt-oss-120b planned on it as `topology`
    with `options`, and the real Runner over connected local transports: yields (sim, plan, runner); the transports
    closed and the simulator stopped on the way out."""
    from sparkconsole.launch.plan import make_plan
    from sparkconsole.launch.runner import Runner
    from sparkconsole.nodes.connect import make_transport
    from sparkconsole.recipes import bundled_recipes
    from sparkconsole.sim.cluster import Serving, SimCluster

    base = f"127.{os.getpid() % 200 + 20}.{third_octet}"
    sim = SimCluster(speed=5, load_speedup=100, serving=Serving(topology="none"),
                     nodes=(("spark1", base + ".2"), ("spark2", base + ".3")))
    await sim.start()
    transports = {}
    try:
        recipe = next(r for r in bundled_recipes() if r.model == "openai/gpt-oss-120b")
        plan = make_plan(recipe, topology, sim.cluster, {**options, "router_dir": str(sim.root / "routers")})
        transports = {n.name: make_transport(n, sim.cluster.ssh) for n in sim.cluster.nodes}
        for t in transports.values():
            await t.connect()
        yield sim, plan, Runner(sim.cluster, transports, ready_timeout=90, poll_interval=0.5)
    finally:
        for t in transports.values():
            await t.close()
        await sim.stop()


def refusal_leaves_file_alone(writer: sqlite3.Connection, open_it, match: str) -> bool:
    """Whether `open_it()`, refusing the SQLite file `writer` has open (a UserError matching `match`), closed its
    own connection at once. The garbage collector is held off (a refusal's traceback keeps a connection alive until
    it runs); leaving WAL mode needs every other connection closed, so the writer's switch tells."""
    import gc

    from sparkconsole.errors import UserError

    gc.disable()
    try:
        with pytest.raises(UserError, match=match):
            open_it()
        try:
            return writer.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
        except sqlite3.OperationalError:        # "database is locked": the refusing connection is still open
            return False
    finally:
        gc.enable()
        writer.close()
