"""Runtimes, never mixed (issue 36 item 2): SGLang's own multi-node arguments, llama.cpp on one node, any other
runtime refused in one line naming it, and no vLLM flag in another runtime's command; preflight asks each rule of
the runtime it concerns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.errors import UserError
from sparkconsole.launch.lint import Facts, preflight
from sparkconsole.launch.plan import make_plan
from sparkconsole.recipes import load_recipe
from sparkconsole.runtimes import RUNTIMES, generate_command, runtime_for

NODES = (NodeConfig(name="spark1", address="10.0.0.1", role="head"), NodeConfig(name="spark2", address="10.0.0.2"))
CLUSTER = ClusterConfig(nodes=NODES, endpoints=(), source="<test>")
# Flags (and words) only vLLM takes: a command of another runtime given one of these would not start.
VLLM_ONLY = {"--master-addr", "--master-port", "--headless", "--distributed-executor-backend", "--middleware",
             "--kv-transfer-config", "--gpu-memory-utilization", "--tensor-parallel-size", "serve"}


def recipe(tmp: Path, body: str, name: str = "r"):
    p = tmp / f"{name}.yaml"
    p.write_text('recipe_version: "2"\ncontainer: img:1\n' + body)
    return load_recipe(p)


SGLANG = """runtime: sglang
model: Qwen/Qwen3-0.6B
defaults: {port: 30000, host: 0.0.0.0, tensor_parallel: 2, gpu_memory_utilization: 0.7, max_model_len: 8192,
           served_model_name: qwen}
command: |
  python3 -m sglang.launch_server --model-path {model} --host {host} --port {port} --tp-size {tensor_parallel} \
      --mem-fraction-static {gpu_memory_utilization} --context-length {max_model_len} \
      --served-model-name {served_model_name} --enable-metrics
"""
LLAMA = """runtime: llama-cpp
model: /models/tiny.gguf
defaults: {port: 8080, host: 0.0.0.0, ctx_size: 2048}
command: llama-server -m {model} --host {host} --port {port} --ctx-size {ctx_size} --alias tiny --metrics
"""


def no_vllm_flag(argv) -> None:
    assert not VLLM_ONLY & set(argv), argv
    assert not any(a.startswith(tuple(f + "=" for f in VLLM_ONLY)) for a in argv), argv


def test_sglang_cluster_ranks_meet_with_sglangs_own_arguments_and_no_vllm_flag(tmp_path):
    r = recipe(tmp_path, SGLANG)
    plan = make_plan(r, "cluster-tp2", CLUSTER, {"eth_if": "eth0"})
    assert plan.runtime == "sglang" and plan.nodes == ("spark1", "spark2")
    head, worker = plan.server_args["spark1/server"], plan.server_args["spark2/worker"]
    for rank, argv in enumerate((head, worker)):
        no_vllm_flag(argv)
        i = argv.index("--node-rank")
        assert argv[i + 1] == str(rank) and argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--dist-init-addr") + 1] == "10.0.0.1:29501"
        assert list(argv[:3]) == ["python3", "-m", "sglang.launch_server"]
    # the rank after the first serves no HTTP: only the head is followed and polled
    assert plan.service("spark1/server").url == "http://10.0.0.1:30000" and plan.service("spark2/worker").url is None
    assert plan.service("spark1/server").model == "qwen" and plan.service("spark1/server").health_path == "/health"
    env = dict(plan.server_env["spark2/worker"])
    assert "VLLM_HOST_IP" not in env and env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert "start SGLang worker" in plan.render()
    # the same recipe shape on vLLM gets vLLM's arguments (as before)
    v = recipe(tmp_path, "model: org/m\ndefaults: {port: 8000, tensor_parallel: 2}\n"
                         "command: vllm serve {model} --port {port} -tp {tensor_parallel}\n", "v")
    vplan = make_plan(v, "cluster-tp2", CLUSTER, {"eth_if": "eth0"})
    w = vplan.server_args["spark2/worker"]
    assert "--headless" in w and w[w.index("--master-addr") + 1] == "10.0.0.1" and "--dist-init-addr" not in w
    assert dict(vplan.server_env["spark2/worker"])["VLLM_HOST_IP"] == "10.0.0.2"


def test_sglang_without_a_command_gets_one_generated_from_its_defaults(tmp_path):
    r = recipe(tmp_path, "runtime: sglang\nmodel: Qwen/Qwen3-0.6B\n"
                         "defaults: {port: 30000, tensor_parallel: 1, gpu_memory_utilization: 0.6, max_model_len: 4096,"
                         " trust_remote_code: true}\n")
    plan = make_plan(r, "solo", CLUSTER)
    argv = plan.server_args["spark1/server"]
    no_vllm_flag(argv)
    assert list(argv[:5]) == ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-0.6B"]
    for flag, value in (("--tp-size", "1"), ("--mem-fraction-static", "0.6"), ("--context-length", "4096"),
                        ("--port", "30000"), ("--host", "0.0.0.0")):
        assert argv[argv.index(flag) + 1] == value, argv
    assert "--trust-remote-code" in argv and "--enable-metrics" in argv
    assert any("generated from its defaults" in n for n in plan.notes)
    # and --set still changes a generated value, as it changes a written one
    plan = make_plan(r, "solo", CLUSTER, {"max_model_len": 2048})
    assert "2048" in plan.server_args["spark1/server"]


def test_llama_cpp_runs_solo_and_refuses_every_other_topology_in_one_line(tmp_path):
    r = recipe(tmp_path, LLAMA)
    plan = make_plan(r, "solo", CLUSTER)
    argv = plan.server_args["spark1/server"]
    no_vllm_flag(argv)
    assert list(argv[:3]) == ["llama-server", "-m", "/models/tiny.gguf"] and plan.runtime == "llama-cpp"
    assert plan.service("spark1/server").model == "tiny" and plan.service("spark1/server").url.endswith(":8080")
    for topology in ("cluster-tp2", "2x-solo", "disagg"):
        with pytest.raises(UserError) as err:
            make_plan(r, topology, CLUSTER, {"eth_if": "eth0"})
        assert "llama.cpp does not run as " + topology in str(err.value) and "\n" not in str(err.value)
        assert str(err.value).startswith(str(r.source))
    generated = recipe(tmp_path, "runtime: llama.cpp\nmodel: unsloth/Qwen3-0.6B-GGUF:Q4_K_M\n"
                                 "defaults: {max_model_len: 4096, jinja: true}\n", "g")
    argv = make_plan(generated, "solo", CLUSTER).server_args["spark1/server"]
    assert list(argv[:3]) == ["llama-server", "-hf", "unsloth/Qwen3-0.6B-GGUF:Q4_K_M"]
    assert argv[argv.index("--ctx-size") + 1] == "4096" and "--jinja" in argv and "--metrics" in argv


@pytest.mark.parametrize(("options", "words"), [
    ({"backend": "ray", "eth_if": "eth0"}, ("--backend ray is vLLM's", "SGLang")),
])
def test_sglang_refuses_vllms_ray_backend(tmp_path, options, words):
    with pytest.raises(UserError) as err:
        make_plan(recipe(tmp_path, SGLANG), "cluster-tp2", CLUSTER, options)
    assert all(w in str(err.value) for w in words)


def test_sglang_behind_a_router_needs_one_with_a_worker_api_and_plans_no_disagg(tmp_path):
    r = recipe(tmp_path, SGLANG.replace("tensor_parallel: 2", "tensor_parallel: 1"))
    with pytest.raises(UserError, match="drain gate, which SGLang has not"):
        make_plan(r, "2x-solo", CLUSTER, {"router": "simple-shuffle"})
    plan = make_plan(r, "2x-solo", CLUSTER, {"router": "vllm-router"})
    for key in ("spark1/server", "spark2/server"):
        no_vllm_flag(plan.server_args[key])
    with pytest.raises(UserError, match="disagg"):
        make_plan(r, "disagg", CLUSTER)


def test_a_runtime_sparkconsole_does_not_run_is_refused_in_one_line_naming_it(tmp_path):
    p = tmp_path / "trt.yaml"
    p.write_text('recipe_version: "2"\nruntime: trtllm\nmodel: org/m\ncontainer: img\n'
                 "command: trtllm-serve org/m --port 8000\n")
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - {name: spark1, address: 10.0.0.1}\n")
    r = subprocess.run([sys.executable, "-m", "sparkconsole", "--cluster", str(cluster), "recipe", "plan", str(p),
                        "-T", "solo", "--offline"], capture_output=True, text=True, timeout=60)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("cluster:")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "trtllm" in lines[0] and str(p) in lines[0] and "runtime" in lines[0] and "fix:" in lines[0]
    assert "Traceback" not in r.stderr
    with pytest.raises(UserError, match="'max' is not one sparkconsole runs"):
        runtime_for("max")
    assert generate_command(RUNTIMES["sglang"], "m", {}).startswith("python3 -m sglang.launch_server")
    with pytest.raises(UserError, match="does not write one for vLLM"):
        generate_command(RUNTIMES["vllm"], "m", {})


def test_a_v1_recipe_whose_command_starts_sglang_is_planned_as_sglang(tmp_path):
    p = tmp_path / "v1.yaml"
    p.write_text('recipe_version: "1"\nname: sg\ncontainer: img\nmodel: org/m\ndefaults: {port: 30000}\n'
                 "command: python3 -m sglang.launch_server --model-path org/m --host 0.0.0.0 --port {port}\n"
                 "sparkconsole: {topologies: [solo, cluster-tp2], cluster: {eth_if: eth0}}\n")
    plan = make_plan(load_recipe(p), "cluster-tp2", CLUSTER)
    assert plan.runtime == "sglang" and any("planned as SGLang" in n for n in plan.notes)
    for argv in plan.server_args.values():
        no_vllm_flag(argv)
        assert "--dist-init-addr" in argv


def test_a_command_without_port_is_followed_where_the_runtime_listens(tmp_path):
    r = recipe(tmp_path, "runtime: sglang\nmodel: org/m\ncommand: python3 -m sglang.launch_server --model-path "
                         "{model} --host 0.0.0.0 --enable-metrics\n")
    plan = make_plan(r, "solo", CLUSTER)
    assert plan.service("spark1/server").url == "http://10.0.0.1:30000"
    assert any("listens on its default 30000" in n for n in plan.notes)


GB10 = Facts(mem={"spark1": type("M", (), {"total_kb": int(121.7 * 1048576), "available_kb": None})()},
             unified={"spark1": True})


def rules(findings):
    return sorted({f.rule for f in findings})


def test_preflight_asks_sglang_for_its_own_claim_and_leaves_vllm_rules_to_vllm(tmp_path):
    # mem_fraction_static is SGLang's gpu_memory_utilization: 0.95 × 121.7 GiB is over the node's budget
    hot = recipe(tmp_path, SGLANG.replace("gpu_memory_utilization: 0.7", "gpu_memory_utilization: 0.95")
                 .replace("--enable-metrics", "--enable-metrics --cuda-graph-max-bs 8"))
    f = [x for x in preflight(hot, "solo", NODES, GB10, overrides={"tensor_parallel": 1}) if x.refuses]
    assert [x.rule for x in f if x.rule == "gpu_memory_utilization"], f
    claim = next(x for x in f if x.rule == "gpu_memory_utilization")
    assert "mem_fraction_static 0.95" in claim.message and "gpu_memory_utilization" not in claim.message
    assert "mem_fraction_static=" in (claim.fix or "")
    # vLLM's custom_ops rule reads vLLM's compilation config: an SGLang command is not asked
    ops = recipe(tmp_path, SGLANG.replace("--enable-metrics", "--enable-metrics -cc '{\"custom_ops\":[\"all\"]}'"),
                 "ops")
    assert "custom_ops" not in rules(preflight(ops, "solo", NODES, None, overrides={"tensor_parallel": 1}))
    # llama.cpp claims no share: no gpu_memory_utilization finding even on a GB10 with a small cap
    assert "gpu_memory_utilization" not in rules(preflight(recipe(tmp_path, LLAMA, "l"), "solo", NODES, GB10))


def test_preflight_warns_of_a_server_without_metrics_and_refuses_one_bound_to_loopback(tmp_path):
    quiet = recipe(tmp_path, LLAMA.replace(" --metrics", "").replace("--host {host} ", ""), "q")
    found = {f.rule: f for f in preflight(quiet, "solo", NODES, None)}
    assert found["metrics_off"].severity == "warn" and "--metrics" in found["metrics_off"].fix
    assert found["listen_address"].refuses and "127.0.0.1" in found["listen_address"].message
    assert {"metrics_off", "listen_address"}.isdisjoint(rules(preflight(recipe(tmp_path, LLAMA, "l"), "solo",
                                                                         NODES, None)))
