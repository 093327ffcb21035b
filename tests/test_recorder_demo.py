"""The demo's recording is found without --file, and a recorder closed cleanly leaves no -wal / -shm behind.

`sparkconsole demo --runaway memory` records into a SIMULATED-… file in the state dir; `postmortem NODE` and
`console --at` used to answer "no recorder file" for this machine's cluster. Now they read the latest demo
recording when no cluster file was given and this machine's recording does not hold the node (or with --demo).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.nodes.replay import replay_factory
from sparkconsole.recorder.reader import RecorderReader
from sparkconsole.recorder.store import RecorderStore
from sparkconsole.tui.app import SparkConsoleApp
from tests.faults.test_recorder_damage import make_recording
from tests.helpers import wait_for
from tests.test_recorder import tick
from tests.test_tui_app import SIZE

ROOT = Path(__file__).resolve().parent.parent


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob("*") if p.name.endswith(("-wal", "-shm")))


def test_a_closed_store_leaves_no_wal_even_after_readers_came_and_went(tmp_path):
    path = tmp_path / "r.sqlite"
    store = RecorderStore(path)
    for i in range(50):
        store.put_tick("n", tick(time.time() - 100 + i, i))
    store.flush()
    assert leftovers(tmp_path)                 # WAL while writing
    RecorderReader(path).close()               # a post-mortem or a scrub read it meanwhile
    store.close()
    assert leftovers(tmp_path) == []
    r = RecorderReader(path)                   # and reading the closed file leaves nothing either
    assert len(r.ticks("n", 0, time.time())) == 50
    r.close()
    assert leftovers(tmp_path) == []
    again = RecorderStore(path)                # a new writer goes back to WAL
    again.put_tick("n", tick(time.time(), 99))
    again.flush()
    assert again.error is None and leftovers(tmp_path)
    again.close()
    assert leftovers(tmp_path) == []


async def test_console_quit_after_a_scrub_leaves_no_wal(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    cluster = ClusterConfig(nodes=(NodeConfig("spark1", "127.0.0.1"),), endpoints=(),
                            source=str(tmp_path / "c.yaml"), simulated=True)
    mon = ClusterMonitor(cluster, transport_factory=replay_factory(
        {"spark1": str(ROOT / "tests/fixtures/agent-h100-load.jsonl")}, interval=0.05))
    app = SparkConsoleApp(cluster, monitor=mon, record=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.recorder is not None and app.recorder.store.rows_written > 20,
                       timeout=30, what="rows recorded")
        await pilot.press("left_square_bracket")      # the scrub opens the recorder file to replay it
        await pilot.press("right_square_bracket")
        await pilot.press("q")
    assert leftovers(tmp_path / "state") == [], leftovers(tmp_path / "state")


def _demo_recording(state: Path) -> Path:
    path = state / "recorder" / "SIMULATED-_simulated_-0123456789.sqlite"
    path.parent.mkdir(parents=True)
    make_recording(path, time.time() - 3600)
    return path


def test_postmortem_and_console_at_find_the_demo_recording(tmp_path, monkeypatch):
    state = tmp_path / "state"
    demo = _demo_recording(state)
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(state), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    for extra in ([], ["--demo"]):
        r = subprocess.run([sys.executable, "-m", "sparkconsole", "postmortem", "spark2", *extra], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "# Post-mortem: spark2" in r.stdout, r.stderr
        assert f"reading the demo's recording {demo}" in r.stderr and "Traceback" not in r.stderr
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(state))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    from sparkconsole.commands.console import build_app
    app = build_app(argparse.Namespace(cluster=None, at="-55m", replay=None, demo=False))
    assert [n.name for n in app.cluster.nodes] == ["spark1", "spark2"] and app.simulated
    assert app.sub_title.startswith("REPLAY ") and "SIMULATED" in app.sub_title
