"""`sparkconsole demo --runaway KIND[:NODE]`: the trigger's input checks, its node default, the thermal model's HW
slowdown, and the headless demo's runaway watched by the console's own rules down to the post-mortem."""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import time

import pytest

from sparkconsole.commands import demo
from sparkconsole.errors import UserError
from sparkconsole.sim import runaway
from sparkconsole.sim.cluster import Serving, SimCluster
from sparkconsole.sim.node import GB10, ThermalState, thermal_step


def test_the_demo_knows_every_kind_the_simulator_has():
    assert demo.RUNAWAYS == runaway.KINDS


@pytest.mark.parametrize("spec, topology, want", [
    ("memory", "2x-solo", ("memory", "spark2")), ("memory", "solo", ("memory", "spark1")),
    ("thermal:spark1", "2x-solo", ("thermal", "spark1")), ("link", "none", ("link", "spark2")),
])
def test_runaway_target_and_its_default_node(spec, topology, want):
    assert demo.runaway_target(SimCluster(serving=Serving(topology=topology)), spec) == want


def test_bad_runaways_are_one_line_errors():
    args = argparse.Namespace(speed=1.0, duration=None, load=4, runaway="meltdown")
    with pytest.raises(UserError) as err:
        demo._check(args)
    assert "--runaway" in str(err.value) and "memory, thermal or link" in str(err.value)
    with pytest.raises(UserError) as err:
        demo.runaway_target(SimCluster(), "link:spark9")
    assert "spark9" in str(err.value) and "spark1, spark2" in str(err.value)
    sim = SimCluster()
    with pytest.raises(UserError):
        sim.runaway("spark1", "link")        # nodes not started: no such node yet
    r = subprocess.run([sys.executable, "-m", "sparkconsole", "demo", "--headless", "--runaway", "oom"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--runaway" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_cooling_fault_past_hw_slowdown_drops_the_clock_to_its_floor():
    st = ThermalState(temp_c=GB10.hw_slowdown_c + 0.4, clock_mhz=GB10.sm_clock_max_mhz)
    for _ in range(20):
        st = thermal_step(GB10, ThermalState(**{**st.__dict__, "temp_c": GB10.hw_slowdown_c + 0.4}), 1.0, True, 0.25)
    assert st.hw_slowdown and st.throttled and st.hw_thermal_us > 0
    assert st.clock_mhz == pytest.approx(GB10.sm_clock_min_mhz, abs=60)
    cool = thermal_step(GB10, ThermalState(temp_c=70.0, clock_mhz=GB10.sm_clock_max_mhz), 0.5, True, 1.0)
    assert not cool.hw_slowdown and not cool.throttled and cool.hw_thermal_us == 0


def _lines(proc: subprocess.Popen, until, timeout: float) -> list[dict]:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sel.select(1.0):
            continue
        line = proc.stdout.readline()
        if not line:
            break
        out.append(json.loads(line))
        if until(out[-1]):
            return out
    pytest.fail(f"the headless demo did not get there in {timeout:g} s; it printed: {out}")


@pytest.mark.slow
def test_headless_demo_runaway_ends_in_the_consoles_post_mortem(tmp_path):
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "sparkconsole", "demo", "--headless", "--topology", "none",
                             "--speed", "4", "--load", "0", "--runaway", "thermal:spark2", "--duration", "90"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = _lines(proc, lambda d: "postmortem" in d, 80)
    finally:
        proc.terminate()
        proc.wait(30)
    head = lines[0]
    assert head["simulated"] and head["runaway"] == {"kind": "thermal", "node": "spark2", "after_s": demo.RUNAWAY_AFTER_S}
    notes = [d for d in lines if "runaway" in d and "note" in d]
    assert all(d["simulated"] and "SIMULATED" in d["note"] for d in notes)
    assert notes[-1]["outcome"] == "shutdown"
    assert any(d.get("alert") == "node:spark2:state" and "DOWN" in d["message"] for d in lines)
    pm = lines[-1]
    assert pm["postmortem"] == "spark2" and pm["verdict"] == "thermal", pm
    assert list((tmp_path / "state" / "recorder").glob("SIMULATED-*.sqlite"))


@pytest.mark.slow
async def test_demo_console_notes_the_runaway_and_shows_its_post_mortem(tmp_path, monkeypatch):
    import asyncio

    from tests.helpers import cancel_tasks, until
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    sim = SimCluster(serving=Serving(topology="solo"), load_speedup=demo.DEMO_LOAD_SPEEDUP, keepalive_s=3.0)
    await sim.start_nodes()
    tasks: list[asyncio.Task] = []
    args = argparse.Namespace(load=0, duration=None, runaway="link")
    args.runaway_target = demo.runaway_target(sim, args.runaway)
    try:
        app = demo.console_app(sim, args, tasks)
        async with app.run_test(size=(200, 60)) as pilot:
            events = lambda: "\n".join(app.dashboard.events.history)  # noqa: E731
            await until(lambda: "sim: link runaway on spark1 in 5 s (SIMULATED)" in events(), 60, "the runaway announced")
            await until(lambda: "sim: spark1: link cut" in events(), 30, "the link cut noted")
            await until(lambda: "post-mortem spark1: network-loss" in events(), 40, "the post-mortem in the events")
            assert app.recorder is not None and "SIMULATED-" in app.recorder.store.path.name
            assert app.monitor.nodes["spark2"].state.value == "LIVE"
            await pilot.press("q")
    finally:
        await cancel_tasks(tasks)
        await sim.stop()
