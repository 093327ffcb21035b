"""The memory fit (placement/estimate.py, placement/modelinfo.py): a model read from a Hugging Face cache laid out as
`hf download` leaves it (config.json and safetensors files written by the `safetensors` library), the recipe's
metadata when the cache has nothing, MLA's latent KV (DeepSeek), and each node's share of a plan."""

from __future__ import annotations

import ctypes
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.launch.plan import make_plan
from sparkconsole.placement import modelinfo
from sparkconsole.placement.estimate import FP8_DS_MLA_ENTRY_B, GB10_MEMTOTAL_B, estimate_plan, render
from sparkconsole.placement.modelinfo import GIB, parse_probe, probe_command
from sparkconsole.recipes import load_recipe

safetensors = pytest.importorskip("safetensors")

NODES = (NodeConfig(name="spark1", address="10.0.0.1", role="head"), NodeConfig(name="spark2", address="10.0.0.2"))
CLUSTER = ClusterConfig(nodes=NODES, endpoints=(), source="<test>")
REV = "0123456789abcdef0123456789abcdef01234567"


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A real safetensors file, written by the library: name -> (dtype, shape, bytes)."""
    buffers = {name: ctypes.create_string_buffer(size) for name, (_, _, size) in tensors.items()}
    specs = {name: safetensors.TensorSpec(dtype=dtype, shape=shape, data_ptr=ctypes.addressof(buffers[name]),
                                          data_len=size) for name, (dtype, shape, size) in tensors.items()}
    safetensors.serialize_file(specs, str(path), metadata={"format": "pt"})


def hf_cache(home: Path, repo: str, config: dict, shards: list[dict[str, tuple[str, list[int], int]]]) -> Path:
    """HF_HOME/hub/models--org--name/{refs/main, snapshots/REV/…} as huggingface_hub leaves a download."""
    root = home / "hub" / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / REV
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(REV)
    (snap / "config.json").write_text(json.dumps(config))
    for i, shard in enumerate(shards):
        write_safetensors(snap / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors", shard)
    return snap


def read_node_cache(home: Path, source: str) -> tuple[int, str]:
    """NODE_SCRIPT run as the node's shell runs it (`python3 -c …`), against that cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    r = subprocess.run(["sh", "-c", probe_command(source, python=sys.executable)], capture_output=True, text=True,
                       env={**env, "HF_HOME": str(home)}, timeout=60)
    return r.returncode, r.stdout


LLAMA_CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4,
             "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512, "torch_dtype": "bfloat16",
             "max_position_embeddings": 8192}
# two shards, bf16 and fp8 tensors: 2·(64·512)·2 + 512·2 bytes, and 512·512·1
SHARDS = [{"embed": ("bfloat16", [64, 512], 64 * 512 * 2), "lm_head": ("bfloat16", [64, 512], 64 * 512 * 2),
           "norm": ("bfloat16", [512], 512 * 2)},
          {"w": ("float8_e4m3fn", [512, 512], 512 * 512)}]
WEIGHTS = 2 * 64 * 512 * 2 + 512 * 2 + 512 * 512
PARAMS = 2 * 64 * 512 + 512 + 512 * 512


def recipe_file(tmp: Path, model: str, extra: str = "", topologies: str = "[solo, cluster-tp2]") -> Path:
    p = tmp / "r.yaml"
    p.write_text(f"""recipe_version: "1"
name: estimate test
model: {model}
container: img
defaults: {{port: 8000, tensor_parallel: 1, pipeline_parallel: 1, max_model_len: 4096, gpu_memory_utilization: 0.7}}
command: vllm serve {model} --port {{port}} -tp {{tensor_parallel}} -pp {{pipeline_parallel}} --max-model-len {{max_model_len}} --gpu-memory-utilization {{gpu_memory_utilization}}{extra}
sparkconsole: {{topologies: {topologies}, cluster: {{eth_if: eth0}}}}
""")
    return p


def test_node_cache_weights_are_the_safetensors_headers_sum_and_config_gives_the_shape(tmp_path):
    hf_cache(tmp_path / "hf", "org/tiny", LLAMA_CFG, SHARDS)
    rc, out = read_node_cache(tmp_path / "hf", "org/tiny")
    assert rc == 0, out
    info = parse_probe(out)
    assert info is not None and info.source == "hf-cache"
    assert (info.weights_b, info.params) == (WEIGHTS, PARAMS)
    assert (info.num_layers, info.num_kv_heads, info.head_dim, info.dtype) == (4, 2, 64, "bfloat16")
    # a model the node does not have: exit 3 (preflight's model_missing), nothing parsed
    rc, out = read_node_cache(tmp_path / "hf", "org/absent")
    assert rc == modelinfo.MISSING_RC and parse_probe(out) is None


def test_a_corrupt_safetensors_file_is_said_not_taken_for_weights(tmp_path):
    snap = hf_cache(tmp_path / "hf", "org/tiny", LLAMA_CFG, SHARDS[:1])
    (snap / "model-bad.safetensors").write_bytes(b"\xff" * 64)
    info = parse_probe(read_node_cache(tmp_path / "hf", "org/tiny")[1])
    assert info is not None and info.weights_b == 2 * 64 * 512 * 2 + 512 * 2
    assert any("model-bad.safetensors: not a safetensors file" in n for n in info.notes)


def test_each_node_holds_its_share_of_weights_and_kv_heads(tmp_path):
    hf_cache(tmp_path / "hf", "org/tiny", LLAMA_CFG, SHARDS)
    info = parse_probe(read_node_cache(tmp_path / "hf", "org/tiny")[1])
    recipe = load_recipe(recipe_file(tmp_path, "org/tiny"))
    solo = estimate_plan(recipe, make_plan(recipe, "solo", CLUSTER), {"spark1": 100 * GIB}, info=info)
    assert len(solo) == 1
    e = solo[0]
    assert (e.node, e.server, e.weights_b, e.source) == ("spark1", "spark1/server", WEIGHTS, "hf-cache")
    # K and V, head_dim 64, 2 KV heads, bf16 (the config's dtype: "auto"), 4 layers
    assert e.kv_per_token_b == 2 * 64 * 2 * 2 * 4 and e.kv_b == e.kv_per_token_b * 4096
    assert e.claim_b == int(0.7 * 100 * GIB) and e.fits is True
    assert e.need_b == WEIGHTS + e.kv_b + e.overhead_b

    tp2 = estimate_plan(recipe, make_plan(recipe, "cluster-tp2", CLUSTER, {"tensor_parallel": 2}),
                        {"spark1": 100 * GIB, "spark2": 50 * GIB}, info=info)
    assert [(x.node, x.weights_b) for x in tp2] == [("spark1", math.ceil(WEIGHTS / 2)),
                                                    ("spark2", math.ceil(WEIGHTS / 2))]
    assert {x.kv_per_token_b for x in tp2} == {2 * 64 * 1 * 2 * 4}       # one KV head per rank
    assert [x.claim_b for x in tp2] == [int(0.7 * 100 * GIB), int(0.7 * 50 * GIB)]   # each node's own MemTotal


def test_more_ranks_than_kv_heads_keep_one_head_each_and_fp8_kv_halves_it(tmp_path):
    hf_cache(tmp_path / "hf", "org/tiny", {**LLAMA_CFG, "num_key_value_heads": 1}, SHARDS)
    info = parse_probe(read_node_cache(tmp_path / "hf", "org/tiny")[1])
    recipe = load_recipe(recipe_file(tmp_path, "org/tiny", " --kv-cache-dtype fp8"))
    [a, b] = estimate_plan(recipe, make_plan(recipe, "cluster-tp2", CLUSTER, {"tensor_parallel": 2}), {}, info=info)
    assert a.kv_per_token_b == b.kv_per_token_b == 2 * 64 * 1 * 1 * 4
    assert any("each rank keeps one" in n for n in a.notes)
    assert a.total_b == GB10_MEMTOTAL_B and any("121.7 GiB assumed" in n for n in a.notes)


DEEPSEEK_CFG = {"model_type": "deepseek_v32", "num_hidden_layers": 61, "num_attention_heads": 128,
                "num_key_value_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128, "v_head_dim": 128, "index_topk": 2048, "torch_dtype": "bfloat16",
                "max_position_embeddings": 163840}


@pytest.mark.parametrize(("kv_flag", "cfg", "per_layer"), [
    (" --kv-cache-dtype fp8", DEEPSEEK_CFG, FP8_DS_MLA_ENTRY_B),         # sparse MLA + fp8: vLLM's fp8_ds_mla
    (" --kv-cache-dtype fp8_ds_mla", DEEPSEEK_CFG, FP8_DS_MLA_ENTRY_B),
    ("", DEEPSEEK_CFG, (512 + 64) * 2),                                  # auto: the latent in bf16
    (" --kv-cache-dtype fp8", {k: v for k, v in DEEPSEEK_CFG.items() if k != "index_topk"}, 512 + 64),  # dense MLA
])
def test_mla_kv_is_one_latent_per_layer_whole_on_every_tensor_parallel_rank(tmp_path, kv_flag, cfg, per_layer):
    hf_cache(tmp_path / "hf", "deepseek-ai/DeepSeek-V3.2", cfg, SHARDS[:1])
    info = parse_probe(read_node_cache(tmp_path / "hf", "deepseek-ai/DeepSeek-V3.2")[1])
    assert info is not None and info.mla
    recipe = load_recipe(recipe_file(tmp_path, "deepseek-ai/DeepSeek-V3.2", kv_flag))
    tp2 = estimate_plan(recipe, make_plan(recipe, "cluster-tp2", CLUSTER, {"tensor_parallel": 2}), {}, info=info)
    # 61 layers × the per-layer entry, not divided by TP (the per-head formula would give 2·128·56·61·2 ÷ 2)
    assert [e.kv_per_token_b for e in tp2] == [per_layer * 61] * 2
    pp2 = estimate_plan(recipe, make_plan(recipe, "cluster-tp2", CLUSTER,
                                          {"tensor_parallel": 1, "pipeline_parallel": 2}), {}, info=info)
    assert [e.kv_per_token_b for e in pp2] == [per_layer * 31] * 2       # each stage 31 of the 61 layers


def test_without_the_model_in_a_cache_the_bundled_models_figures_answer_and_unknown_says_so(tmp_path):
    recipe = load_recipe(recipe_file(tmp_path, "meta-llama/Llama-3.1-8B-Instruct"))
    [e] = estimate_plan(recipe, make_plan(recipe, "solo", CLUSTER), {"spark1": 120 * GIB})
    assert e.source == "metadata" and e.weights_b == int(14.96 * GIB)
    assert e.kv_per_token_b == 2 * 128 * 8 * 2 * 32
    recipe = load_recipe(recipe_file(tmp_path, "org/nobody-knows"))
    [e] = estimate_plan(recipe, make_plan(recipe, "solo", CLUSTER), {"spark1": 120 * GIB})
    assert (e.source, e.weights_b, e.need_b, e.fits) == ("unknown", None, None, None)
    text = "\n".join(render([e]))
    assert "weights ? " in text and "fit unknown" in text and "layer count is not known" in text


def test_weights_alone_over_the_claim_reads_as_not_fitting(tmp_path):
    hf_cache(tmp_path / "hf", "org/tiny", LLAMA_CFG, SHARDS)
    info = parse_probe(read_node_cache(tmp_path / "hf", "org/tiny")[1])
    recipe = load_recipe(recipe_file(tmp_path, "org/tiny"))
    [e] = estimate_plan(recipe, make_plan(recipe, "solo", CLUSTER, {"gpu_memory_utilization": 0.5}),
                        {"spark1": WEIGHTS}, info=info)
    assert e.weights_exceed_claim and e.fits is False and e.kv_tokens_fit == 0
    assert "DOES NOT FIT" in render([e])[0]


def test_the_hub_is_never_asked_offline(monkeypatch):
    import asyncio
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert asyncio.run(modelinfo.read_hub("meta-llama/Llama-3.1-8B-Instruct")) is None


def test_the_test_beds_cpu_vllm_fits_its_kv_space_and_one_too_long_for_it_does_not(tmp_path):
    """vLLM CPU keeps its KV cache in VLLM_CPU_KVCACHE_SPACE beside its weights: the bundled tiny-testbed recipe
    (1 GiB) fits a 2048-token sequence of the tiny model (float32 KV, --dtype float32), and a context that needs more
    than the space does not."""
    from sparkconsole.recipes import find_recipe
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 128,
           "dtype": "float32", "max_position_embeddings": 4096}
    info = modelinfo.info_from_config(cfg, source="hf-cache", weights_b=2_886_144)
    recipe = find_recipe("tiny-testbed")
    [e] = estimate_plan(recipe, make_plan(recipe, "solo", CLUSTER), {}, info=info)
    assert e.kv_per_token_b == 2 * 32 * 4 * 4 * 2 and e.kv_b == e.kv_per_token_b * 2048   # float32: 4 bytes
    assert e.fits is True and e.claim_b == 2_886_144 + 1 * GIB + e.overhead_b
    [e] = estimate_plan(recipe, make_plan(recipe, "solo", CLUSTER, {"max_model_len": 1_000_000}), {}, info=info)
    assert e.fits is False


V2_META = """recipe_version: "2"
model: org/eight-b
container: img
metadata: {model_params: 8B, model_dtype: bfloat16, kv_dtype: fp8, num_layers: 32, num_kv_heads: 8, head_dim: 128}
defaults: {port: 8000, max_model_len: 8192, gpu_memory_utilization: 0.5}
command: vllm serve {model} --port {port} --max-model-len {max_model_len} --gpu-memory-utilization {gpu_memory_utilization}
"""


def test_a_v2_recipes_metadata_answers_when_no_cache_has_the_model_and_the_cache_wins_when_one_does(tmp_path):
    (tmp_path / "m.yaml").write_text(V2_META)
    recipe = load_recipe(tmp_path / "m.yaml")
    plan = make_plan(recipe, "solo", CLUSTER)
    [e] = estimate_plan(recipe, plan, {"spark1": 100 * GIB})
    # sparkrun's keys: 8B parameters in bf16, an fp8 KV cache (the command sets no --kv-cache-dtype)
    assert (e.source, e.weights_b) == ("metadata", 16 * 10 ** 9)
    assert e.kv_per_token_b == 2 * 128 * 8 * 1 * 32 and e.kv_b == e.kv_per_token_b * 8192
    assert e.claim_b == 50 * GIB and e.fits is True
    # the node's cache holds the model: its header bytes and its config win; metadata fills nothing they know
    hf_cache(tmp_path / "hf", "org/eight-b", LLAMA_CFG, SHARDS)
    info = parse_probe(read_node_cache(tmp_path / "hf", "org/eight-b")[1])
    [e] = estimate_plan(recipe, plan, {"spark1": 100 * GIB}, info=info)
    assert (e.source, e.weights_b) == ("hf-cache", WEIGHTS)
    assert e.kv_per_token_b == 2 * 64 * 2 * 1 * 4           # the cache's shape, the metadata's fp8 KV dtype


def test_recipe_plan_and_lint_print_the_memory_fit(tmp_path):
    """`recipe plan` (on paper: the bundled model's figures) and `recipe lint --offline` show it, one line per
    server; a claim below the weights is refused by preflight, naming both."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - {name: spark1, address: 10.0.0.1}\n")

    def sc(*args):
        return subprocess.run([sys.executable, "-m", "sparkconsole", "--cluster", str(cluster), "recipe", *args],
                              capture_output=True, text=True, timeout=120)
    plan = sc("plan", "llama-3.1-8b", "-T", "solo", "--offline")
    assert plan.returncode == 0, plan.stderr
    line = next(ln for ln in plan.stdout.splitlines() if ln.startswith("memory [spark1/server]"))
    assert "weights 15.0 GiB" in line and "(128.0 KiB/token)" in line and ": fits" in line and "metadata" in line
    lint = sc("lint", "llama-3.1-8b", "-T", "solo", "--offline", "--gpu-memory-utilization", "0.1")
    assert lint.returncode == 1
    assert "DOES NOT FIT" in lint.stdout
    assert "REFUSE weights_over_claim: [spark1] the weights alone are 15.0 GiB on this node, over the claim 12.2 GiB" \
        in lint.stdout
