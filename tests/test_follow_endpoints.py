"""The console polls where a launch serves: a recipe's own port moves its node's endpoint, a router adds one.

The labels come from the plan (`sparkconsole.url`), the containers from a real Docker engine read by the real
agent, the endpoint from a loopback HTTP server answering with /metrics recorded from a real vLLM 0.32 (CPU)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkconsole.config import ClusterConfig, EndpointConfig, NodeConfig
from sparkconsole.launch.plan import make_plan
from sparkconsole.nodes.launches import LaunchGroup, Member, served_endpoints
from sparkconsole.recipes import find_recipe
from tests.helpers import recorded_vllm_endpoint, wait_for
from tests.test_tui_app import widget_text


def node_eps(*names: str, port: int = 8000) -> tuple[EndpointConfig, ...]:
    return tuple(EndpointConfig(n, f"http://10.0.0.{i + 1}:{port}", node=n) for i, n in enumerate(names))


def group(topology: str, *members: Member) -> LaunchGroup:
    return LaunchGroup("r", topology, members, "SERVING", "")


def m(node: str, role: str, url: str | None) -> Member:
    return Member(node, role, f"c-{node}-{role}", "running", url=url)


def test_a_recipe_port_moves_its_nodes_endpoint_and_a_router_is_added():
    configured = node_eps("spark1", "spark2")
    got = served_endpoints([group("2x-solo", m("spark1", "server", "http://10.0.0.1:54351"),
                                  m("spark2", "server", "http://10.0.0.2:54351"),
                                  m("spark1", "router", "http://10.0.0.1:4000"))], configured)
    by = {e.name: e for e in got}
    assert by["spark1"].url == "http://10.0.0.1:54351" and by["spark2"].url == "http://10.0.0.2:54351"
    assert by["spark1 router"].url == "http://10.0.0.1:4000" and by["spark1 router"].kind == "router"
    assert len(got) == 3


def test_nothing_launched_or_already_polled_leaves_the_cluster_files_endpoints():
    configured = node_eps("spark1", "spark2")
    assert served_endpoints([], configured) == configured
    same = group("solo", m("spark1", "server", "http://10.0.0.1:8000"))
    assert served_endpoints([same], configured) == configured
    # a headless tensor-parallel rank serves nothing
    tp = group("cluster-tp2", m("spark1", "server", "http://10.0.0.1:8000"), m("spark2", "worker", None))
    assert served_endpoints([tp], configured) == configured


def test_disagg_moves_each_sides_node_and_a_second_server_on_one_node_is_added():
    configured = node_eps("spark1", "spark2")
    got = {e.name: e for e in served_endpoints(
        [group("disagg", m("spark1", "prefill", "http://10.0.0.1:8100"), m("spark2", "decode", "http://10.0.0.2:8200"),
               m("spark1", "router", "http://10.0.0.1:8000"))], configured)}
    # the router took the port the cluster file polls on spark1: that endpoint stays; prefill is added beside it
    assert got["spark1"].url == "http://10.0.0.1:8000" and got["spark1"].kind == "router"
    assert got["spark1 prefill"].url == "http://10.0.0.1:8100"
    assert got["spark2"].url == "http://10.0.0.2:8200"
    two = {e.name: e for e in served_endpoints(
        [group("solo", m("spark1", "server", "http://10.0.0.1:9001")),
         group("solo", m("spark1", "server", "http://10.0.0.1:9002"))], configured)}
    assert two["spark1"].url == "http://10.0.0.1:9001" and two["spark1 server"].url == "http://10.0.0.1:9002"


def test_the_plan_labels_every_serving_container_with_its_url():
    recipe = find_recipe("tiny-testbed")
    nodes = (NodeConfig("spark1", "10.0.0.1", role="head"), NodeConfig("spark2", "10.0.0.2"))
    cfg = ClusterConfig(nodes=nodes, endpoints=node_eps("spark1", "spark2"))
    plan = make_plan(recipe, "2x-solo", cfg, {"port": 54351})
    labelled = {}
    for step in plan.steps:
        argv = list(step.argv)
        if argv[:2] == ["docker", "run"]:
            labels = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--label")
            labelled[labels["sparkconsole.role"] + "@" + labels["sparkconsole.node"]] = labels.get("sparkconsole.url")
    assert labelled["server@spark1"] == "http://10.0.0.1:54351"
    assert labelled["server@spark2"] == "http://10.0.0.2:54351"
    assert labelled["router@spark1"].startswith("http://10.0.0.1:")


async def test_the_serving_monitor_follows_moves_and_drops_endpoints():
    from sparkconsole.serving.endpoint import ServingMonitor
    runner, url = await recorded_vllm_endpoint()
    dead = EndpointConfig("spark1", "http://127.0.0.1:9", node="spark1")
    mon = ServingMonitor(ClusterConfig(nodes=(NodeConfig("spark1", "127.0.0.1"),), endpoints=(dead,)), interval=0.1)
    try:
        await mon.start()
        moved = EndpointConfig("spark1", url, node="spark1")
        extra = EndpointConfig("spark1 router", url, kind="router", node="spark1")
        assert await mon.follow([moved, extra]) == (["spark1 router"], ["spark1"], [])
        import asyncio
        for _ in range(200):
            snap = mon.endpoints["spark1"].latest
            if snap is not None and snap.healthy and snap.model == "tiny-llama":
                break
            await asyncio.sleep(0.05)
        assert mon.endpoints["spark1"].latest.model == "tiny-llama"
        assert await mon.follow([moved, extra]) == ([], [], [])
        assert await mon.follow([dead]) == ([], ["spark1"], ["spark1 router"])
        assert set(mon.endpoints) == {"spark1"} and mon.endpoints["spark1"].config.url == "http://127.0.0.1:9"
    finally:
        await mon.stop()
        await runner.cleanup()


@pytest.mark.slow       # a real Docker engine and the real agent: ~6 s on 2 cores
async def test_console_panels_follow_a_labelled_container_on_a_real_engine(docker_engine, testbed_base_image):
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.tui.app import SparkConsoleApp
    runner, url = await recorded_vllm_endpoint()
    router_runner, router_url = await recorded_vllm_endpoint()
    names = ("sc-follow-server", "sc-follow-router")
    env = {**docker_engine.env(), "PATH": f"{Path(docker_engine.cli).parent}:{os.environ['PATH']}"}
    node = NodeConfig("spark1", "127.0.0.1", role="head", local=True, env=tuple(env.items()))
    cfg = ClusterConfig(nodes=(node,), endpoints=(EndpointConfig("spark1", "http://127.0.0.1:9", node="spark1"),),
                        source="test-follow.yaml")
    mount = ["--mount", "type=bind,source=/usr,target=/usr,readonly"]

    def start(name: str, role: str) -> None:
        docker_engine.run(["rm", "-f", name], check=False)
        docker_engine.run(["run", "--detach", "--name", name, "--init", "--network", "host", *mount,
                           "--label", "sparkconsole.recipe=follow-test", "--label", "sparkconsole.topology=2x-solo",
                           "--label", f"sparkconsole.role={role}", "--label", "sparkconsole.node=spark1",
                           "--label", f"sparkconsole.url={router_url if role == 'router' else url}",
                           testbed_base_image, "/usr/bin/sleep", "300"])
    try:
        start(names[0], "server")
        start(names[1], "router")
        app = SparkConsoleApp(cfg, monitor=ClusterMonitor(cfg))
        async with app.run_test(size=(160, 60)) as pilot:
            dash = app.dashboard
            await wait_for(pilot, lambda: "tiny-llama" in widget_text(dash.endpoint_panels["spark1"]), timeout=60,
                           what="the node's endpoint polled at the launch's URL")
            await wait_for(pilot, lambda: "spark1 router" in dash.endpoint_panels, timeout=30, what="the router panel")
            assert any("where the launch serves" in e for e in dash.events.history)
            docker_engine.run(["rm", "-f", names[1]], check=False)
            await wait_for(pilot, lambda: "spark1 router" not in dash.endpoint_panels, timeout=60,
                           what="the router panel gone with its container")
            # its widget leaves the screen on a later refresh (a removal is asynchronous in Textual)
            await wait_for(pilot, lambda: not app.query("#ep-spark1_router"), timeout=30,
                           what="the router panel's widget removed")
            docker_engine.run(["rm", "-f", names[0]], check=False)
            await wait_for(pilot, lambda: app.serving.endpoints["spark1"].config.url == "http://127.0.0.1:9",
                           timeout=60, what="the cluster file's endpoint again")
            await pilot.press("q")
    finally:
        for name in names:
            docker_engine.run(["rm", "-f", name], check=False)
        await runner.cleanup()
        await router_runner.cleanup()
