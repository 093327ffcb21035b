"""One collector per cluster, many viewers (issue 28), on the real sshd test nodes: `sparkconsole record` as a
process holds the one agent per node and writes the recorder file; a console (in this process), `status --watch`
and the exporter (processes) attach to its socket. SIGKILLed, the viewers say so, mark what they show STALE and
go on with agents of their own; the file is sound; a new collector takes over and the viewers attach again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from sparkconsole.config import load_cluster
from sparkconsole.nodes.samples import NodeState
from sparkconsole.recorder.reader import RecorderReader
from sparkconsole.tui.app import SparkConsoleApp
from tests.helpers import free_port, wait_for
from tests.test_recorder import integrity
from tests.test_status import cluster_yaml

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.sshd


def agents(node) -> int:
    """Agent processes running on a test node (the monitor's bootstrap names `_sparkconsole_pynvml`)."""
    n = 0
    for pid in node.session_pids():
        try:
            p = psutil.Process(pid)
            if p.name().startswith("python") and "_sparkconsole_pynvml" in " ".join(p.cmdline()):
                n += 1
        except psutil.Error:
            continue
    return n


class Procs:
    def __init__(self, tmp_path: Path, cfg: Path, env: dict) -> None:
        self.tmp, self.cfg, self.env, self.all = tmp_path, cfg, env, []

    def spawn(self, name: str, *args: str) -> subprocess.Popen:
        out = open(self.tmp / f"{name}.out", "w")
        p = subprocess.Popen([sys.executable, "-m", "sparkconsole", "--cluster", str(self.cfg), *args], cwd=ROOT,
                             env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True)
        self.all.append(p)
        return p

    def record_serving(self, mport: int, sport: int) -> subprocess.Popen:
        """docs/COLLECTOR.md's unit: `record` with the exporter and the browser console in the one process."""
        return self.spawn("record", "record", "--file", str(self.tmp / "rec.sqlite"), "--exporter",
                          f"127.0.0.1:{mport}", "--serve", f"127.0.0.1:{sport}")

    def out(self, name: str) -> str:
        return (self.tmp / f"{name}.out").read_text()

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sparkconsole", "--cluster", str(self.cfg), *args], cwd=ROOT,
                              env=self.env, capture_output=True, text=True, timeout=60)

    def kill_all(self) -> None:
        for p in self.all:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def procs_for(tmp_path: Path, monkeypatch, cfg: Path) -> tuple[Procs, Path]:
    """Processes of the cluster file `cfg` with a state dir of their own (this process's too), and the recorder
    file they are to write."""
    state = tmp_path / "state"
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(state))
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(state), "PYTHONPATH": str(ROOT)}
    return Procs(tmp_path, cfg, env), tmp_path / "rec.sqlite"


def consecutive(seqs: list[int]) -> bool:
    return bool(seqs) and seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:            # not listening yet
        return ""


# Tail (tests/parallel.py): these read a collector's beat and a viewer's stale budget in seconds, with a console
# in the same process; in a full suite's heaviest minutes (load 15-20 on 2 cores) the console's pilot timed out
# waiting for its own screen. They run once the vLLM chains have ended, each on a worker of its own; they compare
# no timings, so they need a light machine, not a quiet one.
@pytest.mark.tail
async def test_one_collector_feeds_every_viewer_and_a_killed_one_is_taken_over(sshd_live, tmp_path, monkeypatch):
    cfg = cluster_yaml(tmp_path / "cluster.yaml", sshd_live, interval=0.25)
    procs, db = procs_for(tmp_path, monkeypatch, cfg)
    nodes = list(sshd_live)
    try:
        collector = procs.spawn("record1", "record", "--file", str(db))
        deadline = time.monotonic() + 60
        while "viewers attach at" not in procs.out("record1") or not all(agents(n) == 1 for n in nodes):
            assert collector.poll() is None and time.monotonic() < deadline, procs.out("record1")
            time.sleep(0.2)
        status = procs.spawn("status", "status", "--watch", "--json", "--timeout", "20")
        port = free_port()
        exporter = procs.spawn("exporter", "exporter", "--listen", f"127.0.0.1:{port}")
        app = SparkConsoleApp(load_cluster(cfg), attach=True, record=True)
        async with app.run_test(size=(160, 50)) as pilot:
            mon = lambda: app.monitor          # noqa: E731 — built after the first frame
            await wait_for(pilot, lambda: mon() is not None and getattr(mon(), "attached", False) and all(
                nm.state == NodeState.LIVE and len(nm.history) >= 2 for nm in mon().nodes.values()), 60,
                "the console attached, both nodes LIVE")
            assert app.recorder is None, "an attached console must not write the recorder file"
            for name, what in (("status", "status"), ("exporter", "exporter")):
                await wait_for(pilot, lambda n=name: "attached to the cluster's collector" in procs.out(n), 60,
                               f"{what} attached")
            await wait_for(pilot, lambda: 'sparkconsole_node_up{node="node2"} 1.0' in metrics(port), 30,
                           "the exporter's nodes up")
            # 1 collector + 3 viewers: one agent per node, and it stays one
            for _ in range(8):
                assert [agents(n) for n in nodes] == [1, 1], "a viewer started an agent of its own"
                await pilot.pause(0.3)
            # the one writer: a second collector is refused in one line naming the first
            second = procs.run("record", "--duration", "1")
            assert second.returncode != 0
            said = [line for line in second.stderr.splitlines() if not line.startswith("cluster: ")]   # where from
            assert len(said) == 1 and "another collector records this cluster already: sparkconsole record " \
                f"(pid {collector.pid}, since " in said[0], second.stderr
            # the recorder holds one stream of ticks per node
            reader = RecorderReader(db)
            for n in ("node1", "node2"):
                seqs = [r["seq"] for r in reader.ticks(n, 0, time.time() + 10)]
                assert len(seqs) >= 8 and consecutive(seqs), (n, seqs[:20])
            reader.close()

            # SIGKILL the collector
            at_loss: list[dict] = []
            unsub = mon().subscribe_status(lambda text, sev: at_loss.append(
                {nm.name: nm.state for nm in mon().nodes.values()}) if text.startswith("lost") else None)
            killed_at = time.time()
            collector.send_signal(signal.SIGKILL)
            collector.wait(10)
            await wait_for(pilot, lambda: not mon().attached, 30, "the console noticing")
            assert mon().status_line.startswith("lost the collector")
            # ... and going on with agents of its own: LIVE on ticks read after the kill
            await wait_for(pilot, lambda: all(nm.state == NodeState.LIVE and nm.last.received > killed_at
                                              for nm in mon().nodes.values()), 60, "the console on its own")
            unsub()
            # never stale data shown as live: the moment the loss is noticed, every node is STALE
            assert at_loss == [{"node1": NodeState.STALE, "node2": NodeState.STALE}], at_loss
            for name in ("status", "exporter"):
                await wait_for(pilot, lambda n=name: "lost the collector" in procs.out(n), 60, f"{name} noticing")
            await wait_for(pilot, lambda: 'sparkconsole_node_up{node="node1"} 1.0' in metrics(port), 60,
                           "the exporter on its own")
            assert status.poll() is None and exporter.poll() is None
            assert integrity(db) == "ok"

            # a new collector takes over; the viewers attach again and stop their own agents
            procs.spawn("record2", "record", "--file", str(db))
            await wait_for(pilot, lambda: mon().attached and mon().attaches == 2, 60, "the console attached again")
            for name in ("status", "exporter"):
                await wait_for(pilot, lambda n=name: "attached again" in procs.out(n), 60, f"{name} attached again")
            await wait_for(pilot, lambda: [agents(n) for n in nodes] == [1, 1], 60, "one agent per node again")
            retaken = time.time()
            await wait_for(pilot, lambda: all(nm.state == NodeState.LIVE and nm.last.received > retaken
                                              for nm in mon().nodes.values()), 30, "live from the new collector")
            await pilot.press("q")
        assert "Traceback" not in procs.out("status") + procs.out("exporter")
    finally:
        procs.kill_all()
    assert integrity(db) == "ok"


def test_record_serves_metrics_and_the_console_from_the_collector(sshd_live, tmp_path):
    """docs/COLLECTOR.md's systemd unit's command line: `record --exporter ADDR --serve ADDR`, one process."""
    cfg = cluster_yaml(tmp_path / "cluster.yaml", sshd_live, interval=0.25)
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    procs = Procs(tmp_path, cfg, env)
    nodes = list(sshd_live)
    mport, sport = free_port(), free_port()
    try:
        collector = procs.record_serving(mport, sport)
        deadline = time.monotonic() + 60
        while not ('sparkconsole_node_up{node="node1"} 1.0' in (text := metrics(mport))
                   and 'sparkconsole_node_up{node="node2"} 1.0' in text):
            assert collector.poll() is None and time.monotonic() < deadline, procs.out("record")
            time.sleep(0.2)
        out = procs.out("record")
        assert f"metrics at http://127.0.0.1:{mport}/metrics" in out and f"the console on http://127.0.0.1:{sport}/" \
            in out, out
        with urllib.request.urlopen(f"http://127.0.0.1:{sport}/", timeout=10) as r:
            assert r.status == 200 and "sparkconsole" in r.read().decode()
        # the exporter inside the collector reads the collector's own monitors: still one agent per node
        assert [agents(n) for n in nodes] == [1, 1]
        # and a status attached to it reads the collector's state at once
        r = procs.run("status", "--json", "--timeout", "20")
        assert r.returncode == 0 and "attached to the cluster's collector" in r.stderr, r.stderr
        assert [agents(n) for n in nodes] == [1, 1]
        collector.send_signal(signal.SIGTERM)
        assert collector.wait(30) == 0, procs.out("record")
        assert "recorded" in procs.out("record") and "Traceback" not in procs.out("record")
    finally:
        procs.kill_all()


async def test_a_viewer_shows_the_collectors_endpoint_polls_and_polls_itself_once_it_is_gone(tmp_path, monkeypatch):
    """The collector's core and socket in this process over a replayed node and a real HTTP server answering like
    vLLM: an attached viewer's endpoint shows the collector's polls (the same snapshots) and polls nothing itself;
    when the collector closes, the viewer says so and polls the endpoint on its own."""
    from sparkconsole.collector.attach import AttachedMonitor
    from sparkconsole.collector.core import Collector
    from sparkconsole.collector.lock import socket_path
    from sparkconsole.collector.roles import RECORD, VIEWER
    from sparkconsole.collector.server import CollectorServer
    from sparkconsole.config import ClusterConfig, EndpointConfig, NodeConfig
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.nodes.replay import replay_factory
    from tests.helpers import until
    from tests.test_endpoint import Server, vllm_routes
    from tests.test_serving_metrics import VllmExporter, seeded_workload

    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    replay = replay_factory(str(ROOT / "tests/fixtures/agent-h100-load.jsonl"), interval=0.1)
    async with Server(vllm_routes(seeded_workload(VllmExporter("v1")))) as srv:
        cluster = ClusterConfig(nodes=(NodeConfig(name="spark1", address="127.0.0.1"),),
                                endpoints=(EndpointConfig(name="vllm1", url=srv.url, node="spark1"),),
                                source=str(tmp_path / "c.yaml"))
        core = Collector(cluster, RECORD, ClusterMonitor(cluster, transport_factory=replay))
        server = CollectorServer(core, socket_path(cluster), info={"pid": os.getpid(), "role": "record"})
        await server.start()
        await core.start()
        viewer_mon = AttachedMonitor(cluster, transport_factory=replay, retry_s=0.2)
        said: list[str] = []
        viewer_mon.subscribe_status(lambda text, sev: said.append(text))
        viewer = Collector(cluster, VIEWER, viewer_mon)
        try:
            await until(lambda: core.serving.endpoints["vllm1"].latest is not None, 20, "the collector's first poll")
            await viewer.start()
            assert viewer_mon.attached and said[-1].startswith("attached to the cluster's collector")
            em = viewer.serving.endpoints["vllm1"]
            await until(lambda: em.latest is not None and viewer_mon.nodes["spark1"].last is not None, 20,
                        "the collector's state in the viewer")
            mine = core.serving.endpoints["vllm1"]
            await until(lambda: em.latest == mine.latest, 20, "the same snapshot on both sides")
            assert em.latest.running == 8 and em._task is None, "an attached viewer must not poll"
            # the collector goes: the viewer says so and polls for itself
            await server.stop()
            await until(lambda: em._task is not None, 20, "the viewer polling on its own")
            assert any(text.startswith("lost the collector") for text in said)
            polled = em.latest.time
            await until(lambda: em.latest.time > polled, 20, "a poll of the viewer's own")
        finally:
            await viewer.stop()
            await core.stop()


@pytest.mark.slow
async def test_two_browser_tabs_attach_to_the_collector(sshd_live, tmp_path):
    """`record --serve --exporter` and two chromium tabs: each tab's console attaches (says so on screen) and
    shows the nodes' readings; still one agent per node. (Time to the first reading: benchmarks/tab_open.py.)"""
    import re

    from tests.helpers import until
    from tests.test_serve import CHROMIUM, CHROMIUM_ARGS, Screen, _need_browser

    pw_api = _need_browser()
    cfg = cluster_yaml(tmp_path / "cluster.yaml", sshd_live, interval=0.25)
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    procs = Procs(tmp_path, cfg, env)
    nodes = list(sshd_live)
    mport, sport = free_port(), free_port()
    try:
        record = procs.record_serving(mport, sport)
        await until(lambda: 'sparkconsole_node_up{node="node2"} 1.0' in metrics(mport), 60, "the collector up")
        async with pw_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                screens = []
                for _ in range(2):
                    page = await browser.new_page(viewport={"width": 1600, "height": 1000})
                    await page.route(re.compile(r"^(?!https?://127\.0\.0\.1[:/]|ws://127\.0\.0\.1[:/]).*"),
                                     lambda route: route.abort())
                    screen = Screen()
                    page.on("websocket", screen.on_ws)
                    await page.goto(f"http://127.0.0.1:{sport}/")
                    screens.append(screen)
                for screen in screens:
                    await until(lambda s=screen: "GiB free" in s.text and "attached to the cluster's collector"
                                in " ".join(s.text.split()), 120, "a tab attached, with the nodes' readings")
                assert [agents(n) for n in nodes] == [1, 1]
                # SIGKILL the collector with the tabs open: their consoles end with it instead of running on, and
                # so does the console it keeps started for the next tab (webface/spare.py)
                tabs = [c for c in psutil.Process(record.pid).children(recursive=True)
                        if "console" in " ".join(c.cmdline())]
                assert len(tabs) >= 2, [c.cmdline() for c in tabs]
                record.kill()
                record.wait(10)
                def left() -> list[str]:
                    out = []
                    for c in tabs:
                        try:
                            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE:
                                out.append(f"{c.pid} {c.status()} {' '.join(c.cmdline())[-120:]}")
                        except psutil.NoSuchProcess:
                            continue
                    return out
                try:
                    await until(lambda: not left(), 90, "the tabs' consoles to end with their server")
                except BaseException:
                    print("still running:", *left(), sep="\n  ")
                    raise
            finally:
                await browser.close()
    finally:
        procs.kill_all()


# Open: run right after the test above in one process it hung until pytest's timeout once in three runs (alone it
# passes in 9 s); the cause is not found, so a hang is reported here, not fatal, and costs 90 s, not 300.
@pytest.mark.tail
@pytest.mark.timeout(90)
@pytest.mark.xfail(strict=False, reason="hung once after the collector takeover test in the same process (cause open)")
async def test_a_frozen_collector_is_counted_gone(sshd_live, tmp_path, monkeypatch):
    """SIGSTOP (no socket closed): the viewer hears no beat, says so, shows STALE and watches on its own; the
    collector thawed, the viewer attaches again."""
    from sparkconsole.collector.attach import AttachedMonitor
    from tests.helpers import until

    cfg = cluster_yaml(tmp_path / "cluster.yaml", sshd_live, interval=0.25)
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    procs = Procs(tmp_path, cfg, env)
    collector = procs.spawn("record", "record", "--file", str(tmp_path / "rec.sqlite"))
    mon = AttachedMonitor(load_cluster(cfg), retry_s=0.5)
    said: list[str] = []
    mon.subscribe_status(lambda text, sev: said.append(text))
    try:
        await until(lambda: "viewers attach at" in procs.out("record"), 60, "the collector up")
        await mon.start()
        assert mon.attached
        await until(lambda: all(nm.state == NodeState.LIVE for nm in mon.nodes.values()), 30, "LIVE, attached")
        collector.send_signal(signal.SIGSTOP)
        await until(lambda: not mon.attached, 30, "the frozen collector noticed")
        assert any("not a word from it" in text for text in said), said
        await until(lambda: [agents(n) for n in sshd_live] == [2, 2] and all(
            nm.state == NodeState.LIVE for nm in mon.nodes.values()), 60, "the viewer's own agents")
        collector.send_signal(signal.SIGCONT)
        await until(lambda: mon.attached and [agents(n) for n in sshd_live] == [1, 1], 60, "attached again")
    finally:
        collector.send_signal(signal.SIGCONT)
        await mon.stop()
        procs.kill_all()


def test_record_refuses_an_open_exporter_address_before_it_starts(tmp_path):
    """Off loopback with nobody asked who comes in: one line naming --exporter, and no collector started (no lock
    left taken, nothing recorded)."""
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path),
           "PYTHONPATH": str(ROOT)}
    env.pop("SPARKCONSOLE_EXPORTER_TOKEN", None)
    r = subprocess.run([sys.executable, "-m", "sparkconsole", "record", "--file", str(tmp_path / "r.sqlite"),
                        "--exporter", f"0.0.0.0:{free_port()}"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    said = [line for line in r.stderr.splitlines() if not line.startswith("cluster: ")]
    assert r.returncode == 2 and len(said) == 1 and "--exporter" in said[0] and "fix:" in said[0], r.stderr
    assert not (tmp_path / "r.sqlite").exists() and "recording" not in r.stdout


def lock_holder(lock: Path) -> int | None:
    """The pid holding the flock on `lock` now (/proc/locks), or None."""
    try:
        ino = lock.stat().st_ino
    except FileNotFoundError:
        return None
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if len(f) > 5 and f[1] == "FLOCK" and f[5].rsplit(":", 1)[-1] == str(ino):
            return int(f[4])
    return None


def max_gap(db: Path, node: str, since: float, until: float) -> tuple[float, float]:
    """(longest time between consecutive recorded ticks of `node` in [since, until], when it began)."""
    reader = RecorderReader(db)
    try:
        ts = sorted(r["t"] for r in reader.ticks(node, since, until))
    finally:
        reader.close()
    gaps = [(b - a, a) for a, b in zip(ts, ts[1:], strict=False)]
    return max(gaps, default=(until - since, since))


GAP_BOUND_S = 15.0       # the takeover's hole: the console's own agents connecting (seconds on a loaded machine)
ALONE_S = 20.0           # how long the console is left alone: a console that does not record leaves this hole


@pytest.mark.tail
async def test_a_console_alone_takes_the_collectors_duties_and_hands_them_back(sshd_live, tmp_path, monkeypatch):
    """Issue 40 item 4, with a real `sparkconsole record` SIGKILLed under a running console and then started again:
    the console takes over recording (into the collector's file), the opt-in guard and the notifications while it
    is alone, says on screen whose duties they are, and hands them back; the recording has no hole beyond the
    takeover's, never two writers, and an alert raised while alone is sent once — not again by the collector that
    takes over, which sends its clear."""
    from sparkconsole.collector.lock import LOCK_NAME, collector_dir
    from tests.test_notify import TOKEN, Receiver

    rx = Receiver()
    cfg = cluster_yaml(tmp_path / "cluster.yaml", sshd_live, interval=0.25)
    with open(cfg, "a") as fh:
        fh.write(f"notify: {{webhook: '{rx.url}/hook/{TOKEN}', rate_limit_s: 600}}\n"
                 "protect: {stop_container_before_exhaustion_s: 45}\n")
    procs, db = procs_for(tmp_path, monkeypatch, cfg)
    cluster = load_cluster(cfg)
    lock = collector_dir(cluster) / LOCK_NAME
    node2 = sshd_live[1]

    def hooks(state: str) -> list[dict]:
        import json
        return [h for h in (json.loads(b) for _, _, b in rx.got) if h["key"] == "node:node2:state"
                and h["state"] == state]
    try:
        record1 = procs.spawn("record1", "record", "--file", str(db))
        await until_out(procs, "record1", "viewers attach at", record1)
        app = SparkConsoleApp(cluster, attach=True, record=True)
        async with app.run_test(size=(200, 50)) as pilot:
            mon = lambda: app.monitor          # noqa: E731 — built after the first frame
            await wait_for(pilot, lambda: mon() is not None and mon().attached and all(
                nm.state == NodeState.LIVE for nm in mon().nodes.values()), 60, "the console attached, LIVE")
            started = time.time()
            # attached: every duty is the collector's, and the header says so
            await wait_for(pilot, lambda: f"recording, guard and notifications: the collector (pid {record1.pid})"
                           in app.sub_title, 30, "the header naming the collector")
            assert app.recorder is None and app.notifier is None and app.core.guardian.threshold_s == 0
            assert lock_holder(lock) == record1.pid

            # the collector SIGKILLed: the console takes the duties over, into the collector's own file
            record1.send_signal(signal.SIGKILL)
            record1.wait(10)
            killed = time.time()
            await wait_for(pilot, lambda: app.recorder is not None, 30, "the console recording")
            took_s = time.time() - killed
            assert app.recorder.store.path == db
            assert "recording, guard and notifications: this console (collector gone)" in app.sub_title
            assert app.core.guardian.threshold_s == 45 and app.notifier is not None     # the guard acts, it notifies
            assert lock_holder(lock) == os.getpid()

            # an alert raised while alone is sent, once
            node2.kill()
            await wait_for(pilot, lambda: hooks("raised"), 60, "node2's alert at the webhook")
            while time.time() < killed + ALONE_S:
                assert app.core.guardian.threshold_s == 45 and app.recorder is not None
                await pilot.pause(0.5)
            assert len(hooks("raised")) == 1, hooks("raised")

            # the collector comes back: it waits for the console, which hands everything back once attached
            record2 = procs.spawn("record2", "record", "--file", str(db))
            writers: list[tuple[int | None, bool]] = []
            while not (mon().attached and app.recorder is None and lock_holder(lock) == record2.pid):
                writers.append((lock_holder(lock), app.recorder is not None))
                assert record2.poll() is None and time.time() < killed + ALONE_S + 90, procs.out("record2")
                await pilot.pause(0.05)
            handed = time.time()
            # never two writers: the console wrote only while it held the lock, the collector took it after
            assert not any(holder == record2.pid and mine for holder, mine in writers), writers
            out = procs.out("record2")
            assert f"waiting for sparkconsole console (pid {os.getpid()}" in out, out
            await until_out(procs, "record2", "took over recording, guard and notifications from sparkconsole console",
                            record2)
            await wait_for(pilot, lambda: f"recording, guard and notifications: the collector (pid {record2.pid})"
                           in app.sub_title, 30, "the header naming the collector again")
            assert app.notifier is None and app.core.guardian.threshold_s == 0

            # the collector's own rules raise node2's alert again: not sent twice; its clear is sent, once
            await until_out(procs, "record2", "node2 DOWN", record2)
            await pilot.pause(2)
            assert len(hooks("raised")) == 1, hooks("raised")
            node2.restart()
            await wait_for(pilot, lambda: hooks("cleared"), 60, "node2's clear at the webhook")
            await pilot.pause(2)
            assert len(hooks("cleared")) == 1 and len(hooks("raised")) == 1, rx.got

            # the recording: node1's ticks without a hole past the takeover's, through the handback too
            await pilot.pause(3)
            gap, at = max_gap(db, "node1", started, time.time() - 1)
            print(f"\ntakeover after the kill: {took_s:.2f} s; longest hole in node1's ticks: {gap:.2f} s at "
                  f"{at - killed:+.2f} s from the kill (handback {handed - killed:+.2f} s)")
            assert gap <= GAP_BOUND_S, (gap, at - killed)
            await pilot.press("q")
        assert record2.poll() is None
    finally:
        procs.kill_all()
        rx.close()
    assert integrity(db) == "ok"


async def until_out(procs: Procs, name: str, text: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    import asyncio
    deadline = time.monotonic() + timeout
    while text not in procs.out(name):
        assert proc.poll() is None and time.monotonic() < deadline, procs.out(name)
        await asyncio.sleep(0.1)
