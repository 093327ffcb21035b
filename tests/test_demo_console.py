"""The demo's console, nodes first: the simulated nodes' readings are on screen before the model is started; the
model, router and load come up behind the dashboard, each noted in the event log, and an endpoint that is still
loading is not polled (no DOWN, no endpoint alert) until it serves."""

from __future__ import annotations

import argparse
import asyncio
import re
import time

import pytest

from sparkconsole.commands import demo
from sparkconsole.sim.cluster import Serving, SimCluster
from tests.helpers import cancel_tasks

# Starts a simulated cluster (model servers, router, load) like tests/test_demo.py, which conftest routes to slow.
pytestmark = pytest.mark.slow


async def until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_demo_console_shows_nodes_then_brings_the_model_up_behind_them():
    sim = SimCluster(serving=Serving(topology="2x-solo"), load_speedup=demo.DEMO_LOAD_SPEEDUP)
    await sim.start_nodes()
    tasks: list[asyncio.Task] = []
    try:
        assert [e.name for e in sim.cluster.endpoints] == ["router", "spark1", "spark2"]
        app = demo.console_app(sim, argparse.Namespace(load=2, duration=None), tasks)
        async with app.run_test(size=(200, 60)) as pilot:
            panel = lambda: app.dashboard.panels.get("spark1")  # noqa: E731
            temp = re.compile(r"GPU \d+°C")
            await until(lambda: panel() is not None and temp.search(panel().query_one(".temp-line").render().plain),
                        60, "spark1's temperature on screen")
            # The model was not started before the nodes were on screen: nothing serves yet.
            assert not any(e.is_set() for e in sim.ready.values())
            assert all(em.latest is None for em in app.serving.endpoints.values())

            await until(lambda: all(e.is_set() for e in sim.ready.values()), 120, "every endpoint serving")
            await until(lambda: all(em.latest is not None and em.latest.healthy
                                    for em in app.serving.endpoints.values()), 30, "every endpoint polled UP")
            events = lambda: "\n".join(app.dashboard.events.history)  # noqa: E731
            await until(lambda: "sim: load: 2 streaming" in events(), 30, "the load noted")
            text = events()
            assert "sim: starting openai/gpt-oss-120b as 2x-solo" in text
            assert "sim: spark1 serving at" in text and "sim: router serving at" in text
            assert "unhealthy" not in text          # no endpoint was polled while it loaded
            await pilot.press("q")
    finally:
        await cancel_tasks(tasks)
        await sim.stop()
        await sim.stop()        # twice is harmless (once-only: a second pass must not reach the host's docker)


async def test_a_server_closed_by_its_drain_gate_reads_closed_with_the_line_that_opens_it():
    """Issue 40: a server whose drain gate stayed closed looked SERVING on the console while it answered every
    generation 503. The launch bar now says CLOSED, names the server and the command that opens it; opened, the
    launch is SERVING again."""
    from sparkconsole.launch import gate
    from sparkconsole.sim.cluster import CONTAINER
    sim = SimCluster(serving=Serving(topology="2x-solo", recipe="gpt-oss-120b"), load_speedup=demo.DEMO_LOAD_SPEEDUP)
    await sim.start_nodes()
    tasks: list[asyncio.Task] = []
    try:
        app = demo.console_app(sim, argparse.Namespace(load=0, duration=None), tasks)
        async with app.run_test(size=(200, 60)) as pilot:
            bar = lambda: app.dashboard.launches.render().plain      # noqa: E731
            await until(lambda: all(e.is_set() for e in sim.ready.values()), 120, "every endpoint serving")
            await until(lambda: "SERVING" in bar(), 60, "the launch SERVING on the launch bar")
            await sim.docker("spark2", "exec", CONTAINER, "touch", gate.FLAG)
            await until(lambda: "CLOSED" in bar(), 30, "the launch CLOSED on the launch bar")
            text = bar()
            assert f"{CONTAINER} on spark2 is closed to new requests" in text, text
            assert f"docker exec {CONTAINER} rm -f {gate.FLAG} (on spark2)" in text, text
            events = "\n".join(app.dashboard.events.history)
            assert f"docker exec {CONTAINER} rm -f {gate.FLAG} (on spark2)" in events, events[-1000:]
            await sim.docker("spark2", "exec", CONTAINER, "rm", "-f", gate.FLAG)
            await until(lambda: "SERVING" in bar() and "CLOSED" not in bar(), 30, "SERVING again")
            await pilot.press("q")
    finally:
        await cancel_tasks(tasks)
        await sim.stop()
