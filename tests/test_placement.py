"""Several workloads on one cluster, placed against each node's unified memory (issue 38): `recipe fit` offline
on GB10 nodes with the real memory estimate, spread and pack with their reasons, the one-line refusals (does not
fit, by how much; no recipes; a name twice; a port the operator gave that another holds), a node whose memory
cannot be read (the estimate alone, marked), what runs counted (its claim while it loads), the ports and
container names a workload takes beside another, and the memory back after a stop."""

from __future__ import annotations

import asyncio

import pytest

from sparkconsole import cli
from sparkconsole.config import ClusterConfig, NodeConfig, SshSettings
from sparkconsole.errors import UserError
from sparkconsole.launch.plan import make_plan
from sparkconsole.nodes.launches import LaunchGroup, Member
from sparkconsole.placement.budget import GB10_MEMTOTAL_B, NodeBudget, offline_budget
from sparkconsole.placement.fit import GIB, Ask, NodeRoom, Running, fit
from sparkconsole.placement.recovery import StopLog, StopRecord, judge
from sparkconsole.placement.slots import Taken, slots, taken_on
from sparkconsole.recipes import find_recipe
from tests.helpers import error_lines

TWO = ClusterConfig(nodes=(NodeConfig("spark1", "192.168.100.10", role="head"), NodeConfig("spark2", "192.168.100.11")),
                    endpoints=(), source="<test>")
ROOM = GB10_MEMTOTAL_B - offline_budget("x").reserve_b      # 121.7 GiB less the 8 + 1.5 GiB reserve


def budgets(cluster: ClusterConfig = TWO) -> dict[str, NodeBudget]:
    return {n.name: offline_budget(n.name) for n in cluster.nodes}


def asks(*keys: str) -> list[Ask]:
    return [Ask(k, find_recipe(k), "solo", {"workload": k}) for k in keys]


def test_spread_puts_each_model_where_the_most_room_is_and_says_what_is_left():
    p = fit(asks("llama-3.1-8b", "qwen3-embedding-0.6b", "gpt-oss-120b"), TWO, budgets(), offline=True)
    where = {c.ask.name: c.nodes for c in p.choices}
    # largest first: the 120B (85.2 GiB claimed: 0.70 × 121.7) on the head, the 8B on the other node, the embedder
    # (0.10 × 121.7 = 12.2 GiB) where the most room is left, beside the 8B
    assert [c.ask.name for c in p.choices] == ["gpt-oss-120b", "llama-3.1-8b", "qwen3-embedding-0.6b"]
    assert where == {"gpt-oss-120b": ("spark1",), "llama-3.1-8b": ("spark2",), "qwen3-embedding-0.6b": ("spark2",)}
    claim = {c.ask.name: c.takes[0].take_b for c in p.choices}
    assert claim["gpt-oss-120b"] == int(0.70 * GB10_MEMTOTAL_B) and claim["qwen3-embedding-0.6b"] == int(0.10 * GB10_MEMTOTAL_B)
    assert p.choice("gpt-oss-120b").free_after["spark1"] == ROOM - claim["gpt-oss-120b"]
    assert p.rooms["spark2"].free_b() == ROOM - claim["llama-3.1-8b"] - claim["qwen3-embedding-0.6b"]
    assert "spread: spark2 has the most room" in p.choice("qwen3-embedding-0.6b").reason
    # the embedder shares spark2 with the 8B: its own port and container, said so
    emb = p.choice("qwen3-embedding-0.6b")
    assert emb.options["port"] == 8001 and emb.options["container_names"] == {"spark2": "vllm_node_qwen3-embedding-0.6b"}
    text = p.render()
    assert "MemTotal 121.7 GiB, reserve 9.5 GiB" in text and "takes 85.2 GiB (its claim" in text
    assert "weights 60.8 GiB" in text and "free after it 27.0 GiB" in text


def test_pack_fills_the_fullest_node_that_fits_and_keeps_a_node_free():
    p = fit(asks("gpt-oss-120b", "qwen3-embedding-0.6b"), TWO, budgets(), pack=True, offline=True)
    assert {c.ask.name: c.nodes for c in p.choices} == {"gpt-oss-120b": ("spark1",), "qwen3-embedding-0.6b": ("spark1",)}
    assert "pack: spark1 is the fullest node it fits (27.0 GiB free); spark2 (112.2 GiB free) kept" in \
        p.choice("qwen3-embedding-0.6b").reason
    assert p.rooms["spark2"].placed == []


def test_a_set_that_does_not_fit_is_refused_in_one_line_naming_it_and_by_how_much():
    three = [Ask(f"oss{i}", find_recipe("gpt-oss-120b"), "solo", {"workload": f"oss{i}"}) for i in (1, 2, 3)]
    with pytest.raises(UserError) as err:
        fit(three, TWO, budgets(), offline=True)
    line = str(err.value)
    assert "oss3 (gpt-oss-120b) does not fit: it takes 85.2 GiB per node (claim)" in line
    assert "27.0 GiB free — 58.2 GiB short" in line and "\n" not in line


def test_fit_from_the_command_line_and_its_bad_input_in_one_line_each(tmp_path, capsys):
    f = tmp_path / "two.yaml"
    f.write_text("nodes:\n  - {name: spark1, address: 192.168.100.10}\n  - {name: spark2, address: 192.168.100.11}\n")
    assert cli.main(["--cluster", str(f), "recipe", "fit", "gpt-oss-120b", "llama-3.1-8b", "--offline"]) == 0
    out = capsys.readouterr().out
    assert "gpt-oss-120b (gpt-oss-120b × solo) → spark1: spread" in out and "llama-3.1-8b (llama-3.1-8b × solo) → spark2" in out
    for argv, needle in ((["recipe", "fit", "--offline"], "fit needs at least one recipe"),
                         (["recipe", "fit", "tiny-testbed", "tiny-testbed", "--offline"], "two workloads named 'tiny-testbed'"),
                         (["recipe", "fit", "gpt-oss-120b", "llama-3.1-8b", "--name", "a", "--offline"],
                          "1 --name for 2 recipes"),
                         # two recipes asking for one port, packed onto one node
                         (["recipe", "fit", "llama-3.1-8b", "qwen3-embedding-0.6b", "--set", "port=9000", "--pack",
                           "--offline"], "port 9000 is taken on spark1 by ")):
        assert cli.main(["--cluster", str(f), *argv]) == 2
        err = error_lines(capsys.readouterr().err)
        assert len(err) == 1 and needle in err[0], err


def test_a_port_the_operator_gave_is_never_moved_and_refused_when_another_holds_it():
    tiny = find_recipe("tiny-testbed")
    held = {"spark1": Taken(ports={8000: "chat"}, names={"vllm_node": "chat"})}
    with pytest.raises(UserError, match="port 8000 is taken on spark1 by chat"):
        slots(tiny, "solo", TWO, {"nodes": ["spark1"], "port": 8000, "workload": "coder"}, held)
    moved = slots(tiny, "solo", TWO, {"nodes": ["spark1"], "workload": "coder"}, held)
    assert moved == {"port": 8001}          # coder's own container name is free: vllm_node_coder
    plan = make_plan(tiny, "solo", TWO, {"nodes": ["spark1"], "workload": "coder", **moved})
    assert plan.services[0].container == "vllm_node_coder" and plan.endpoint == "http://192.168.100.10:8001"
    # a router beside another launch's vllm-router: the next port free for both it and its metrics port
    two = slots(tiny, "2x-solo", TWO, {"workload": "pair", "router": "vllm-router"},
                {"spark1": Taken(ports={4000: "other", 4001: "other"})})
    assert two == {"router_port": 4002}


def test_a_container_name_the_recipe_gives_is_refused_when_another_holds_it(tmp_path):
    from sparkconsole.recipes import load_recipe
    text = open(find_recipe("tiny-testbed").source).read().replace("    memory: 6g\n", "    memory: 6g\n    name: shared\n")
    (tmp_path / "named.yaml").write_text(text)
    named = load_recipe(tmp_path / "named.yaml")
    held = {"spark1": Taken(names={"shared": "chat"})}
    with pytest.raises(UserError, match="container shared .* is taken on spark1 by chat"):
        slots(named, "solo", TWO, {"nodes": ["spark1"]}, held)
    # under a name of its own, its container is its own (shared_coder)
    assert slots(named, "solo", TWO, {"nodes": ["spark1"], "workload": "coder"}, held) == {}


def test_what_runs_counts_its_claim_while_it_loads_and_memavailable_caps_the_room():
    b = NodeBudget("spark1", 100 * GIB, 10 * GIB, (), 60 * GIB, True)
    loading = Running("chat", "spark1", ("vllm_node",), measured_b=20 * GIB, claim_b=50 * GIB)
    room = NodeRoom(b, [loading])
    # the budget: 100 − 10 − max(20, 50) = 40; MemAvailable: 60 − 10 − (50 − 20 not yet taken) = 20
    assert room.free_b() == 20 * GIB and room.limited_by_available()
    room = NodeRoom(NodeBudget("spark1", 100 * GIB, 10 * GIB, (), 85 * GIB, True), [loading])
    assert room.free_b() == 40 * GIB and not room.limited_by_available()


def test_a_node_whose_memory_cannot_be_read_is_placed_by_the_estimate_and_marked(tmp_path):
    from sparkconsole.launch.beside import Readings, place, start_monitor
    from tests.helpers import free_port
    here = NodeConfig("here", "127.0.0.1", role="head", local=True)
    # an SSH node nobody answers for: its agent never ticks
    gone = NodeConfig("gone", "127.0.0.1", ssh=SshSettings(user="nobody", port=free_port()))
    cluster = ClusterConfig(nodes=(here, gone), endpoints=(), source="<test>")

    async def go():
        monitor = await start_monitor(cluster)
        try:
            return Readings(cluster, monitor.nodes)
        finally:
            await monitor.stop()
    readings = asyncio.run(go())
    assert readings.budgets["here"].measured and not readings.budgets["gone"].measured
    p = place(readings, [Ask("big", find_recipe("llama-3.1-8b"), "solo", {"workload": "big", "nodes": ["gone"]})])
    text = p.render()
    assert "gone: MemTotal 121.7 GiB" in text and "ESTIMATE ONLY: not read" in text
    here_line = next(ln for ln in text.splitlines() if ln.startswith("here:"))
    assert "ESTIMATE ONLY" not in here_line and "MemAvailable" in here_line


def test_memory_back_after_a_stop_is_judged_from_what_the_stop_expected(tmp_path):
    log = StopLog(tmp_path, "lab.yaml")
    log.add(StopRecord("spark1", "chat", 1e12, available_b=30 * GIB, freed_b=50 * GIB))
    recs = log.records("spark1", now=1e12 + 5)
    assert [r.workload for r in recs] == ["chat"] and log.records("spark2", now=1e12 + 5) == []
    back, words = judge(recs, 79 * GIB)
    assert back and "expected about 80.0 GiB (30.0 before + 50.0 freed)" in words
    back, words = judge(recs, 60 * GIB)
    assert not back and "20.0 GiB has not come back" in words
    log.clear("spark1")
    assert log.records("spark1", now=1e12 + 5) == []


def running(name: str, node: str, port: int, container: str, claim: int | None = None) -> LaunchGroup:
    m = Member(node, "server", container, "running", url=f"http://10.0.0.1:{port}", model=name, claim_b=claim)
    return LaunchGroup("tiny-testbed", "solo", (m,), "SERVING", "", name)


def test_what_the_nodes_hold_comes_from_their_containers_and_the_launches_labels():
    class Node:
        def __init__(self, name, containers):
            self.name, self.containers = name, containers
    g = running("chat", "spark1", 8000, "vllm_node")
    from sparkconsole.nodes.samples import ContainerInfo
    taken = taken_on([Node("spark1", (ContainerInfo("vllm_node", state="running"), ContainerInfo("old", state="exited")))],
                     [g])
    assert taken["spark1"].ports == {8000: "chat"} and set(taken["spark1"].names) == {"vllm_node", "old"}


def test_acting_on_a_workload_that_is_not_running_is_one_line_and_touches_nothing(tmp_path, capsys, monkeypatch):
    f = tmp_path / "local.yaml"
    f.write_text("nodes:\n  - {name: here, address: 127.0.0.1, local: true}\n")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")     # this node's Docker: not there
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    for action in (["status", "coder"], ["stop", "coder", "--yes"], ["restart", "coder", "--yes"]):
        assert cli.main(["--cluster", str(f), "recipe", *action]) == 2
        err = error_lines(capsys.readouterr().err)
        assert len(err) == 1 and "no workload named 'coder' is running (here not read)" in err[0], err
    assert not (tmp_path / "state" / "audit.log").exists()
