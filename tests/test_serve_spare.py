"""What a browser tab's console does before its first reading. The console started ahead of the tab
(webface/spare.py, webface/warm.py) reads and connects nothing until a tab takes it, ends with its server, and once
taken is the tab's console with the tab's own terminal size; the server starts the next one after each take and
stops it with itself; its monitors start while Textual lays out the first frame, which draws their readings as
soon as it is up. Attached to a collector, a console imports no HTTP stack until it has an endpoint to show.
(How long a tab takes: benchmarks/tab_open.py.)"""

from __future__ import annotations

import gc
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import aiohttp
import psutil

from sparkconsole.exporter.listen import Listen
from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.nodes.replay import read_recording, replay_factory
from sparkconsole.tui import heap
from sparkconsole.tui.app import SparkConsoleApp
from sparkconsole.webface.server import ConsoleServer
from sparkconsole.webface.spare import SpareConsole
from tests.helpers import until, wait_for
from tests.screen import widget_text
from tests.test_serve import _ANSI
from tests.test_tui_app import cluster

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "tests" / "fixtures" / "agent-h100-load.jsonl"
CURSOR_ROW = re.compile(r"\x1b\[(\d+);\d+H")


def test_a_spare_reads_nothing_before_a_tab_takes_it_and_ends_with_its_server(tmp_path):
    """End of file on its stdin (the server stopped or was killed) ends it, silent: no cluster file was read
    (this one does not exist, which the console would refuse in one line), nothing was started."""
    proc = subprocess.Popen([sys.executable, "-m", "sparkconsole.webface.warm", "--cluster",
                             str(tmp_path / "no-such-cluster.yaml"), "console"], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")})
    out, err = proc.communicate(b"", timeout=120)
    assert (proc.returncode, out, err) == (0, b"", b"")
    assert not (tmp_path / "state").exists()


def _replay_console(cfg: Path, module: str) -> str:
    return "exec " + shlex.join([sys.executable, "-m", module, "--cluster", str(cfg), "console", "--replay",
                                 str(RECORDING), "--replay-interval", "0.2"])


async def test_a_tab_gets_the_console_started_ahead_of_it_at_its_own_size(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    server = ConsoleServer(Listen("127.0.0.1", 0), read_only=True, demo=False, cluster=str(tmp_path / "c.yaml"))
    assert server.spare is not None
    assert server.spare.command == server.command.replace(" -m sparkconsole ", " -m sparkconsole.webface.warm ")
    # The tab's console on a recorded session (no node to reach), started ahead of the tab as the server does.
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nodes:\n  - {name: spark1, address: 10.0.0.1}\n")
    server.command = server.tab_command = _replay_console(cfg, "sparkconsole")
    server.spare = SpareConsole(_replay_console(cfg, "sparkconsole.webface.warm"), server.tab_environment,
                                refill_after_s=0.2)
    runner = await server.start_runner()
    try:
        spare = server.spare.waiting
        assert spare is not None and psutil.Process(spare.pid).parent().pid == os.getpid()
        base = f"http://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(base + "/ws?width=100&height=30", origin=base)
            raw = ""

            async def until_drawn() -> None:
                nonlocal raw
                while "°C" not in _ANSI.sub("", raw):
                    msg = await ws.receive(timeout=60)
                    assert msg.type == aiohttp.WSMsgType.BINARY, msg
                    raw += msg.data.decode("utf-8", "replace")
            await until_drawn()
            # It is the spare, drawing at the tab's size (it was started at textual-serve's 80×24).
            assert server.spare.taken == 1 and psutil.pid_exists(spare.pid)
            assert max(int(m) for m in CURSOR_ROW.findall(raw)) == 30
            await until(lambda: server.spare.waiting is not None, 30, "the next spare")
            following = server.spare.waiting
            assert following.pid != spare.pid
            await ws.close()
        await until(lambda: spare.returncode is not None, 30, "the tab's console to end with its tab")
    finally:
        await runner.cleanup()
    assert following.returncode is not None        # stopped with the server


def test_an_attached_viewer_imports_no_http_stack_until_it_has_an_endpoint_to_show():
    code = ("import sys, sparkconsole.collector.attach, sparkconsole.collector.core; "
            "print(sorted(m for m in ('httpx', 'prometheus_client', 'sparkconsole.serving.endpoint') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "[]"), r.stderr


async def test_a_console_started_ahead_starts_its_monitors_before_its_first_frame_and_draws_them_with_it(
        tmp_path, monkeypatch):
    """What webface/warm.py sets once the monitor's layers are imported. The heap keeper still waits for the first
    frame (tui/heap.py)."""
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(SparkConsoleApp, "monitors_before_first_frame", True)
    lines = read_recording(RECORDING)
    made: dict[str, object] = {}

    def factory(cfg):
        made["frame up"] = app.first_frame_at is not None
        made["monitor"] = ClusterMonitor(cfg, transport_factory=replay_factory(lambda n: lines, interval=0.05))
        return made["monitor"]
    heap.hold()
    try:
        app = SparkConsoleApp(cluster(2), monitor_factory=factory)
        start_heap = app.heap.start

        def heap_started() -> None:
            made["heap after the frame"] = app.first_frame_at is not None
            start_heap()
        app.heap.start = heap_started
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.first_frame_at is not None, what="the first frame")
            assert made["frame up"] is False
            panel = app.dashboard.panels["spark1"]
            await wait_for(pilot, lambda: "°C" in widget_text(panel), timeout=30, what="a reading on the panel")
            await wait_for(pilot, gc.isenabled, what="the heap keeper once the frame is up and the monitors run")
            assert made["heap after the frame"] is True
            await pilot.press("q")
    finally:
        heap.unhold()
