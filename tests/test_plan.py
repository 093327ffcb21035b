"""Plans: every bundled recipe × topology checked field by field; quoting proven with a real shell."""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.errors import UserError
from sparkconsole.launch import gate, lint
from sparkconsole.launch.argv import flag_value
from sparkconsole.launch.plan import make_plan
from sparkconsole.launch.steps import EXIT_MARK, NodeExpr, Step
from sparkconsole.recipes import SecretRef, bundled_recipes, find_recipe

NODES = (NodeConfig(name="spark1", address="192.168.100.10", role="head", container="vllm_a", vllm_port=8000),
         NodeConfig(name="spark2", address="192.168.100.11", role="worker", container="vllm_b", vllm_port=8001))
CLUSTER = ClusterConfig(nodes=NODES, endpoints=(), source="cluster.yaml")
ADDR = {n.name: n.address for n in NODES}
PORT = {n.name: n.vllm_port for n in NODES}


def variants():
    for r in bundled_recipes():
        for t in r.topologies:
            opts = [{}]
            if t == "2x-solo":
                opts += [{"router": "simple-shuffle"}, {"router": "least-busy"}]
            if t == "cluster-tp2":
                opts += [{"backend": "ray"}]
            for o in opts:
                yield pytest.param(r.key, t, o, id=f"{r.key}-{t}-{'-'.join(map(str, o.values())) or 'default'}")


def served_port(r, topology: str, role: str, node: str) -> int:
    """Where the runner serves: a topology's own port, else the recipe's, else the cluster file's vllm_port."""
    own = {"prefill": r.disagg.prefill_port, "decode": r.disagg.decode_port}.get(role) if topology == "disagg" else None
    for v in (own, r.topology_defaults.get(topology, {}).get("port"), r.defaults.get("port")):
        if v is not None:
            return int(v)
    return PORT[node]


def docker_run_parts(argv):
    """Split a `docker run` argv into (options, image, command) using the --entrypoint= marker."""
    assert argv[:3] == ("docker", "run", "-d")
    i = argv.index("--entrypoint=")
    return argv[3:i], argv[i + 1], argv[i + 2:]


def env_of(opts):
    out = {}
    for i, a in enumerate(opts):
        if a == "-e":
            k, sep, v = opts[i + 1].partition("=")
            out[k] = v if sep else None          # None: passed by reference
    return out


@pytest.mark.parametrize("key, topology, opts", list(variants()))
def test_bundled_plan_field_by_field(key, topology, opts):
    r = find_recipe(key)
    plan = make_plan(r, topology, CLUSTER, opts)
    used = {"solo": ["spark1"]}.get(topology, ["spark1", "spark2"])
    assert plan.nodes == tuple(used) and plan.topology == topology and plan.recipe == key
    # head first: the first step runs on the head
    assert plan.steps[0].node == "spark1"
    servers = [s for s in plan.services if s.role != "router"]
    assert [s.node for s in servers] == used
    for svc in servers:
        start = next(s for s in plan.steps if s.service == svc.key)
        # every server's node first removes a stopped leftover of the same name (refused if running)
        pre = plan.steps[plan.steps.index(start) - 1]
        assert pre.argv == ("docker", "rm", svc.container) and pre.node == svc.node
        node = CLUSTER.node(svc.node)
        assert svc.container == node.container
        if plan.backend == "ray":
            continue
        opts_, image, cmd = docker_run_parts(start.argv)
        assert image == r.container
        assert opts_[opts_.index("--name") + 1] == node.container
        assert tuple(opts_[opts_.index("--network"):opts_.index("--network") + 2]) == ("--network", "host")
        cs = r.container_settings
        if cs.memory:
            assert opts_[opts_.index("--memory") + 1] == cs.memory
            assert opts_[opts_.index("--memory-swap") + 1] == cs.memory
        assert ("--gpus" in opts_) == (cs.gpus is not None)
        env = env_of(opts_)
        for k, v in r.env.items():
            assert env[k] == v
        for s in r.secrets:
            assert env[s.name] is None                              # by reference only
        assert f"sparkconsole.recipe={key}" in opts_ and f"sparkconsole.topology={topology}" in opts_
        argv = plan.server_args[svc.key]
        # behind LiteLLM (no worker API) each server carries the drain gate for a rolling restart: its directory
        # mounted, found first on the image's PYTHONPATH, loaded as vLLM middleware
        assert svc.drain_gate == (topology == "2x-solo" and plan.router != "vllm-router")
        if svc.drain_gate:
            assert tuple(cmd) == gate.wrap(argv) and flag_value(argv, "--middleware") == "sparkconsole_drain_gate.DrainGate"
            assert opts_[opts_.index(gate.mount()) - 1] == "-v"
        else:
            assert tuple(cmd) == argv and "--middleware" not in argv
        assert "--distributed-executor-backend" not in argv
        # one TP group serves on the head's port; single-node servers on their own node's port
        port = served_port(r, topology, svc.role, "spark1" if topology == "cluster-tp2" else svc.node)
        assert flag_value(argv, "--port") == str(port)
        if svc.url:
            assert svc.url == f"http://{ADDR[svc.node]}:{port}"
        assert svc.model == flag_value(argv, "--served-model-name")
        tp = flag_value(argv, "--tensor-parallel-size")
        assert tp == ("2" if topology == "cluster-tp2" else "1")
        if topology == "cluster-tp2":
            rank = used.index(svc.node)
            assert flag_value(argv, "--nnodes") == "2" and flag_value(argv, "--node-rank") == str(rank)
            assert flag_value(argv, "--master-addr") == ADDR["spark1"]
            assert flag_value(argv, "--master-port") == str(r.cluster.master_port)
            assert ("--headless" in argv) == (rank > 0)
            assert (svc.url is None) == (rank > 0)
            for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES"):
                assert env[var] == r.cluster.eth_if
            assert env["VLLM_HOST_IP"] == ADDR[svc.node]
            if r.cluster.ib_if:
                assert env["NCCL_IB_HCA"] == r.cluster.ib_if
        if topology == "disagg":
            assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == ADDR[svc.node]
            kv = flag_value(argv, "--kv-transfer-config")
            assert svc.role == ("prefill" if svc.node == "spark1" else "decode")
            want = {"kv_connector": "NixlConnector",
                    "kv_role": "kv_producer" if svc.role == "prefill" else "kv_consumer"}
            if r.disagg.kv_buffer_device:
                want["kv_buffer_device"] = r.disagg.kv_buffer_device
            assert yaml.safe_load(kv) == want
    # the endpoint is the router when there is one, else the head's server
    routers = [s for s in plan.services if s.role == "router"]
    if topology in ("2x-solo", "disagg"):
        assert len(routers) == 1 and routers[0].node == "spark1"
        assert plan.endpoint == routers[0].url == f"http://192.168.100.10:{r.router.port}"
        start = next(s for s in plan.steps if s.service == routers[0].key)
        assert plan.steps.index(start) == len(plan.steps) - 1          # the router starts after its backends
        _check_router(r, plan, routers[0], start, topology, opts)
    else:
        assert not routers and plan.endpoint == "http://192.168.100.10:8000"
    # every step survives the trip through a shell unchanged (a node-side expansion inside `sh -c`, as written)
    for s in plan.steps:
        assert shell_argv(s) == [shlex.split(a)[0] if isinstance(a, NodeExpr) else a for a in s.argv]




def shell_argv(step: Step) -> list[str]:
    words = shlex.split(step.shell())
    while words and re.match(r"^[A-Z_]+=", words[0]):        # file secrets, assigned in front
        words.pop(0)
    if any(isinstance(a, NodeExpr) for a in step.argv):
        assert words[:2] == ["sh", "-c"] and len(words) == 3
        return shlex.split(words[2])
    return words


def _check_router(r, plan, router, start, topology, opts):
    _, image, cmd = docker_run_parts(start.argv)
    urls = [s.url for s in plan.services if s.role != "router"]
    if topology == "disagg":
        assert image == r.router.vllm_router.image
        assert cmd[cmd.index("--prefill") + 1] == urls[0] and cmd[cmd.index("--decode") + 1] == urls[1]
        assert "--vllm-pd-disaggregation" in cmd
        return
    choice = opts.get("router", r.router.default)
    assert plan.router == choice
    if choice == "vllm-router":
        assert image == r.router.vllm_router.image
        i = cmd.index("--worker-urls")
        assert list(cmd[i + 1:i + 3]) == urls and cmd[cmd.index("--policy") + 1] == r.router.vllm_router.policy
        assert any("0.5 ms" in n for n in plan.notes)
    else:
        assert image == r.router.litellm.image
        write = plan.steps[plan.steps.index(start) - 1]
        cfg = yaml.safe_load(write.input)
        assert cfg["router_settings"]["routing_strategy"] == choice
        assert [m["litellm_params"]["api_base"] for m in cfg["model_list"]] == [u + "/v1" for u in urls]
        assert {m["model_name"] for m in cfg["model_list"]} == {router.model}
        assert cfg["general_settings"]["master_key"] == "os.environ/LITELLM_MASTER_KEY"
        assert "LITELLM_MASTER_KEY" in start.argv and not any(a.startswith("LITELLM_MASTER_KEY=") for a in start.argv)
        assert router.health_path == "/health/liveliness"
        assert any("12 ms" in n for n in plan.notes)


def test_ray_backend_plan():
    plan = make_plan(find_recipe("gpt-oss-120b"), "cluster-tp2", CLUSTER, {"backend": "ray"})
    head, worker = [s for s in plan.steps if s.service and s.argv[1] == "run"]
    assert head.argv[-9:] == ("ray", "start", "--block", "--head", "--port", "29501", "--node-ip-address",
                              "192.168.100.10", "--disable-usage-stats")
    assert "--address" in worker.argv and "192.168.100.10:29501" in worker.argv
    wait = next(s for s in plan.steps if s.expect)
    assert wait.argv == ("docker", "exec", "vllm_a", "ray", "status") and wait.expect[1] == 2 and not wait.change
    exec_step = next(s for s in plan.steps if s.argv[1:3] == ("exec", "-d"))
    assert plan.steps.index(wait) < plan.steps.index(exec_step)         # vLLM starts once both nodes joined
    assert exec_step.node == "spark1" and exec_step.argv[:4] == ("docker", "exec", "-d", "vllm_a")
    inner = exec_step.argv[-1]
    # the server's end is written to the container log: the Ray node, its main process, outlives it
    assert inner.startswith("vllm serve") and "--distributed-executor-backend ray >> /proc/1/fd/1 2>&1; " in inner
    assert inner.endswith(f'echo "{EXIT_MARK} $?" >> /proc/1/fd/1')
    assert plan.server_args["spark1/server"][-2:] == ("--distributed-executor-backend", "ray")


def test_executor_flag_is_the_topologys_where_it_must_be():
    """One node: the recipe's `uni`/`mp` stands (uni saves vLLM a worker process), its `ray` goes (no Ray cluster
    is started). Several nodes: whatever the recipe says goes, the topology's backend decides."""
    r = find_recipe("gpt-oss-120b")
    for written, solo_keeps in (("--distributed-executor-backend uni", True), ("--distributed-executor-backend=mp", True),
                                ("--distributed-executor-backend ray", False)):
        rr = replace(r, command=r.command.rstrip() + " " + written + "\n")
        value = written.replace("=", " ").split()[1]
        for topology in ("solo", "2x-solo"):
            for argv in make_plan(rr, topology, CLUSTER).server_args.values():
                assert (flag_value(argv, "--distributed-executor-backend") == value) == solo_keeps, (written, argv)
        for argv in make_plan(rr, "cluster-tp2", CLUSTER).server_args.values():
            assert flag_value(argv, "--distributed-executor-backend") is None, (written, argv)
        ray = make_plan(rr, "cluster-tp2", CLUSTER, {"backend": "ray"}).server_args["spark1/server"]
        assert ray.count("--distributed-executor-backend") == 1 and ray[-1] == "ray"


def test_placeholder_values_with_shell_metacharacters_stay_one_argument(tmp_path):
    evil = "x'; touch /tmp/pwned; echo '"
    plan = make_plan(find_recipe("tiny-testbed"), "solo", CLUSTER, {"served_model_name": evil})
    start = next(s for s in plan.steps if s.service)
    assert plan.server_args["spark1/server"][plan.server_args["spark1/server"].index("--served-model-name") + 1] == evil
    # a real shell parses the rendered line back into exactly the planned argv
    assert argv_through_shell(start, tmp_path) == expanded(start.argv, tmp_path)


def argv_through_shell(step: Step, tmp: Path) -> list[str]:
    """The argv a real shell hands `docker` for a step's rendered line, HOME being `tmp` (HF_HOME unset)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text('#!/bin/sh\nprintf "%s\\0" docker "$@"\n')
    (bin_dir / "docker").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp)}
    out = subprocess.run(["sh", "-c", step.shell()], capture_output=True, check=True, env=env).stdout
    return out.decode().split("\0")[:-1]


def expanded(argv, home: Path) -> list[str]:
    """argv as the node's shell expands it: the Hugging Face and compile caches under HOME."""
    return [a.replace('"${HF_HOME:-$HOME/.cache/huggingface}"', f"{home}/.cache/huggingface")
            .replace('"$HOME"', str(home)) if isinstance(a, NodeExpr) else a for a in argv]


def test_file_secret_is_read_on_the_node_and_never_in_the_plan(tmp_path):
    token = "hf_" + "z" * 34
    f = tmp_path / "token"
    f.write_text(token)
    step = Step("spark1", "print the token inside the command", ("sh", "-c", 'printf %s "$HF_TOKEN"'),
                secrets=(SecretRef("HF_TOKEN", f"file:{f}"),))
    assert token not in step.shell()
    assert subprocess.run(["sh", "-c", step.shell()], capture_output=True, text=True).stdout == token
    r = find_recipe("llama-3.1-8b")
    r = replace(r, secrets=(SecretRef("HF_TOKEN", f"file:{f}"),))
    plan = make_plan(r, "solo", CLUSTER)
    start = next(s for s in plan.steps if s.service)
    assert start.shell().startswith(f'HF_TOKEN="$(cat -- {f})" sh -c \'docker run')
    # the plan shows the whole command, only the secret's value masked
    assert "--name vllm_a" in plan.render() and "HF_TOKEN=\"***\" sh -c" in plan.render()
    assert token not in plan.render()


def test_drop_caches_and_overrides():
    plan = make_plan(find_recipe("gpt-oss-120b"), "2x-solo", CLUSTER,
                     {"drop_caches": True, "max_model_len": 8192, "extra_args": ["--seed", "7"], "port": 9100})
    drops = [s for s in plan.steps if "drop_caches" in " ".join(s.argv)]
    assert [s.node for s in drops] == ["spark1", "spark2"]
    for argv in plan.server_args.values():
        assert flag_value(argv, "--max-model-len") == "8192" and argv[-2:] == ("--seed", "7")
        assert flag_value(argv, "--port") == "9100"
    assert all(s.url.endswith(":9100") for s in plan.services if s.role == "server")


def test_cluster_overrides_tp_and_layers_and_interfaces():
    r = find_recipe("gpt-oss-120b")
    solo = make_plan(r, "solo", CLUSTER).server_args["spark1/server"]
    tp2 = make_plan(r, "cluster-tp2", CLUSTER, {"eth_if": {"spark1": "eth0", "spark2": "eth1"}, "ib_if": "mlx5_0"})
    assert flag_value(solo, "--mxfp4-layers") == "moe,qkv,o,lm_head"
    assert flag_value(tp2.server_args["spark1/server"], "--mxfp4-layers") == "moe,qkv,o"
    envs = {s.node: env_of(docker_run_parts(s.argv)[0]) for s in tp2.steps if s.service}
    assert envs["spark1"]["NCCL_SOCKET_IFNAME"] == "eth0" and envs["spark2"]["GLOO_SOCKET_IFNAME"] == "eth1"
    assert envs["spark2"]["NCCL_IB_HCA"] == "mlx5_0"
    nodes = make_plan(r, "solo", CLUSTER, {"nodes": ["spark2"]})
    # the recipe's port (8000), as the runner serves it, not the cluster file's vllm_port (8001)
    assert nodes.nodes == ("spark2",) and nodes.endpoint == "http://192.168.100.11:8000"


@pytest.mark.parametrize("key, topology, opts, needle", [
    ("deepseek-v4-flash", "solo", {}, "requires cluster mode"),
    ("llama-3.1-8b", "cluster-tp2", {}, "does not support topology cluster-tp2"),
    ("gpt-oss-120b", "quad", {}, "unknown topology"),
    ("gpt-oss-120b", "solo", {"nodes": ["spark9"]}, "no node named 'spark9'"),
    ("gpt-oss-120b", "2x-solo", {"nodes": ["spark1", "spark1"]}, "named twice"),
    ("gpt-oss-120b", "2x-solo", {"nodes": ["spark1"]}, "runs on two nodes"),
    ("gpt-oss-120b", "2x-solo", {"router": "nginx"}, "unknown router"),
    ("gpt-oss-120b", "cluster-tp2", {"backend": "slurm"}, "unknown backend"),
])
def test_impossible_plans_are_one_line_errors(key, topology, opts, needle):
    with pytest.raises(UserError) as ei:
        make_plan(find_recipe(key), topology, CLUSTER, opts)
    assert needle in str(ei.value) and "\n" not in str(ei.value) and "fix:" in str(ei.value)


def test_cluster_without_interface_and_single_node_cluster_are_refused():
    r = replace(find_recipe("gpt-oss-120b"), cluster=replace(find_recipe("gpt-oss-120b").cluster, eth_if=None))
    with pytest.raises(UserError, match="network interface"):
        make_plan(r, "cluster-tp2", CLUSTER)
    one = ClusterConfig(nodes=NODES[:1], endpoints=(), source="one.yaml")
    with pytest.raises(UserError, match="needs 2 nodes"):
        make_plan(find_recipe("gpt-oss-120b"), "2x-solo", one)


def test_render_lists_steps_per_node_in_execution_order():
    plan = make_plan(find_recipe("gpt-oss-120b"), "2x-solo", CLUSTER)
    text = plan.render(ADDR)
    assert text.index("[spark1 192.168.100.10]") < text.index("[spark2 192.168.100.11]")
    for i, s in enumerate(plan.steps, 1):
        assert f"  {i}. {s.what}" in text
    assert "Endpoint: http://192.168.100.10:4000" in text


def test_compromised_litellm_is_refused_at_plan_time():
    r = find_recipe("gpt-oss-120b")
    bad = replace(r, router=replace(r.router, litellm=replace(r.router.litellm, version="1.82.8")))
    for choice in ("simple-shuffle", "least-busy"):
        with pytest.raises(UserError) as ei:
            make_plan(bad, "2x-solo", CLUSTER, {"router": choice})
        assert "compromised" in str(ei.value) and "1.106.2" in str(ei.value)
    make_plan(bad, "2x-solo", CLUSTER, {"router": "vllm-router"})      # not used here; lint still blocks the file

_TINY = find_recipe("tiny-testbed")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1,
               max_size=40))
def test_any_placeholder_value_is_exactly_one_argument(value):
    plan = make_plan(_TINY, "solo", CLUSTER, {"served_model_name": value})
    argv = plan.server_args["spark1/server"]
    assert argv[argv.index("--served-model-name") + 1] == value
    start = next(s for s in plan.steps if s.service)
    assert shell_argv(start) == [shlex.split(a)[0] if isinstance(a, NodeExpr) else a for a in start.argv]


def _nodes(n: int) -> ClusterConfig:
    nodes = tuple(NodeConfig(name=f"spark{i + 1}", address=f"192.168.100.{10 + i}", role="head" if i == 0 else "worker",
                             container="vllm_node") for i in range(n))
    return ClusterConfig(nodes=nodes, endpoints=(), source="n.yaml")


@pytest.mark.parametrize("tp, pp", [(3, 1), (4, 1), (8, 1), (2, 2), (2, 3), (1, 2)])
def test_a_cluster_runs_on_as_many_nodes_as_the_recipe_splits_over(tp, pp):
    n = tp * pp
    plan = make_plan(_TINY, "cluster-tp2", _nodes(8), {"tensor_parallel": tp, "pipeline_parallel": pp})
    assert plan.nodes == tuple(f"spark{i + 1}" for i in range(n))            # head first, then file order
    for rank, node in enumerate(plan.nodes):
        key = f"{node}/{'server' if rank == 0 else 'worker'}"
        argv = plan.server_args[key]
        assert flag_value(argv, "--tensor-parallel-size") == str(tp)
        assert flag_value(argv, "--pipeline-parallel-size") == str(pp)
        assert flag_value(argv, "--nnodes") == str(n) and flag_value(argv, "--node-rank") == str(rank)
        assert flag_value(argv, "--master-addr") == "192.168.100.10"
        assert ("--headless" in argv) == (rank > 0)
        assert dict(plan.server_env[key])["VLLM_HOST_IP"] == f"192.168.100.{10 + rank}"
    assert not [f for f in lint.preflight(_TINY, "cluster-tp2", _nodes(8).nodes, plan=plan)
                if f.rule == "parallel_size"]


def test_a_recipe_for_more_nodes_than_the_cluster_has_is_refused_in_one_line():
    r = replace(_TINY, defaults={**_TINY.defaults, "tensor_parallel": 4})
    with pytest.raises(UserError) as ei:
        make_plan(r, "cluster-tp2", _nodes(2))
    msg = str(ei.value)
    assert "the recipe runs on 4 nodes" in msg and "has 2" in msg and "\n" not in msg
    with pytest.raises(UserError, match="needs 4 nodes, 2 named"):
        make_plan(r, "cluster-tp2", _nodes(4), {"nodes": ["spark1", "spark2"]})
    # a recipe that sets no split takes the topology's own, and the plan says so
    two = make_plan(_TINY, "cluster-tp2", _nodes(3))
    assert two.nodes == ("spark1", "spark2") and any("tensor_parallel 2 spreads it" in n for n in two.notes)


def test_ray_cluster_of_four_starts_a_worker_per_node_and_waits_for_all():
    plan = make_plan(_TINY, "cluster-tp2", _nodes(4), {"tensor_parallel": 4, "backend": "ray"})
    workers = [s for s in plan.steps if s.service and s.service.endswith("/worker")]
    assert [s.node for s in workers] == ["spark2", "spark3", "spark4"]
    assert all("192.168.100.10:29511" in s.argv for s in workers)
    wait = next(s for s in plan.steps if s.expect)
    assert wait.expect[1] == 4


def test_each_rank_of_a_cluster_launch_carries_how_many_ranks_it_has():
    """The console judges a cluster launch on every rank its labels count (nodes/launches.py)."""
    def runs(plan) -> list[str]:
        return [" ".join(map(str, s.argv)) for s in plan.steps if "docker run" in " ".join(map(str, s.argv))]
    for backend in ("mp", "ray"):
        four = runs(make_plan(_TINY, "cluster-tp2", _nodes(4), {"tensor_parallel": 4, "backend": backend}))
        assert len(four) == 4 and all("sparkconsole.ranks=4" in argv for argv in four), (backend, four)
    assert all("sparkconsole.ranks" not in argv for argv in runs(make_plan(_TINY, "2x-solo", _nodes(2))))


def test_only_a_disaggregated_plan_names_servers_that_receive_a_kv_cache():
    """`bench matrix` reads these /metrics around each level (the real disagg launch's sweep asserts the figures)."""
    r = find_recipe("tiny-testbed")
    disagg = make_plan(r, "disagg", CLUSTER)
    decode = [s for s in disagg.services if s.role == "decode"]
    assert len(decode) == 1 and disagg.kv_metrics == (f"{decode[0].url}/metrics",)
    assert decode[0].url != disagg.endpoint          # the decode server, not the router in front of it
    for topology in ("solo", "2x-solo", "cluster-tp2"):
        assert make_plan(r, topology, CLUSTER).kv_metrics == ()
