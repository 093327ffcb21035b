"""Runaways on the simulator, watched the way the console watches (tui/app.py's _start_guard, headless): the real
agent over the local transport, the ClusterMonitor, the flight recorder with post-mortems, the alert engine and the
Guardian's exhaustion forecasts. Each kind must end in its post-mortem verdict: memory → unified-memory exhaustion
(warned before the freeze), thermal → thermal, link → network loss with the other node still ticking."""

from __future__ import annotations

import dataclasses
import time

import aiohttp
import pytest

from sparkconsole.alerts import AlertEngine
from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.nodes.samples import NodeState
from sparkconsole.protect import Guardian
from sparkconsole.recorder.feed import Recorder
from sparkconsole.sim.cluster import Serving, SimCluster
from tests.helpers import until

KEEPALIVE_S = 3.0       # the simulated SSH keepalive: a hung node reads STALE this long before DOWN


class Watch:
    """What the console runs below its TUI, on a simulated cluster."""

    def __init__(self, sim: SimCluster, path, *, protect_s: float | None = None) -> None:
        self.cluster = sim.cluster
        if protect_s is not None:
            self.cluster = dataclasses.replace(self.cluster, protect=dataclasses.replace(
                self.cluster.protect, stop_container_before_exhaustion_s=protect_s))
        self.rec = Recorder.open(self.cluster, path)
        self.pms: list[dict] = []
        self.rec.on_postmortem = self.pms.append
        self.alerts = AlertEngine(self.cluster.thresholds)
        self.raised: list[tuple[float, object]] = []
        self.alerts.subscribe(lambda a: self.raised.append((time.time(), a)))
        self.rec.attach_alerts(self.alerts)
        self.mon = ClusterMonitor(self.cluster)
        self.rec.attach(self.mon)
        self.said: list[tuple[str, str]] = []
        self.guardian = Guardian(self.cluster, self.alerts, recorder=self.rec,
                                 say=lambda text, sev: self.said.append((sev, text)))
        self.mon.subscribe(self.guardian.on_node)

    async def __aenter__(self) -> Watch:
        await self.mon.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.mon.stop()
        await self.rec.wait_postmortems()
        self.rec.close()

    def ticking(self, n: int = 6) -> bool:
        return all(nm.state == NodeState.LIVE and len(nm.history) >= n for nm in self.mon.nodes.values())

    def postmortem(self, node: str) -> dict | None:
        return next((pm for pm in self.pms if pm["node"] == node), None)


async def answers(url: str, timeout: float = 2.0) -> bool:
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health", timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                return r.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


@pytest.mark.slow
async def test_memory_runaway_warns_then_freezes_and_reads_as_memory_exhaustion(tmp_path):
    sim = SimCluster(speed=1.0, load_speedup=200, serving=Serving(topology="solo"), keepalive_s=KEEPALIVE_S)
    await sim.start()
    try:
        url = sim.cluster.endpoints[0].url
        async with Watch(sim, tmp_path / "r.sqlite", protect_s=0) as w:      # the guard off: the freeze
            await until(w.ticking, 30, "both nodes ticking")
            rw = sim.runaway("spark1", "memory", duration_s=20)
            await until(lambda: rw.over, 90, "the memory runaway's end")
            assert rw.outcome == "frozen", rw.notes
            assert not await answers(url), "a frozen node's endpoint still answers"
            spark1 = w.mon.nodes["spark1"]
            await until(lambda: spark1.state == NodeState.STALE or w.postmortem("spark1"), 30, "spark1 STALE (hung)")
            await until(lambda: w.postmortem("spark1"), 30, "the post-mortem of spark1")
        pm = w.postmortem("spark1")
        assert pm["verdict"] == "memory-exhaustion", pm["evidence"]
        ev = " | ".join(pm["evidence"])
        assert "MemAvailable fell" in ev and "hung (STALE, then DOWN" in ev, ev
        assert pm["other_nodes_ticking"] == {"spark2": True}
        # The warning came from the readings alone, before the freeze.
        warned = [t for t, a in w.raised if a.key == "exhaust:spark1:node" and a.active]
        assert warned and warned[0] < rw.ended_at, (w.raised, rw.ended_at)
        lead = rw.ended_at - warned[0]
        print(f"memory runaway: exhaustion warned {lead:.1f} s before the freeze")
        assert lead > 3.0
        assert any("exhaustion warning was active" in e for e in pm["evidence"])
    finally:
        await sim.stop()


@pytest.mark.slow
async def test_thermal_runaway_shuts_the_node_down_and_reads_as_thermal(tmp_path):
    sim = SimCluster(speed=4.0, load_speedup=200, serving=Serving(topology="none"), keepalive_s=KEEPALIVE_S)
    await sim.start()
    try:
        async with Watch(sim, tmp_path / "r.sqlite") as w:
            await until(w.ticking, 30, "both nodes ticking")
            rw = sim.runaway("spark2", "thermal")
            await until(lambda: w.postmortem("spark2"), 60, "the post-mortem of spark2")
        assert rw.outcome == "shutdown", rw.notes
        pm = w.postmortem("spark2")
        assert pm["verdict"] == "thermal", pm["evidence"]
        assert {"sw_thermal", "hw_slowdown", "hw_thermal"} <= set(pm["clock_reasons"]), pm["clock_reasons"]
        assert pm["series"]["temp_c"]["max"] >= 94
        assert any("the agent's stream ended" in e for e in pm["evidence"]), pm["evidence"]
    finally:
        await sim.stop()


@pytest.mark.slow
async def test_link_cut_hangs_the_node_and_reads_as_network_loss(tmp_path):
    sim = SimCluster(speed=1.0, load_speedup=200, serving=Serving(topology="solo"), keepalive_s=KEEPALIVE_S)
    await sim.start()
    try:
        url = sim.cluster.endpoints[0].url
        async with Watch(sim, tmp_path / "r.sqlite") as w:
            await until(w.ticking, 30, "both nodes ticking")
            assert await answers(url)
            rw = sim.runaway("spark1", "link")
            await until(lambda: rw.over, 30, "the link cut")
            assert not await answers(url), "a cut node's endpoint still answers"
            await until(lambda: w.postmortem("spark1"), 30, "the post-mortem of spark1")
            assert w.mon.nodes["spark2"].state == NodeState.LIVE
        pm = w.postmortem("spark1")
        assert pm["verdict"] == "network-loss", pm["evidence"]
        assert pm["evidence"][0] == "other node(s) kept ticking: spark2"
        assert any("the agent's stream hung (STALE, then DOWN" in e for e in pm["evidence"]), pm["evidence"]
        assert pm["other_nodes_ticking"] == {"spark2": True}
    finally:
        await sim.stop()


@pytest.mark.slow
async def test_the_guard_stops_the_container_that_grew_and_the_node_does_not_freeze(tmp_path, monkeypatch):
    """The guard, on by default, stops a container this console launched (the demo's: its recipe's labels) whose GPU
    memory grows while its cap, which does not see that memory, never fires; the post-mortem names it."""
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))     # the guard's audit log
    sim = SimCluster(speed=1.0, load_speedup=200, serving=Serving(topology="solo", recipe="gpt-oss-120b"),
                     keepalive_s=KEEPALIVE_S)
    await sim.start()
    try:
        # the guard on for launched containers, as by default; at 30 s rather than the default 15, a margin for this
        # 20-s accelerating runaway on a shared 2-core machine
        async with Watch(sim, tmp_path / "r.sqlite", protect_s=30) as w:
            await until(w.ticking, 30, "both nodes ticking")
            rw = sim.runaway("spark1", "memory", duration_s=20)
            await until(lambda: rw.over, 90, "the memory runaway's end")
            assert rw.outcome == "averted", rw.notes
            await w.guardian.wait_actions()
            (act,) = w.guardian.actions
            assert act["node"] == "spark1" and act["container"] == "vllm_node" and act["result"] == "stopped", act
            assert any(text.startswith("SIMULATED: guard: stopping vllm_node on spark1") for _, text in w.said)
            # what grew is named: the vLLM process's GPU memory (NVML per process, mapped to its container through
            # the node's /proc/PID/cgroup), its cgroup flat under its cap, which never fired
            assert act["grower"].startswith("vllm_node +") and "(PID " in act["grower"] and " vllm)" in act["grower"]
            assert "GPU memory +" in act["grower"] and "of its 100.0 GiB cap" in act["grower"]
            assert not [a for t, a in w.raised if a.key == "exhaust:spark1:vllm_node"]
            spark1 = w.mon.nodes["spark1"]
            seen = len(spark1.history)
            await until(lambda: len(spark1.history) >= seen + 6, 30, "spark1 ticking on")
            assert spark1.state == NodeState.LIVE and sim.nodes["spark1"].silence is None
            assert spark1.last.mem.available_kb > 100 << 20      # the leak went with the container
            await until(lambda: w.postmortem("spark1"), 30, "the post-mortem of the stop")
        pm = w.postmortem("spark1")
        assert pm["verdict"] == "guard-stop", pm["evidence"]
        assert pm["evidence"][0].startswith("the guard stopped vllm_node")
        assert pm["evidence"][1].startswith("vllm_node grew") and "the cap did not see the GPU memory" in pm["evidence"][1]
    finally:
        await sim.stop()
