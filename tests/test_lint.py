"""Preflight: each rule has a case that trips it and one that passes; bundled recipes pass clean."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.launch.lint import Facts, facts_from_monitors, preflight, refusals
from sparkconsole.launch.plan import make_plan
from sparkconsole.nodes.guard import evaluate_guards
from sparkconsole.nodes.samples import GuardInputs, HostMemory
from sparkconsole.placement.modelinfo import info_from_config
from sparkconsole.recipes import bundled_recipes, find_recipe

NODES = (NodeConfig(name="spark1", address="192.168.100.10", role="head"),
         NodeConfig(name="spark2", address="192.168.100.11"))
GIB_KB = 1048576
# A GB10 as the agent reads it (gb10-facts.md: MemTotal ~121.7 GiB); plenty available, guards in order.
GB10_MEM = HostMemory(total_kb=int(121.7 * GIB_KB), available_kb=int(118 * GIB_KB), cached_kb=GIB_KB,
                      swap_total_kb=0, swap_free_kb=0)
GOOD_GUARDS = GuardInputs(swaps=(), overcommit_memory=0, min_free_kbytes=1572864, swappiness=60)


def rules(findings, refusing_only=True):
    return sorted({f.rule for f in findings if f.refuses or not refusing_only})


def check(key, topology, overrides=None, facts=None, nodes=NODES, recipe=None):
    r = recipe or find_recipe(key)
    ov = dict(overrides or {})
    return preflight(r, topology, nodes, facts, overrides=ov)


def good_facts(nodes=("spark1", "spark2"), **kw):
    base = dict(guards={n: evaluate_guards(GOOD_GUARDS, GB10_MEM, (), "vllm_node") for n in nodes},
                mem={n: GB10_MEM for n in nodes}, unified={n: True for n in nodes})
    base.update(kw)
    return Facts(**base)


@pytest.mark.parametrize("key", [r.key for r in bundled_recipes()])
def test_bundled_recipes_pass_with_healthy_nodes(key):
    r = find_recipe(key)
    for t in r.topologies:
        findings = check(key, t, facts=good_facts(image_ids={"spark1": "sha256:a", "spark2": "sha256:a"}))
        assert refusals(findings) == [], [f.line() for f in findings]


def test_gpu_memory_utilization_rule():
    # over the node's budget (121.7 − 9.5 GiB reserve): 0.95 × 121.7 GiB = 115.6 GiB (more: test_lint_budget.py)
    f = check("gpt-oss-120b", "solo", {"gpu_memory_utilization": 0.95})
    assert rules(f) == ["gpu_memory_utilization"]
    assert "0.95" in f[0].message and "DeepSeek V4 Flash" in f[0].source and "gpu_memory_utilization=0.78" in f[0].fix
    assert rules(check("gpt-oss-120b", "solo", {"gpu_memory_utilization": 0.78})) == []
    assert rules(check("gpt-oss-120b", "solo", {"gpu_memory_utilization": 0.85}), refusing_only=False) == \
        ["gpu_memory_utilization"]
    # a discrete-GPU node (not unified) is not held to the unified-memory budget
    assert rules(check("gpt-oss-120b", "solo", {"gpu_memory_utilization": 0.95},
                       Facts(unified={"spark1": False}))) == []


@pytest.mark.parametrize("extra", [
    ["--compilation-config", '{"cudagraph_mode":"PIECEWISE","custom_ops":["all"]}'],
    ["--compilation-config={'custom_ops': ['all']}"],
    ['-cc.custom_ops=["all"]'],
])
def test_custom_ops_all_rule(extra):
    # refused without the compile caches the launch mounts by default (--no-cache-dirs)
    f = check("llama-3.1-8b", "solo", {"extra_args": extra, "no_cache_dirs": True})
    assert rules(f) == ["custom_ops_all"] and "freezing both nodes" in f[0].source
    # with them mounted (the default, as the runner) it is a warning
    f = check("llama-3.1-8b", "solo", {"extra_args": extra})
    assert rules(f) == [] and rules(f, refusing_only=False) == ["custom_ops_all"]


def test_custom_ops_other_values_pass():
    assert rules(check("llama-3.1-8b", "solo", {"extra_args": ["-cc.custom_ops=[\"+rms_norm\"]"]})) == []


def test_cluster_needs_eager_or_piecewise():
    r = find_recipe("deepseek-v4-flash")
    full = r.command.replace('{{"cudagraph_mode":"PIECEWISE"}}', '{{"cudagraph_mode":"FULL_AND_PIECEWISE"}}')
    # full graphs across nodes: a warning carrying the PIECEWISE fix, not a refusal (issue 23 item 8)
    f = check("", "cluster-tp2", recipe=replace(r, command=full))
    assert rules(f) == [] and rules(f, refusing_only=False) == ["cluster_cudagraphs"]
    warned = [x for x in f if x.rule == "cluster_cudagraphs"]
    assert {x.node for x in warned} == {"spark1", "spark2"} and all(x.severity == "warn" for x in warned)
    assert '"cudagraph_mode":"PIECEWISE"' in warned[0].fix and "custom_ops" in warned[0].source
    none = r.command.replace("--compilation-config '{{\"cudagraph_mode\":\"PIECEWISE\"}}' \\\n", "")
    assert "compilation-config" not in none
    assert rules(check("", "cluster-tp2", recipe=replace(r, command=none)), refusing_only=False) == ["cluster_cudagraphs"]
    assert rules(check("", "cluster-tp2", {"extra_args": ["--enforce-eager"]}, recipe=replace(r, command=none)),
                 refusing_only=False) == []
    assert rules(check("deepseek-v4-flash", "cluster-tp2"), refusing_only=False) == []          # PIECEWISE
    # single-node launches are not held to it
    assert rules(check("llama-3.1-8b", "solo")) == []


def test_mxfp4_lm_head_with_tp2_is_a_warning():
    # The upstream recipe keeps lm_head in MXFP4 for solo only; that is not a freeze, so a recipe whose author set
    # TP 2 on purpose is warned, not refused (issue 39).
    f = check("gpt-oss-120b", "cluster-tp2", {"mxfp4_layers": "moe,qkv,o,lm_head"})
    assert rules(f) == [] and rules(f, refusing_only=False) == ["mxfp4_lm_head_tp"]
    assert {x.severity for x in f if x.rule == "mxfp4_lm_head_tp"} == {"warn"}
    assert "spark-vllm-docker" in f[0].source and "not a known freeze" in f[0].message
    assert rules(check("gpt-oss-120b", "cluster-tp2")) == []                   # moe,qkv,o for TP=2
    assert rules(check("gpt-oss-120b", "solo", {"mxfp4_layers": "moe,qkv,o,lm_head"})) == []


def test_mdns_rule():
    local = (replace(NODES[0], address="spark1.local"), NODES[1])
    f = check("gpt-oss-120b", "solo", nodes=local)
    assert rules(f) == ["mdns_address"] and "spark1.local" in f[0].message
    f = check("llama-3.1-8b", "solo", {"extra_args": ["--otlp-traces-endpoint", "http://collector.local:4317"]})
    assert rules(f) == ["mdns_address"]
    assert rules(check("gpt-oss-120b", "solo")) == []


def test_least_busy_over_identical_backends_rule():
    f = check("gpt-oss-120b", "2x-solo", {"router": "least-busy"})
    assert rules(f) == ["least_busy_identical"] and "Where Two Sparks Beat One" in f[0].source
    assert rules(check("gpt-oss-120b", "2x-solo", {"router": "simple-shuffle"})) == []


@pytest.mark.parametrize("litellm", [
    {"version": "1.82.7"},
    {"image": "ghcr.io/berriai/litellm:main-v1.82.8", "version": None},
])
def test_compromised_litellm_is_blocked_even_with_force(litellm):
    r = find_recipe("gpt-oss-120b")
    bad = replace(r, router=replace(r.router, litellm=replace(r.router.litellm, **litellm)))
    for router in ("vllm-router", "simple-shuffle"):          # refused at plan time whatever router is chosen
        f = check("", "2x-solo", {"router": router}, recipe=bad)
        assert rules(f) == ["router_compromised"]
        assert [x.rule for x in refusals(f, force=True)] == ["router_compromised"]
    ok = replace(r, router=replace(r.router, litellm=replace(r.router.litellm, version="1.82.6",
                                                             image="ghcr.io/berriai/litellm:v1.82.6")))
    assert rules(check("", "2x-solo", {"router": "simple-shuffle"}, recipe=ok)) == []


def test_oom_guards_rule_uses_guard_results():
    swap_on = GuardInputs(swaps=("/swap.img",), overcommit_memory=1, min_free_kbytes=67584, swappiness=60)
    facts = good_facts(guards={"spark1": evaluate_guards(swap_on, GB10_MEM, (), "vllm_node")})
    f = check("gpt-oss-120b", "solo", facts=facts)
    refusing = [x for x in f if x.refuses]
    assert {x.rule for x in refusing} == {"oom_guards"} and len(refusing) == 2     # swap, overcommit 1
    assert any("swapoff" in (x.fix or "") for x in refusing)
    # a small min_free_kbytes is a warning, as the dashboard and `status` say it (severity.py; issue 39)
    [low] = [x for x in f if x.rule == "oom_guards" and not x.refuses]
    assert low.severity == "warn" and "vm.min_free_kbytes=67584" in low.message
    assert all(x.node == "spark1" for x in refusing)
    assert refusals(f, force=True) == []                                            # --force overrides
    assert rules(check("gpt-oss-120b", "solo", facts=good_facts())) == []


def test_oom_guards_page_cache_and_cap():
    cached = replace(GB10_MEM, cached_kb=40 * GIB_KB)
    facts = good_facts(guards={"spark1": evaluate_guards(GOOD_GUARDS, cached, (), "vllm_node")})
    f = check("gpt-oss-120b", "solo", facts=facts)
    # the same fix `status` says: the command, and the launch's own way (issue 39: they differed)
    assert rules(f) == [] and [x.fix for x in f if x.rule == "oom_guards"] == [
        "sync && echo 3 | sudo tee /proc/sys/vm/drop_caches (or launch with --drop-caches, which drops it on each "
        "node before the model loads)"]
    assert [x for x in check("gpt-oss-120b", "solo", {"drop_caches": True}, facts) if x.rule == "oom_guards"] == []
    r = find_recipe("gpt-oss-120b")
    uncapped = replace(r, container_settings=replace(r.container_settings, memory=None))
    assert rules(check("", "solo", recipe=uncapped)) == ["oom_guards"]
    huge = replace(r, container_settings=replace(r.container_settings, memory="128g"))
    assert rules(check("", "solo", facts=good_facts(), recipe=huge)) == ["oom_guards"]


def test_image_must_match_on_every_cluster_node():
    f = check("deepseek-v4-flash", "cluster-tp2", facts=Facts(image_ids={"spark1": "sha256:aaa", "spark2": "sha256:bbb"}))
    assert rules(f) == ["image_mismatch"]
    f = check("deepseek-v4-flash", "cluster-tp2", facts=Facts(image_ids={"spark1": "sha256:aaa", "spark2": None}))
    assert rules(f) == ["image_missing"] and f[0].node == "spark2"
    assert rules(check("deepseek-v4-flash", "cluster-tp2",
                       facts=Facts(image_ids={"spark1": "sha256:aaa", "spark2": "sha256:aaa"}))) == []


def test_memory_fit_from_built_in_figures_and_from_the_node_cache():
    f = check("llama-3.1-8b", "solo", {"gpu_memory_utilization": 0.1})          # 12 GiB < 15 GiB of weights
    assert rules(f) == ["weights_over_claim"] and "weights alone are 15.0 GiB" in f[0].message
    assert f[0].node == "spark1" and "metadata" in f[0].source
    assert rules(check("llama-3.1-8b", "solo", {"gpu_memory_utilization": 0.3})) == []
    # from the node's cache (config.json + safetensors headers): a long context no longer fits
    cfg = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
           "torch_dtype": "bfloat16"}
    facts = Facts(model_info=info_from_config(cfg, source="hf-cache", weights_b=16_060_522_496))
    # 15 GiB of weights + 16 GiB of bf16 KV for 131072 tokens > 0.25 × 121.7 GiB
    f = check("llama-3.1-8b", "solo", {"max_model_len": 131072, "gpu_memory_utilization": 0.25}, facts)
    assert rules(f) == ["memory_fit"] and "hf-cache" in f[0].source and "131072-token" in f[0].message
    assert rules(check("llama-3.1-8b", "solo", {"max_model_len": 8192, "gpu_memory_utilization": 0.25}, facts)) == []


def test_memory_headroom_rule():
    tight = replace(GB10_MEM, available_kb=40 * GIB_KB)      # something else holds most of the memory
    f = check("gpt-oss-120b", "solo", facts=good_facts(mem={"spark1": tight}))
    assert "memory_headroom" in rules(f)
    assert "memory_headroom" not in rules(check("gpt-oss-120b", "solo", facts=good_facts()))


def test_a_placed_launch_is_refused_for_memory_once_by_its_placement():
    """The nodes read and the launch placed beside what runs: a claim over the room is one refusal (memory_budget,
    which counts MemAvailable), not also memory_headroom's and gpu_memory_utilization's; the warning stays."""
    from sparkconsole.errors import UserError
    tight = replace(GB10_MEM, available_kb=40 * GIB_KB)
    unplaced = check("gpt-oss-120b", "solo", {"gpu_memory_utilization": 0.97}, facts=good_facts(mem={"spark1": tight}))
    assert {"memory_headroom", "gpu_memory_utilization"} <= {f.rule for f in refusals(unplaced)}
    short = UserError("gpt-oss-120b does not fit: it takes 117.8 GiB per node (claim)", fix="stop a workload")
    placed = check("gpt-oss-120b", "solo", {"gpu_memory_utilization": 0.97},
                   facts=good_facts(mem={"spark1": tight}, placement=short))
    assert [f.rule for f in refusals(placed)] == ["memory_budget"], placed
    assert "memory_headroom" not in rules(placed)


def test_parallel_size_must_match_nodes():
    assert rules(check("llama-3.1-8b", "solo", {"tensor_parallel": 2})) == ["parallel_size"]
    assert rules(check("gpt-oss-120b", "cluster-tp2", {"tensor_parallel": 1})) == ["parallel_size"]


def test_unplannable_recipe_is_one_refusing_finding():
    f = check("deepseek-v4-flash", "solo")
    assert [x.rule for x in f] == ["plan"] and "requires cluster mode" in f[0].message
    # the recipe's own words: it says cluster_only, not why (issue 39: "the model is too large for one node")
    assert "cluster_only: true" in f[0].message and "too large" not in f[0].message


FORK_DISAGG = """\
recipe_version: "1"
name: fork disagg
model: org/m
container: vllm-node
defaults: {{port: 8000, host: 0.0.0.0, tensor_parallel: 1, pipeline_parallel: 1}}
command: |
  vllm serve org/m --host {{host}} --port {{port}} {parallel}
sparkconsole:
  topologies: [solo, 2x-solo, disagg]
"""


@pytest.mark.parametrize("parallel, sets", [
    ("--tensor-parallel-size 2", None),                                   # a number written in the command
    ("-tp {tensor_parallel} -pp {pipeline_parallel}", {"pipeline_parallel": 2}),   # PP is the wrong one
    ("--tensor-parallel-size {tensor_parallel}", {"extra_args": ["-tp", "2"]}),    # the arguments after -- win
    ("--tensor-parallel-size {tensor_parallel}", {"tensor_parallel": 2}),
])
def test_a_parallel_size_fix_changes_the_plan(tmp_path, parallel, sets):
    # Issue 39: a disagg recipe was told `--set tensor_parallel=…`, which changed nothing. A `--set` fix must clear
    # the refusal once applied; any other fix names where the size really comes from.
    from sparkconsole.recipes import load_recipe
    path = tmp_path / "fork.yaml"
    path.write_text(FORK_DISAGG.format(parallel=parallel))
    r = load_recipe(path)
    for topology in ("solo", "disagg"):
        found = [f for f in check("fork", topology, sets, recipe=r) if f.rule == "parallel_size"]
        assert found, topology
        for f in found:
            if f.fix.startswith("--set"):
                key, _, value = f.fix.removeprefix("--set ").partition("=")
                again = check("fork", topology, {**(sets or {}), key: int(value)}, recipe=r)
                assert "parallel_size" not in rules(again), (f.fix, [x.line() for x in again])
            else:
                assert ("writes --tensor-parallel-size 2 itself" in f.fix if "{" not in parallel
                        else "the arguments after -- give --tensor-parallel-size 2" in f.fix), f.fix


def test_finding_line_cites_source_and_fix():
    f = check("gpt-oss-120b", "2x-solo", {"router": "least-busy"})[0]
    line = f.line()
    assert line.startswith("REFUSE least_busy_identical:") and "fix: use --router" in line
    assert line.endswith("(why: docs/PREFLIGHT.md#least_busy_identical)")
    # the evidence only with --explain, and named as a user can find it (issue 39: "seed 000")
    assert f.line(explain=True).splitlines()[1] == "    evidence: " + f.source
    assert "'Solo vs Cluster: Where Two Sparks Beat One'" in f.source


def test_facts_from_live_monitor_ticks():
    from sparkconsole.nodes.monitor import NodeMonitor
    nm = NodeMonitor(NODES[0], None, interval=0.5, history=4)
    nm.handle_line(json.dumps({
        "type": "tick", "seq": 1, "time": 1763830006.1,
        "gpus": [{"index": 0, "temp_c": 41, "unified": True}],
        "mem": {"total_kb": 127614056, "available_kb": 123000000, "cached_kb": 900000,
                "swap_total_kb": 8388604, "swap_free_kb": 8388604},
        "guards": {"swaps": ["/swap.img"], "overcommit_memory": 0, "min_free_kbytes": 1572864, "swappiness": 60},
    }))
    facts = facts_from_monitors({"spark1": nm})
    assert facts.unified == {"spark1": True} and facts.mem["spark1"].total_kb == 127614056
    f = preflight(find_recipe("gpt-oss-120b"), "solo", NODES, {"spark1": nm})       # monitors accepted directly
    assert [x.message.split(":")[0] for x in f if x.refuses] == ["Swap off"]


def test_plan_argument_skips_replanning():
    plan = make_plan(find_recipe("gpt-oss-120b"), "2x-solo", ClusterConfig(nodes=NODES, endpoints=()),
                     {"router": "least-busy"})
    assert rules(preflight(find_recipe("gpt-oss-120b"), "2x-solo", NODES, None, plan=plan)) == ["least_busy_identical"]


def test_model_probe_reads_a_local_directory_and_a_linked_cache_with_a_real_shell(tmp_path):
    import subprocess

    from sparkconsole.placement.modelinfo import parse_probe, probe_command
    from tests.test_estimate import SHARDS, WEIGHTS, write_safetensors
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128}
    # a local model directory (path with a space: the command quotes it)
    local = tmp_path / "my model"
    local.mkdir()
    (local / "config.json").write_text(json.dumps(cfg))
    write_safetensors(local / "model.safetensors", SHARDS[0])
    out = subprocess.run(["sh", "-c", probe_command(str(local), python=sys.executable)], capture_output=True,
                         text=True)
    info = parse_probe(out.stdout)
    assert out.returncode == 0 and info is not None and info.weights_b == 2 * 64 * 512 * 2 + 512 * 2
    assert (info.num_layers, info.num_kv_heads, info.head_dim) == (2, 2, 32)
    # a Hugging Face cache snapshot: files are relative symlinks into blobs
    hub = tmp_path / "hf" / "hub" / "models--org--Model-1B"
    (hub / "blobs").mkdir(parents=True)
    for i, shard in enumerate(SHARDS):
        write_safetensors(hub / "blobs" / f"b{i}", shard)
    snap = hub / "snapshots" / "0123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(cfg))
    for i in range(len(SHARDS)):
        (snap / f"model-{i:05d}.safetensors").symlink_to(f"../../blobs/b{i}")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run(["sh", "-c", probe_command("org/Model-1B", python=sys.executable)], capture_output=True,
                         text=True, env=env)
    assert parse_probe(out.stdout).weights_b == WEIGHTS
    # not on the node: exit 3, nothing parsed
    out = subprocess.run(["sh", "-c", probe_command("org/Absent", python=sys.executable)], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 3 and parse_probe(out.stdout) is None


def test_preflight_on_a_bigger_cluster_uses_the_nodes_a_launch_would():
    three = (*NODES, NodeConfig(name="spark3", address="192.168.100.12"))
    guards = {"spark3": evaluate_guards(GuardInputs(swaps=("/swap.img",), overcommit_memory=0,
                                                    min_free_kbytes=1572864), GB10_MEM, (), "vllm_node")}
    # spark3 is not used by 2x-solo (head first, then file order): its swap does not refuse the launch
    assert rules(check("gpt-oss-120b", "2x-solo", facts=Facts(guards=guards), nodes=three)) == []
    assert rules(check("gpt-oss-120b", "2x-solo", {"nodes": ["spark1", "spark3"]}, Facts(guards=guards),
                       nodes=three)) == ["oom_guards"]


INTERNAL = ("seed 0", "seed0", "gb10-facts", "client-ceilings", ".csv", "reference notes")


def every_rule_findings():
    """Findings of every rule the bundled recipes and a few bad facts trip (the same scenarios as above)."""
    r = find_recipe("gpt-oss-120b")
    bad = GuardInputs(swaps=("/swap.img",), overcommit_memory=1, min_free_kbytes=67584, swappiness=60)
    tight = replace(GB10_MEM, available_kb=40 * GIB_KB, cached_kb=40 * GIB_KB)
    out = list(check("gpt-oss-120b", "solo", {"gpu_memory_utilization": 0.85},
                     facts=good_facts(guards={"spark1": evaluate_guards(bad, tight, (), "vllm_node")},
                                      mem={"spark1": tight})))
    out += check("gpt-oss-120b", "solo", {"gpu_memory_utilization": 0.81})
    out += check("gpt-oss-120b", "2x-solo", {"router": "least-busy"})
    out += check("gpt-oss-120b", "cluster-tp2", {"mxfp4_layers": "moe,qkv,o,lm_head"})
    out += check("gpt-oss-120b", "cluster-tp2", {"tensor_parallel": 1})
    out += check("gpt-oss-120b", "solo", {"extra_args": ["--compilation-config", '{"custom_ops":["all"]}'],
                                           "no_cache_dirs": True})
    out += check("deepseek-v4-flash", "cluster-tp2", facts=Facts(image_ids={"spark1": "sha256:a", "spark2": None}))
    out += check("deepseek-v4-flash", "solo")
    out += check("deepseek-v4-flash", "cluster-tp2", {"extra_args": ["--compilation-config", '{"cudagraph_mode":"FULL"}']})
    out += check("llama-3.1-8b", "solo", {"max_model_len": 10_000_000})
    out += check("gpt-oss-120b", "solo", nodes=(replace(NODES[0], address="spark1.local"), NODES[1]))
    pinned = replace(r, router=replace(r.router, litellm=replace(r.router.litellm, version="1.82.7")))
    out += preflight(pinned, "solo", NODES, None)
    out += preflight(r, "solo", NODES, Facts(model_missing=("spark1",)))
    return out


def test_no_user_text_names_a_source_the_user_cannot_open():
    # Issue 39: lint lines ended in "(source: seed 004 …)" or "gb10-facts.md". Each line now points at its rule's
    # section of docs/PREFLIGHT.md, and the evidence (--explain) names published runs and public threads.
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[1] / "docs" / "PREFLIGHT.md").read_text()
    headings = {line[3:].strip() for line in doc.splitlines() if line.startswith("## ")}
    found = every_rule_findings()
    assert {f.rule for f in found} >= {"gpu_memory_utilization", "oom_guards", "memory_headroom", "memory_fit",
                                       "least_busy_identical", "mxfp4_lm_head_tp", "parallel_size", "custom_ops_all",
                                       "image_missing", "plan", "mdns_address", "router_compromised",
                                       "model_missing", "cluster_cudagraphs"}
    for f in found:
        text = f.line(explain=True) + " " + f.message + " " + (f.fix or "")
        assert not any(word in text for word in INTERNAL), text
        assert f.rule in headings, f"docs/PREFLIGHT.md has no section {f.rule}"
def test_earlyoom_missing_is_said_but_never_refuses():
    from sparkconsole.nodes.samples import EarlyOom
    no_eo = replace(GOOD_GUARDS, earlyoom=EarlyOom(installed=False))
    facts = good_facts(guards={"spark1": evaluate_guards(no_eo, GB10_MEM, (), "vllm_node")})
    f = [x for x in check("gpt-oss-120b", "solo", facts=facts) if x.rule == "oom_guards"]
    assert [x.severity for x in f] == ["warn"] and "earlyoom" in f[0].message and "apt-get install" in f[0].fix


def test_every_rule_has_its_section_in_docs_preflight():
    """Every finding's `(why: docs/PREFLIGHT.md#RULE)` opens a section: each rule named in the preflight modules."""
    import re
    from pathlib import Path

    from sparkconsole.launch import lint_workloads
    root = Path(__file__).resolve().parents[1]
    headings = {line[3:].strip() for line in (root / "docs" / "PREFLIGHT.md").read_text().splitlines()
                if line.startswith("## ")}
    rules_named = {lint_workloads.RULE}
    for path in (root / "sparkconsole" / "launch").glob("*.py"):
        rules_named |= set(re.findall(r'(?:Finding|_finding)\(\s*"([a-z_]+)"', path.read_text()))
    assert rules_named - headings == set()
