"""Bench screen keys: b starts a real sweep against a real (simulated-vLLM) server on loopback and the curves
grow as levels land, x stops it, p overlays past runs from the results file, f the published reference."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from sparkconsole.bench.benchy_io import bundled_published_csv, import_published_csv
from sparkconsole.bench.results import ResultsStore
from sparkconsole.config import ClusterConfig, EndpointConfig, NodeConfig
from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.nodes.replay import read_recording, replay_factory
from sparkconsole.tui.app import SparkConsoleApp
from sparkconsole.tui.screens.bench import level_value
from tests.helpers import free_port, wait_for

RECORDING = Path(__file__).parent / "fixtures" / "agent-h100-load.jsonl"
HOST = "127.0.0.1"



@pytest.fixture(autouse=True)
def workdir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)          # the bench screen uses ./runs/bench.sqlite, as `sparkconsole bench` does
    return tmp_path


def make_app(endpoints=()):
    cfg = ClusterConfig(nodes=(NodeConfig("spark1", "127.0.0.1", role="head"),), endpoints=tuple(endpoints))
    mon = ClusterMonitor(cfg, transport_factory=replay_factory(lambda n: read_recording(RECORDING), interval=0.1))
    return SparkConsoleApp(cfg, monitor=mon)


def published_topologies() -> set[str]:
    with ResultsStore(":memory:") as store:
        return {store.run(r).label for r in import_published_csv(store, bundled_published_csv())}


async def test_reference_overlay_toggles(workdir):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await pilot.pause(0.3)
        await pilot.press("f")
        await pilot.pause(0.3)
        chart = app.bench_screen.charts()["decode"]
        shown = {s.label for s in chart.series.values() if s.style == "reference"}
        assert shown == {f"published {t}" for t in published_topologies()}
        assert all(len(s.points) >= 3 for s in chart.series.values())
        legend = str(app.bench_screen.query_one("#bench-legend").render())
        assert "published" in legend and "(published)" not in legend, legend     # said once per series
        await pilot.press("f")
        await pilot.pause(0.2)
        assert not chart.series
        await pilot.press("q")


async def test_past_runs_overlay_from_the_results_file(workdir):
    with ResultsStore(workdir / "runs" / "bench.sqlite") as store:
        ids = import_published_csv(store, bundled_published_csv())
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await pilot.pause(0.3)
        await pilot.press("p")
        await pilot.pause(0.3)
        past = [s for s in app.bench_screen.charts()["ttft"].series.values() if s.style == "past"]
        assert len(past) == min(len(ids), 4)
        await pilot.press("q")


async def test_b_sweeps_a_real_server_and_x_stops_it(workdir):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sparkconsole.sim.server", "tiny-llama", "--host", HOST, "--port",
                             str(port), "--sim-speed", "50", "--sim-load-speedup", "200"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as s:
            while True:
                try:
                    async with s.get(url + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "sim server did not start"
                await asyncio.sleep(0.2)
        app = make_app([EndpointConfig("sim", url, kind="vllm")])
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("3")
            bench = app.bench_screen
            bench.runs, bench.concurrency = 1, (1, 2, 4, 8, 16, 32, 64, 128, 256)   # the last levels take long
            await pilot.press("b")
            from sparkconsole.tui.screens.bench_setup import BenchSetupScreen
            await wait_for(pilot, lambda: isinstance(app.screen, BenchSetupScreen), what="the sweep's setup")
            assert bench.sweep_worker is None                  # nothing sent before Enter
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(bench.levels) >= 2, 120, "two levels")
            await pilot.press("x")
            await wait_for(pilot, lambda: not bench.sweep_worker.is_running, 10, "the sweep to stop")
            landed = len(bench.levels)
            assert 2 <= landed < len(bench.concurrency)
            chart = bench.charts()["decode"]
            # every level that has a decode figure is drawn (under load a c1 stream can arrive in one chunk, with
            # no decode time to divide by: that level has no point, which is right)
            drawn = sorted(lv.key.concurrency for lv in bench.levels if level_value(lv, "decode_tps") is not None)
            assert drawn and sorted(chart.series["sim"].points) == drawn
            assert "stopped" in str(bench.query_one("#bench-status").render())
            await pilot.press("q")
        with ResultsStore(workdir / "runs" / "bench.sqlite") as store:
            assert len(store.levels()) >= 2          # each level persisted as it landed
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
