"""Freeze early warning, container level, on real parts: a real process in a memory-capped container on the test
bed's Docker engine allocates in steps; the real agent watches it over a real sshd test node (its cgroup's usage
against the cap, every tick). The warning fires before the cap; with protect on, the console's guard stops the
container before the kernel OOM-kills it."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest

from sparkconsole import audit
from sparkconsole.alerts import AlertEngine
from sparkconsole.config import ProtectSettings, Thresholds
from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.protect import Guardian
from sparkconsole.recorder.feed import Recorder
from tests.helpers import until
from tests.testbed.docker import TestbedImage, host_mounts

CAP_MB = 768
STEP_MB = 16
STEP_S = 0.5          # 32 MiB/s: from ~10 MiB to the cap in ~24 s
ALLOCATE = (f"import time\nkeep = []\nwhile True:\n    keep.append(b'x' * ({STEP_MB} << 20))\n"
            f"    time.sleep({STEP_S})\n")

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.timeout(300)]


def start_allocator(engine, image: str) -> str:
    name = f"leak-{uuid.uuid4().hex[:8]}"
    argv = TestbedImage(name=image, mounts=host_mounts(), env=()).run_argv(
        name, ["python3", "-c", ALLOCATE], memory=f"{CAP_MB}m")
    argv[argv.index("--memory"):argv.index("--memory") + 2] = ["--memory", f"{CAP_MB}m", "--memory-swap", f"{CAP_MB}m"]
    engine.run(argv)
    return name


def watched(sshd_nodes, engine, container: str, protect_s: float):
    base = sshd_nodes.cluster_config(interval_s=0.5, nodes=[sshd_nodes[0]],
                                     agent_args=("--gpu-source", "none", "--docker-host", engine.host,
                                                 "--container-interval", "1"))
    node = dataclasses.replace(base.nodes[0], container=container, env=(("DOCKER_HOST", engine.host),))
    return dataclasses.replace(base, nodes=(node,), protect=ProtectSettings(protect_s, "any"))   # started by hand: not launched


async def run_watch(cluster, engine, container, done, recorder=None, pms=()):
    alerts = AlertEngine(Thresholds())
    said: list[tuple[float, str]] = []
    guardian = Guardian(cluster, alerts, recorder=recorder, say=lambda text, sev: said.append((time.time(), text)))
    mon = ClusterMonitor(cluster)
    mon.subscribe(guardian.on_node)
    if recorder is not None:
        recorder.attach(mon)
        recorder.attach_alerts(alerts)
    await mon.start()
    try:
        # each poll runs the docker CLI, blocking the loop the monitor runs on: every 20 ms it was 11 CPU s a test
        await until(lambda: done(engine.inspect(container)["State"], said, guardian), 120, "the container's end",
                    interval=0.5)
        await guardian.wait_actions()
        if recorder is not None:
            await until(lambda: pms, 30, "the post-mortem of the container's exit")
    finally:
        await mon.stop()
    return said, guardian


def finished_at(state: dict) -> float:
    from datetime import datetime
    return datetime.fromisoformat(state["FinishedAt"][:26].rstrip("Z") + "+00:00").timestamp()


async def test_container_warning_fires_before_the_cap(sshd_live, docker_engine, testbed_base_image, tmp_path):
    container = start_allocator(docker_engine, testbed_base_image)
    try:
        cluster = watched(sshd_live, docker_engine, container, 0)
        rec = Recorder.open(cluster, tmp_path / "r.sqlite")
        pms: list[dict] = []
        rec.on_postmortem = pms.append
        try:
            said, _ = await run_watch(cluster, docker_engine, container, lambda st, said, g: st["Status"] != "running",
                                      rec, pms)
        finally:
            await rec.wait_postmortems()
            rec.close()
        state = docker_engine.inspect(container)["State"]
    finally:
        docker_engine.run(["rm", "-f", container], check=False)
    # the recorder's post-mortem of the real OOM kill
    (pm,) = pms
    assert pm["verdict"] == "container-oom-kill" and pm["incident"]["kind"] == "container", pm["evidence"]
    assert f"container {container} exited (exit 137, OOM-killed)" == pm["evidence"][0]
    assert any(a.get("key") == f"exhaust:node1:{container}" for a in pm["alerts"])
    assert state["OOMKilled"] is True, state          # nothing stopped it: the kernel did, at the cap
    warnings = [(t, text) for t, text in said if f"container {container} reaches its 0.8 GiB cap" in text]
    assert warnings, said
    lead = finished_at(state) - warnings[0][0]
    print(f"container warning lead time: {lead:.1f} s before the OOM kill")
    assert lead > 0, (lead, warnings[0])


async def test_protect_stops_the_container_before_the_oom_kill(sshd_live, docker_engine, testbed_base_image,
                                                               tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    container = start_allocator(docker_engine, testbed_base_image)
    try:
        cluster = watched(sshd_live, docker_engine, container, 15)
        said, guardian = await run_watch(cluster, docker_engine, container,
                                         lambda st, said, g: st["Status"] != "running" and g.actions)
        state = docker_engine.inspect(container)["State"]
    finally:
        docker_engine.run(["rm", "-f", container], check=False)
    assert state["OOMKilled"] is False and state["Status"] == "exited", state
    (act,) = guardian.actions
    assert act["result"] == "stopped" and act["container"] == container and act["estimate_s"] <= 15
    assert any("guard: stopping" in text for _, text in said) and any(text.endswith("stopped") for _, text in said)
    (entry,) = [e for e in audit.read() if e.action == "protect-stop"]
    assert entry.node == "node1" and f"docker stop --time 2 {container}" in entry.command
