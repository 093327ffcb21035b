"""The serving process SIGKILLed in the middle of a bench sweep (a real server process: the simulated vLLM server,
`python -m sparkconsole.sim.server`, over real HTTP on loopback).

Levels finished before the kill keep their figures; the level in flight and the ones after it are recorded with
their failed requests and the reason (connection refused / dropped); the sweep goes on to the end, exits with
its status, and prints no traceback. (The same with a vLLM container `docker kill`ed on the real docker engine:
tests/faults/test_container_killed.py.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import httpx
import pytest

from sparkconsole.bench.results import ResultsStore
from tests.helpers import free_port, levels_done

CONC = (1, 2, 3, 4)
RUNS = 2


@pytest.mark.fault("serving process SIGKILLed mid-sweep: finished levels kept, failures recorded, sweep ends")
async def test_server_killed_mid_sweep(tmp_path, ledger):
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sparkconsole.sim.server", "tiny-llama", "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048", "--sim-speed", "4", "--sim-load-speedup", "200",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    results = tmp_path / "bench.sqlite"
    try:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient() as c:
            while True:
                try:
                    if (await c.get(url + "/health", timeout=1)).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline and server.returncode is None, "sim server did not start"
                await asyncio.sleep(0.2)
        bench = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sparkconsole", "bench", "run", "--url", url, "--pp", "64", "--tg", "32",
            "-c", ",".join(map(str, CONC)), "--runs", str(RUNS), "--latency-mode", "none", "--no-warmup",
            "--first-timeout", "10", "--stall-timeout", "5", "--results", str(results), "-q",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        deadline = time.monotonic() + 120
        while levels_done(results) < 2:
            assert bench.returncode is None, "sweep ended early"
            assert time.monotonic() < deadline, "sweep made no progress"
            await asyncio.sleep(0.02)
        os.killpg(server.pid, signal.SIGKILL)            # the server dies with requests in flight
        await server.wait()
        out, err = await asyncio.wait_for(bench.communicate(), 180)
    finally:
        if server.returncode is None:
            os.killpg(server.pid, signal.SIGKILL)
            await server.wait()
    ledger.output(out + err, "bench run (server killed)")
    assert b"Traceback" not in err, err.decode()[-2000:]
    with ResultsStore(results) as store:
        (run,) = store.runs()
        levels = store.levels(run.run_id)
        assert [lv.key.concurrency for lv in levels] == list(CONC)       # the sweep went to the end
        kept = levels[:2]
        for lv in kept:                                                   # measured before the kill: intact
            assert lv.metrics["requests_ok"] == RUNS * lv.key.concurrency and not lv.metrics["requests_failed"]
        last = levels[-1]
        assert last.metrics["requests_ok"] == 0 and last.metrics["requests_failed"] == RUNS * last.key.concurrency
        errors = {r["error"] for r in store.requests(run.run_id, last.key)}
        assert all(e and "\n" not in e for e in errors), errors        # each failure says why, on one line
