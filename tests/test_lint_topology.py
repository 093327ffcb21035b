"""Preflight rules for multi-node launches: each failure met making cluster and disagg serve on the test bed is
refused before anything starts. The rules are pure (plans and facts); the facts they need about ports and
peers are read from real nodes over real SSH (probe.py), tested at the end."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.launch import lint
from sparkconsole.launch.plan import make_plan
from sparkconsole.launch.probe import probe_nodes
from sparkconsole.nodes.connect import make_transport
from sparkconsole.recipes import find_recipe

TINY = find_recipe("tiny-testbed")
BIND = (("VLLM_CPU_OMP_THREADS_BIND", "0"),), (("VLLM_CPU_OMP_THREADS_BIND", "1"),)


def cluster(binds=BIND, addresses=("127.0.0.2", "127.0.0.3")) -> ClusterConfig:
    nodes = tuple(NodeConfig(f"node{i + 1}", a, role="head" if i == 0 else "worker", container=f"c{i + 1}",
                             vllm_port=8000 + i, vllm_env=binds[i]) for i, a in enumerate(addresses))
    return ClusterConfig(nodes=nodes, endpoints=(), source="t.yaml")


def rules(topology: str, c: ClusterConfig, facts: lint.Facts | None = None, recipe=TINY, **opts) -> dict:
    plan = make_plan(recipe, topology, c, opts)
    found = lint.preflight(recipe, topology, c.nodes, facts or lint.Facts(), plan=plan)
    return {f.rule: f for f in found if f.refuses}


@pytest.mark.parametrize("topology", ["cluster-tp2", "disagg", "2x-solo"])
def test_the_test_bed_plans_pass(topology):
    assert not {k: v for k, v in rules(topology, cluster()).items() if k != "oom_guards"}


def test_ray_on_a_cpu_build_is_refused_with_the_mp_backend_as_fix():
    found = rules("cluster-tp2", cluster(), backend="ray")
    assert "ray_on_cpu" in found and "--backend mp" in found["ray_on_cpu"].fix
    gpu = find_recipe("gpt-oss-120b")
    assert "ray_on_cpu" not in rules("cluster-tp2", cluster(), recipe=gpu, backend="ray")


@pytest.mark.parametrize("binds, refused", [
    (((), ()), True),                                                  # neither node binds: both take NUMA node 0
    (((("VLLM_CPU_OMP_THREADS_BIND", "0"),),) * 2, True),              # the same core twice
    (BIND, False),
])
def test_cpu_ranks_sharing_a_machine_need_cores_of_their_own(binds, refused):
    for topology in ("cluster-tp2", "disagg"):
        assert ("cpu_threads_bind" in rules(topology, cluster(binds))) == refused


def test_nodes_on_two_machines_need_no_binding_but_a_tp2_server_does():
    far = cluster(((), ()), addresses=("192.168.100.10", "192.168.100.11"))
    facts = lint.Facts(boot_ids={"node1": "boot-a", "node2": "boot-b"})
    assert "cpu_threads_bind" not in rules("cluster-tp2", far, facts)
    # the same two addresses, one boot id: one machine after all
    assert "cpu_threads_bind" in rules("cluster-tp2", far, lint.Facts(boot_ids={"node1": "x", "node2": "x"}))
    found = rules("solo", far, facts, tensor_parallel=2)
    assert "cpu_threads_bind" in found and '"0|1"' in found["cpu_threads_bind"].fix


def test_a_loopback_side_channel_host_is_refused():
    r = replace(TINY, env={**TINY.env, "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"})
    plan = make_plan(r, "disagg", cluster())
    # the recipe's env comes first, the plan's own per-node value after it: what vLLM reads is the last -e
    assert "nixl_side_channel" not in {f.rule for f in lint.preflight(r, "disagg", cluster().nodes, plan=plan)}
    bad = cluster(tuple((("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1"), *b) for b in BIND))
    found = rules("disagg", bad)
    assert "nixl_side_channel" in found and "peer would connect to itself" in found["nixl_side_channel"].message


def test_two_nodes_at_one_address_are_refused():
    found = rules("cluster-tp2", cluster(addresses=("127.0.0.2", "127.0.0.2")))
    assert "same_address" in found and found["same_address"].node == "node2"


def test_busy_ports_and_unreachable_peers_from_facts_are_refused():
    facts = lint.Facts(busy_ports={"node1": [("127.0.0.2", 29511, "Address already in use")]},
                       unreachable={"node2": [("node1", "127.0.0.2:22", "Connection refused")]})
    found = rules("cluster-tp2", cluster(), facts)
    assert "127.0.0.2:29511 is already in use" in found["port_in_use"].message
    assert found["peer_unreachable"].node == "node2" and "node1" in found["peer_unreachable"].message


def test_every_plan_names_the_ports_it_listens_on():
    c = cluster()
    tp = make_plan(TINY, "cluster-tp2", c)
    assert set(tp.listens["node1"]) == {("127.0.0.2", 8000), ("127.0.0.2", TINY.cluster.master_port)}
    dis = make_plan(TINY, "disagg", c)
    assert ("127.0.0.3", TINY.disagg.side_channel_port) in dis.listens["node2"]
    assert ("127.0.0.2", TINY.router.port) in dis.listens["node1"]


@pytest.mark.sshd
def test_probe_finds_a_busy_port_and_a_closed_peer_over_real_ssh(sshd_nodes):
    base = sshd_nodes.cluster_config()
    holder = socket.socket()
    holder.bind(("127.0.0.2", 0))
    holder.listen()
    busy_port = holder.getsockname()[1]
    nodes = (replace(base.nodes[0], vllm_port=busy_port, vllm_env=BIND[0]),
             replace(base.nodes[1], vllm_env=BIND[1]))
    c = replace(base, nodes=nodes)
    plan = make_plan(TINY, "cluster-tp2", c)

    async def go(probe_with: ClusterConfig):
        ts = {}
        for n in c.nodes:
            t = make_transport(n, c.ssh)
            await t.connect()
            ts[n.name] = t
        try:
            return await probe_nodes(plan, probe_with, ts)
        finally:
            for t in ts.values():
                await t.close()

    try:
        busy, unreach = asyncio.run(go(c))
        assert [(a, p) for a, p, _ in busy["node1"]] == [("127.0.0.2", busy_port)] and "node2" not in busy
        assert unreach == {}                   # each node reaches the other's sshd
        # node1 as the cluster file would have it if its SSH port were a closed one: node2 cannot reach it
        holder.close()
        closed = replace(c, nodes=(replace(c.nodes[0], ssh=replace(c.nodes[0].ssh, port=busy_port)), c.nodes[1]))
        busy, unreach = asyncio.run(go(closed))
        assert busy == {}
        assert [(peer, addr) for peer, addr, _ in unreach["node2"]] == [("node1", f"127.0.0.2:{busy_port}")]
        assert "refused" in unreach["node2"][0][2].lower()
    finally:
        holder.close()


def test_a_missing_model_or_image_is_refused_with_the_command_that_copies_it():
    gpt = find_recipe("gpt-oss-120b")
    c = cluster(addresses=("192.168.100.10", "192.168.100.11"))
    facts = lint.Facts(model_missing=("node2",), image_ids={"node1": "sha256:a", "node2": None})
    found = rules("cluster-tp2", c, facts, recipe=gpt)
    assert found["model_missing"].node == "node2"
    assert found["model_missing"].fix == "sparkconsole model pull openai/gpt-oss-120b --node node2 --yes"
    assert found["image_missing"].fix == f"sparkconsole image pull {gpt.container} --node node2 --yes"
    other = rules("cluster-tp2", c, lint.Facts(image_ids={"node1": "sha256:a", "node2": "sha256:b"}), recipe=gpt)
    assert other["image_mismatch"].fix == f"sparkconsole image pull {gpt.container} --from node1 --node node2 --yes"


# The noexec line as vLLM 0.32 CPU wrote it on the test bed; the other two as vLLM 0.32's source words them.
RECORDED_REFUSALS = {
    "(Worker_TP0 pid=37) ERROR 11-24 22:01:22 [multiproc_executor.py:1063] torch._inductor.exc.InductorError: "
    "OSError: /tmp/torchinductor_root/q2/cq2q.main.so: failed to map segment from shared object.  The most common "
    "reason this may occur is if the /tmp folder is mounted with noexec": "/tmp:exec",
    "ValueError: current platform cpu does not support ray.": "--backend mp",
    "AssertionError: Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers. Allowed NUMA nodes are "
    "[0]. Please try to bind threads manually or decrease DP/TP/PP.": "VLLM_CPU_OMP_THREADS_BIND",
}


@pytest.mark.parametrize("line, fix", RECORDED_REFUSALS.items())
def test_known_vllm_refusals_read_as_their_fix(line, fix):
    from sparkconsole.launch.logread import error_line, known_refusal_fix
    assert fix in known_refusal_fix(line)
    assert error_line(["INFO starting", line, "Traceback (most recent call last):"]) is not None
    assert known_refusal_fix("INFO Application startup complete.") is None
