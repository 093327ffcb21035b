"""Images copied between the real sshd test nodes with `docker save | docker load` (issue 18). Both loopback
nodes would share the test bed's one engine, so node B gets a second engine (its own directory and socket)
through its environment's DOCKER_HOST: the copy crosses from one real engine to another."""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from sparkconsole.distribute import images
from sparkconsole.errors import UserError
from sparkconsole.nodes.connect import make_transport
from tests.testbed.docker import DockerEngine

pytestmark = [pytest.mark.slow, pytest.mark.sshd]


@pytest.fixture(scope="module")
def engine_b():
    engine = DockerEngine(Path(tempfile.mkdtemp(prefix="sc-docker-b-", dir="/tmp")))
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()


def node_env(engine: DockerEngine) -> tuple[tuple[str, str], ...]:
    env = engine.env()
    return (("DOCKER_HOST", env["DOCKER_HOST"]), ("DOCKER_CONFIG", env["DOCKER_CONFIG"]))


async def test_image_pull_save_load_between_two_real_engines(sshd_live, docker_engine, testbed_base_image, engine_b,
                                                             tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    image = testbed_base_image
    cfg = sshd_live.cluster_config()
    ts = [make_transport(replace(n, env=node_env(e)), cfg.ssh) for n, e in zip(cfg.nodes, (docker_engine, engine_b), strict=False)]
    try:
        engine_b.run(["image", "rm", image], check=False)
        before = await asyncio.gather(*(images.state(t, image) for t in ts))
        assert before[0].id and before[1].id is None and before[1].error is None
        seen = []
        report = await images.pull(image, ts, on_progress=lambda p, final: seen.append((p.done, final)))
        assert report.source == "node1" and report.already == ["node1"] and report.copied["node2"] > 0
        assert seen[-1] == (report.copied["node2"], True)
        after = await images.state(ts[1], image)
        assert after.id == before[0].id                          # the same image, loaded in the other engine
        assert engine_b.run(["image", "inspect", image]).returncode == 0
        listed = await images.list_images(ts)
        assert any(row[0] == image for row in listed["node2"])
        again = await images.pull(image, ts)
        assert again.copied == {} and sorted(again.already) == ["node1", "node2"]

        # a node that vanishes mid-copy: one line, and no image left tagged there
        assert (await images.remove(image, ts[1:])) == {"node2": "removed"}

        def vanish(p, final):
            if sshd_live[1].proc and sshd_live[1].proc.poll() is None:
                sshd_live[1].kill()
        with pytest.raises(UserError, match=r"node2") as ei:
            await images.pull(image, ts, on_progress=vanish, chunk=4096)
        assert "\n" not in str(ei.value) and "run the same command again" in str(ei.value)
        assert engine_b.run(["image", "inspect", image], check=False).returncode != 0
    finally:
        await asyncio.gather(*(t.close() for t in ts), return_exceptions=True)


async def test_no_node_has_the_image(sshd_nodes, docker_engine, engine_b, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    cfg = sshd_nodes.cluster_config()
    ts = [make_transport(replace(n, env=node_env(e)), cfg.ssh) for n, e in zip(cfg.nodes, (docker_engine, engine_b), strict=False)]
    try:
        with pytest.raises(UserError, match=r"no node has image sparkconsole-test/absent:1 — fix: build it"):
            await images.pull("sparkconsole-test/absent:1", ts)
        with pytest.raises(UserError, match="bad image name"):
            await images.pull("x; rm -rf /", ts)
    finally:
        await asyncio.gather(*(t.close() for t in ts), return_exceptions=True)
