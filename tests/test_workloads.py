"""Several workloads on one cluster, headless: each launch named and labelled (workload, model, claim), planned
again from its labels as it was launched, one endpoint panel per workload, the gateway's config and container (a
LiteLLM model group per served name, started through the container spec with a router's cap, as the routers are:
issue 41 item 3), and each node's budget bar as the console draws it."""

from __future__ import annotations

import json

import yaml

from sparkconsole.config import ClusterConfig, EndpointConfig, GatewaySettings, NodeConfig
from sparkconsole.errors import UserError
from sparkconsole.launch import gateway
from sparkconsole.launch.plan import make_plan
from sparkconsole.launch.workloads import parse_inspect, plan_of, replan_options, resolve
from sparkconsole.nodes.launches import launch_groups, served_endpoints
from sparkconsole.placement.bars import CLAIM, FREE, HELD, OTHER, RESERVE, cells, node_bar
from sparkconsole.placement.budget import NodeBudget
from sparkconsole.placement.fit import GIB, Running
from sparkconsole.recipes import find_recipe

NODES = (NodeConfig("spark1", "10.0.0.1", role="head", container="vllm_a"), NodeConfig("spark2", "10.0.0.2"))
CLUSTER = ClusterConfig(nodes=NODES, endpoints=(), source="<test>")


def labels_of(argv) -> dict[str, str]:
    argv = list(argv)
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--label")


def docker_runs(plan):
    return [s for s in plan.steps if list(s.argv[:2]) == ["docker", "run"]]


def inspect_json(plan) -> str:
    """`docker inspect` as the engine answers for the plan's containers (their names, labels, running)."""
    docs = []
    for st in docker_runs(plan):
        argv = list(st.argv)
        docs.append({"Name": "/" + argv[argv.index("--name") + 1], "State": {"Status": "running", "ExitCode": 0,
                                                                             "OOMKilled": False},
                     "Config": {"Labels": {**labels_of(argv), "com.other": "x"}}})
    return json.dumps(docs)


class Node:
    def __init__(self, name, containers):
        self.name, self.containers = name, containers


def test_a_named_workload_gets_its_own_containers_and_labels_and_is_planned_again_from_them():
    tiny = find_recipe("tiny-testbed")
    plan = make_plan(tiny, "2x-solo", CLUSTER, {"workload": "coder", "router": "vllm-router", "port": 9001,
                                                "router_port": 4100, "claims": {"spark1": 3 * GIB}})
    assert plan.name == "coder" and plan.model == "tiny-llama"
    run = {labels_of(s.argv)["sparkconsole.role"] + "@" + labels_of(s.argv)["sparkconsole.node"]: s
           for s in docker_runs(plan)}
    assert labels_of(run["server@spark1"].argv)["sparkconsole.workload"] == "coder"
    assert labels_of(run["server@spark1"].argv)["sparkconsole.claim"] == str(3 * GIB)
    assert "sparkconsole.claim" not in labels_of(run["server@spark2"].argv)
    assert labels_of(run["router@spark1"].argv)["sparkconsole.model"] == "tiny-llama"
    assert {s.container for s in plan.services} == {"vllm_a_coder", "vllm_node_coder", "vllm_a_coder_router"}
    # the running containers, read back (docker inspect) and grouped, plan the same workload again
    seen = parse_inspect(inspect_json(plan))
    assert all(k.startswith("sparkconsole.") for c in seen for k, _ in c.labels)
    (g,) = launch_groups([Node("spark1", seen)])
    assert (g.name, g.model, g.router, g.endpoint) == ("coder", "tiny-llama", "vllm-router", "http://10.0.0.1:4100")
    opts = replan_options(g)
    assert opts == {"workload": "coder", "nodes": ["spark1", "spark2"], "port": 9001, "router": "vllm-router",
                    "router_port": 4100, "container_names": {"spark1": "vllm_a_coder", "spark2": "vllm_node_coder"}}
    again = make_plan(tiny, "2x-solo", CLUSTER, opts)
    assert {s.container for s in again.services} == {s.container for s in plan.services}
    assert again.endpoint == plan.endpoint
    # stop and status need no recipe: the plan of its containers alone, routers with their own health path
    stop = plan_of(g)
    assert {s.container for s in stop.services} == {s.container for s in plan.services} and stop.steps == ()


def test_the_default_name_keeps_the_recipes_containers_and_a_name_that_does_not_run_is_refused():
    tiny = find_recipe("tiny-testbed")
    plan = make_plan(tiny, "solo", CLUSTER, {})
    assert plan.name == "tiny-testbed" and plan.services[0].container == "vllm_a"
    try:
        make_plan(tiny, "solo", CLUSTER, {"workload": "bad name!"})
    except UserError as err:
        assert "bad workload name" in str(err) and "--name" in str(err)
    else:
        raise AssertionError("a bad workload name was planned")
    (a,) = launch_groups([Node("spark1", parse_inspect(inspect_json(plan)))])
    other = make_plan(tiny, "solo", CLUSTER, {"workload": "b", "nodes": ["spark2"]})
    (b,) = launch_groups([Node("spark2", parse_inspect(inspect_json(other)))])
    assert resolve([a, b], "b") is b and resolve([a, b], "nope") is None
    assert resolve([a, b], "tiny-testbed", recipe_key="tiny-testbed") is a
    try:
        resolve([a, b], "tiny", recipe_key="tiny-testbed")
    except UserError as err:
        assert "2 workloads run from recipe tiny-testbed: tiny-testbed, b" in str(err)
    else:
        raise AssertionError("two workloads of one recipe resolved to one")


def test_each_named_workload_is_one_endpoint_panel_and_its_servers_behind_the_router_are_named_after_it():
    tiny = find_recipe("tiny-testbed")
    pair = make_plan(tiny, "2x-solo", CLUSTER, {"workload": "chat", "router": "vllm-router", "port": 9001})
    solo = make_plan(tiny, "solo", CLUSTER, {"workload": "emb", "nodes": ["spark1"], "port": 9002})
    groups = launch_groups([Node("spark1", parse_inspect(inspect_json(pair)) + parse_inspect(inspect_json(solo)))])
    configured = (EndpointConfig("spark1", "http://10.0.0.1:8000", node="spark1"),
                  EndpointConfig("spark2", "http://10.0.0.2:8000", node="spark2"))
    got = {e.name: e.url for e in served_endpoints(groups, configured)}
    assert got == {"chat": pair.endpoint, "chat spark1": "http://10.0.0.1:9001", "chat spark2": "http://10.0.0.2:9001",
                   "emb": "http://10.0.0.1:9002"}
    assert served_endpoints([], configured) == configured


def test_the_gateway_lists_each_serving_workload_under_its_model_through_its_own_endpoint():
    tiny = find_recipe("tiny-testbed")
    pair = make_plan(tiny, "2x-solo", CLUSTER, {"workload": "chat", "router": "simple-shuffle", "port": 9001})
    solo = make_plan(tiny, "solo", CLUSTER, {"workload": "emb", "nodes": ["spark1"], "port": 9002,
                                             "served_model_name": "emb-model"})
    groups = launch_groups([Node("spark1", parse_inspect(inspect_json(pair)) + parse_inspect(inspect_json(solo)))])
    listed = gateway.entries(groups)
    assert [(e.model, e.api_base, e.litellm) for e in listed] == [
        ("emb-model", "http://10.0.0.1:9002", False), ("tiny-llama", pair.endpoint, True)]
    cfg = yaml.safe_load(gateway.gateway_config(listed))
    models = {m["model_name"]: m["litellm_params"] for m in cfg["model_list"]}
    assert models["tiny-llama"]["api_base"] == f"{pair.endpoint}/v1"
    assert models["tiny-llama"]["api_key"] == "os.environ/LITELLM_MASTER_KEY"     # behind its own LiteLLM
    assert "api_key" not in models["emb-model"] and cfg["general_settings"]["master_key"].startswith("os.environ/")


def test_routers_and_the_gateway_start_through_the_container_spec_with_a_cap_sized_for_a_router():
    tiny = find_recipe("tiny-testbed")
    for router, cap in (("vllm-router", "512m"), ("simple-shuffle", "2g")):
        plan = make_plan(tiny, "2x-solo", CLUSTER, {"router": router})
        (start,) = [s for s in docker_runs(plan) if labels_of(s.argv)["sparkconsole.role"] == "router"]
        argv = list(start.argv)
        assert argv[argv.index("--memory") + 1] == cap and argv[argv.index("--memory-swap") + 1] == cap, router
    cluster = ClusterConfig(nodes=NODES, endpoints=(), source="<test>", gateway=GatewaySettings(port=4100))
    argv = list(gateway.start_argv(cluster, cluster.gateway))
    assert argv[argv.index("--memory") + 1] == "2g" and argv[-3:] == ["--run_gunicorn", "--num_workers", "1"]
    assert "-e" in argv and "LITELLM_MASTER_KEY" in argv and gateway.url(cluster) == "http://10.0.0.1:4100"
    bad = ClusterConfig(nodes=NODES, endpoints=(), source="<test>",
                        gateway=GatewaySettings(image="ghcr.io/berriai/litellm:v1.82.7"))
    try:
        gateway.start_argv(bad, bad.gateway)
    except UserError as err:
        assert "compromised" in str(err) and "gateway.image" in str(err)
    else:
        raise AssertionError("a compromised LiteLLM was started as the gateway")


def test_a_nodes_budget_bar_shows_each_workloads_share_and_claim_then_outside_free_and_reserve():
    b = NodeBudget("spark1", 100 * GIB, 10 * GIB, (), 40 * GIB, True)
    runs = [Running("chat", "spark1", ("c",), 30 * GIB, 50 * GIB), Running("emb", "spark1", ("e",), 5 * GIB, None)]
    bar = node_bar(b, runs)
    kinds = [(s.kind, s.label, s.bytes // GIB) for s in bar.segments]
    # chat holds 30 of its 50 claimed, emb 5; outside: 100 − 40 available − 35 held = 25; free: the room (the 20
    # still to be claimed come out of MemAvailable: 40 − 10 − 20 = 10), the reserve last
    assert kinds == [(HELD, "chat", 30), (CLAIM, "chat", 20), (HELD, "emb", 5), (OTHER, "outside the workloads", 25),
                     (FREE, "free", 10), (RESERVE, "reserve", 10)]
    assert bar.free_b == 10 * GIB and not bar.estimated
    for width in (7, 40, 113):
        drawn = cells(bar, width)
        assert sum(n for n, _ in drawn) == width and all(n >= 1 for n, s in drawn if s.bytes), (width, drawn)


def test_a_registry_recipes_key_makes_a_valid_default_name_and_keeps_the_recipes_containers():
    from dataclasses import replace

    from sparkconsole.launch.planning import default_workload
    tiny = replace(find_recipe("tiny-testbed"), key="@testreg/tiny-chat")
    assert default_workload(tiny) == "testreg-tiny-chat"
    plan = make_plan(tiny, "solo", CLUSTER, {})
    assert plan.name == "testreg-tiny-chat" and plan.services[0].container == "vllm_a"
    assert labels_of(docker_runs(plan)[0].argv)["sparkconsole.recipe"] == "@testreg/tiny-chat"
