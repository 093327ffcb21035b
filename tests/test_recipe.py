"""Recipe loading: the spark-vllm-docker format read as it is, sparkconsole's section, one-line errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkconsole.errors import UserError
from sparkconsole.recipes import (
    TOPOLOGIES,
    bundled_dir,
    bundled_recipes,
    find_recipe,
    load_recipe,
    parse_recipe,
    recipe_paths,
)
from sparkconsole.recipes.v1 import COMMUNITY_KEYS
from sparkconsole.yamlsrc import load_text

REPO = Path(__file__).resolve().parents[1]

# A recipe exactly as the community writes them (eugr/spark-vllm-docker recipes/deepseek-v4-flash.yaml, trimmed):
# recipe_version, build_args, {{ }} escapes in JSON arguments, integer env values, a Ray executor flag.
COMMUNITY = """\
# Recipe: DeepSeek-V4-Flash official FP8 on dual DGX Spark
recipe_version: "1"
name: DeepSeek-V4-Flash
description: DeepSeek V4 Flash FP8 on dual DGX Spark TP=2
model: deepseek-ai/DeepSeek-V4-Flash
container: vllm-node-dsv4
cluster_only: true

build_args:
  - --vllm-ref
  - sm120-pr-41834-stable-preview-20260624

mods: []

defaults:
  port: 8000
  host: 0.0.0.0
  tensor_parallel: 2
  gpu_memory_utilization: 0.85
  max_model_len: 200000
  served_model_name: deepseek-v4-flash

env:
  VLLM_ALLOW_LONG_MAX_MODEL_LEN: 1
  NCCL_DEBUG: WARN

command: |
  vllm serve deepseek-ai/DeepSeek-V4-Flash \\
      --served-model-name {served_model_name} \\
      --host {host} \\
      --port {port} \\
      --tensor-parallel-size {tensor_parallel} \\
      --max-model-len {max_model_len} \\
      --gpu-memory-utilization {gpu_memory_utilization} \\
      --distributed-executor-backend ray \\
      --compilation-config '{{"cudagraph_mode":"FULL_AND_PIECEWISE","custom_ops":["all"]}}' \\
      --load-format safetensors
"""


def load(text: str, name: str = "r.yaml"):
    return parse_recipe(load_text(textwrap.dedent(text), name), Path(name).stem)


def one_line(err: UserError) -> str:
    s = str(err)
    assert "\n" not in s
    return s


def test_every_bundled_recipe_loads_with_its_topologies():
    recipes = {r.key: r for r in bundled_recipes()}
    assert {"gpt-oss-120b", "deepseek-v4-flash", "llama-3.1-8b", "tiny-testbed"} <= set(recipes)
    assert recipes["gpt-oss-120b"].topologies == ("solo", "cluster-tp2", "2x-solo")
    assert recipes["deepseek-v4-flash"].topologies == ("cluster-tp2",)
    assert recipes["deepseek-v4-flash"].cluster_only
    assert recipes["llama-3.1-8b"].topologies == ("solo", "2x-solo", "disagg")
    for r in recipes.values():
        assert r.recipe_version == "1" and r.warnings == ()
        assert set(r.topologies) <= set(TOPOLOGIES)
        # every placeholder has a value (a recipe without a port serves on the cluster file's vllm_port)
        r.render_command({"port": 8000} | r.params(r.topologies[0]) | {"node_address": "10.0.0.1"})


def test_published_settings_are_in_the_bundled_recipes():
    gpt = find_recipe("gpt-oss-120b")
    p = gpt.params("solo")
    assert (p["gpu_memory_utilization"], p["max_model_len"], p["max_num_batched_tokens"]) == (0.70, 4096, 32768)
    cmd = gpt.render_command(p)
    assert "--enforce-eager" in cmd and "--kv-cache-dtype fp8" in cmd
    ds = find_recipe("deepseek-v4-flash")
    cmd = ds.render_command(ds.params("cluster-tp2"))
    for flag in ("--gpu-memory-utilization 0.78", "--max-num-seqs 2", "--max-num-batched-tokens 8192",
                 "--enable-expert-parallel", '"num_speculative_tokens":2', '{"cudagraph_mode":"PIECEWISE"}'):
        assert flag in cmd
    assert "custom_ops" not in cmd
    llama = find_recipe("llama-3.1-8b")
    assert llama.params("disagg")["gpu_memory_utilization"] == 0.3
    assert llama.disagg.connector == "NixlConnector"


def test_bundled_files_are_package_data_and_mirrored_in_recipes_dir():
    shipped = sorted(p.name for p in bundled_dir().glob("*.yaml"))
    assert shipped and bundled_dir().parent.name == "recipes"
    mirrored = sorted(p.name for p in (REPO / "recipes").glob("*.yaml"))
    assert mirrored == shipped
    for p in (REPO / "recipes").glob("*.yaml"):
        assert p.resolve() == (bundled_dir() / p.name).resolve()


def test_community_recipe_reads_as_is():
    r = load(COMMUNITY, "deepseek-v4-flash.yaml")
    assert r.name == "DeepSeek-V4-Flash" and r.container == "vllm-node-dsv4" and r.cluster_only
    assert r.build_args == ("--vllm-ref", "sm120-pr-41834-stable-preview-20260624")
    assert r.env == {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "NCCL_DEBUG": "WARN"}
    assert r.topologies == ("cluster-tp2",)               # cluster_only, no sparkconsole section
    cmd = r.render_command(r.params("cluster-tp2", {"port": 9000}))
    assert "--port 9000" in cmd and "--tensor-parallel-size 2" in cmd
    # {{ }} are literal braces, as in run-recipe.py's str.format
    assert '\'{"cudagraph_mode":"FULL_AND_PIECEWISE","custom_ops":["all"]}\'' in cmd


def test_override_order_defaults_then_topology_then_overrides():
    r = load("""
        recipe_version: "1"
        name: x
        container: img
        command: vllm serve m --tp {tensor_parallel} --max-model-len {max_model_len}
        defaults: {tensor_parallel: 1, max_model_len: 4096}
        sparkconsole:
          topology_defaults: {cluster-tp2: {tensor_parallel: 2, max_model_len: 8192}}
    """)
    assert r.params("solo")["tensor_parallel"] == 1
    assert r.params("cluster-tp2")["tensor_parallel"] == 2
    assert r.params("cluster-tp2", {"max_model_len": 1024, "tensor_parallel": None})["max_model_len"] == 1024
    assert r.params("cluster-tp2", {"tensor_parallel": None})["tensor_parallel"] == 2


def test_missing_placeholder_names_it_with_file_and_line():
    r = load("""
        recipe_version: "1"
        name: x
        container: img
        defaults: {port: 8000}
        command: |
          vllm serve m --port {port} --max-model-len {max_model_len}
    """, "p.yaml")
    with pytest.raises(UserError) as ei:
        r.render_command(r.params("solo"))
    msg = one_line(ei.value)
    assert msg.startswith("p.yaml:6: command:") and "{max_model_len}" in msg and "--set max_model_len=" in msg


def test_unknown_top_level_key_is_reported_not_dropped():
    r = load("""
        recipe_version: "1"
        name: x
        container: img
        command: vllm serve m
        flavour: spicy
    """, "u.yaml")
    assert len(r.warnings) == 1 and "u.yaml:6" in r.warnings[0] and "flavour" in r.warnings[0]


@pytest.mark.parametrize("section, line, field", [
    ("sparkconsole:\n  colour: blue\n", 6, "sparkconsole.colour"),
    ("sparkconsole:\n  container: {memroy: 100g}\n", 6, "sparkconsole.container.memroy"),
    ("sparkconsole:\n  router: {litellm: {imag: x}}\n", 6, "sparkconsole.router.litellm.imag"),
])
def test_unknown_key_in_own_section_is_an_error_with_line_and_field(section, line, field):
    text = 'recipe_version: "1"\nname: x\ncontainer: img\ncommand: vllm serve m\n' + section
    with pytest.raises(UserError) as ei:
        parse_recipe(load_text(text, "s.yaml"))
    msg = one_line(ei.value)
    assert msg.startswith(f"s.yaml:{line}: {field}: unknown key") and "fix:" in msg


@pytest.mark.parametrize("text, needle", [
    ('name: x\ncontainer: img\n', "missing required field 'command'"),
    ('recipe_version: "2"\nname: x\ncontainer: img\ncommand: c\n', "missing required field 'model'"),  # v2: sparkrun's
    ('name: x\ncontainer: img\ncommand: c\ndefaults: [1, 2]\n', "expected dict"),
    ('name: x\ncontainer: img\ncommand: c\ndefaults: {port: [1]}\n', "a default must be a single value"),
    ('name: x\ncontainer: img\ncommand: c\ncluster_only: true\nsolo_only: true\n', "both true"),
    ('name: x\ncontainer: img\ncommand: c\nsparkconsole: {topologies: [solo, quad]}\n', "unknown topology 'quad'"),
    ('name: x\ncontainer: img\ncommand: c\nsparkconsole: {container: {memory: lots}}\n', "bad size"),
    ('name: x\ncontainer: img\ncommand: c\nsparkconsole: {cluster: {backend: slurm}}\n', "unknown backend"),
    ('name: x\ncontainer: img\ncommand: c\nsparkconsole: {router: {default: nginx}}\n', "unknown router"),
    ('name: x\ncontainer: "bad image"\ncommand: c\n', "bad image name"),
    ('name: x\ncontainer: img\ncommand: c\nsolo_only: true\nsparkconsole: {topologies: [cluster-tp2]}\n', "solo_only"),
])
def test_bad_recipes_give_one_line_errors(text, needle):
    with pytest.raises(UserError) as ei:
        parse_recipe(load_text(text, "bad.yaml"))
    msg = one_line(ei.value)
    assert msg.startswith("bad.yaml") and needle in msg and "fix:" in msg


def test_secret_value_in_env_is_refused_without_echoing_it():
    token = "hf_" + "Q" * 30
    with pytest.raises(UserError) as ei:
        load(f"""
            recipe_version: "1"
            name: x
            container: img
            command: vllm serve m
            env:
              HF_TOKEN: {token}
        """, "t.yaml")
    msg = one_line(ei.value)
    assert token not in msg and "HF_TOKEN" in msg and "secrets" in msg and msg.startswith("t.yaml:7")


def test_secrets_by_reference():
    r = load("""
        recipe_version: "1"
        name: x
        container: img
        command: vllm serve m
        sparkconsole:
          secrets: {HF_TOKEN: env, OTHER_TOKEN: "file:/etc/tok"}
    """)
    assert [(s.name, s.source) for s in r.secrets] == [("HF_TOKEN", "env"), ("OTHER_TOKEN", "file:/etc/tok")]
    assert [s.name for s in load('name: x\ncontainer: i\ncommand: c\n').secrets] == ["HF_TOKEN"]
    with pytest.raises(UserError, match="'env' or 'file:PATH'"):
        load('name: x\ncontainer: i\ncommand: c\nsparkconsole: {secrets: {HF_TOKEN: vault}}\n')


def test_user_recipes_shadow_bundled_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert recipe_paths()["gpt-oss-120b"].parent == bundled_dir()       # no user recipes: the bundle
    (tmp_path / "xdg" / "sparkconsole" / "recipes").mkdir(parents=True)
    (tmp_path / "xdg" / "sparkconsole" / "recipes" / "gpt-oss-120b.yaml").write_text(
        'recipe_version: "1"\nname: from-config\ncontainer: img\ncommand: vllm serve m\n')
    assert find_recipe("gpt-oss-120b").name == "from-config"
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "gpt-oss-120b.yaml").write_text(
        'recipe_version: "1"\nname: from-cwd\ncontainer: img\ncommand: vllm serve m\n')
    (tmp_path / "recipes" / "mine.yml").write_text('recipe_version: "1"\nname: mine\ncontainer: img\ncommand: c\n')
    assert find_recipe("gpt-oss-120b").name == "from-cwd"
    assert find_recipe("mine").name == "mine"
    assert find_recipe(str(tmp_path / "recipes" / "mine.yml")).key == "mine"
    with pytest.raises(UserError) as ei:
        find_recipe("nonesuch")
    assert "mine" in str(ei.value) and "gpt-oss-120b" in str(ei.value)


def test_bad_yaml_and_unreadable_file_are_one_line_errors(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\ncommand: [unclosed\n")
    with pytest.raises(UserError) as ei:
        load_recipe(p)
    assert one_line(ei.value).startswith(str(p))
    with pytest.raises(UserError, match="file not found"):
        load_recipe(tmp_path / "absent.yaml")


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
values = st.recursive(scalars, lambda ch: st.lists(ch, max_size=3) | st.dictionaries(st.text(max_size=8), ch, max_size=3),
                      max_leaves=8)
KEYS = sorted(COMMUNITY_KEYS | {"sparkconsole"})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=8))
def test_any_document_loads_or_fails_with_one_line(doc):
    import yaml
    text = yaml.safe_dump(doc)
    try:
        r = parse_recipe(load_text(text, "h.yaml"))
    except UserError as err:
        assert "\n" not in str(err) and str(err).startswith("h.yaml")
        return
    assert r.name and r.container and r.command


# --- the `sparkconsole recipe` command --------------------------------------------------------------------------

@pytest.fixture
def cluster_file(tmp_path):
    p = tmp_path / "sparkconsole.yaml"
    p.write_text("nodes:\n  - {name: spark1, address: 192.168.100.10}\n  - {name: spark2, address: 192.168.100.11}\n")
    return str(p)


def cli(*argv):
    from sparkconsole.cli import main
    return main(list(argv))


def test_cli_list_and_plan(cluster_file, capsys):
    assert cli("--cluster", cluster_file, "recipe", "list") == 0
    out = capsys.readouterr().out
    assert "gpt-oss-120b" in out and "solo,cluster-tp2,2x-solo" in out
    assert cli("--cluster", cluster_file, "recipe", "plan", "gpt-oss-120b", "-T", "2x-solo", "--router",
               "simple-shuffle", "--set", "max_model_len=8192", "--", "--seed", "7") == 0
    out = capsys.readouterr().out
    assert "[spark1 192.168.100.10]" in out and "[spark2 192.168.100.11]" in out
    assert "--max-model-len 8192" in out and out.count("--seed 7") == 2 and "routing_strategy: simple-shuffle" in out


def test_cli_lint_exit_status(cluster_file, capsys):
    assert cli("--cluster", cluster_file, "recipe", "lint", "gpt-oss-120b", "-T", "2x-solo", "--offline") == 0
    assert cli("--cluster", cluster_file, "recipe", "lint", "gpt-oss-120b", "-T", "2x-solo", "--offline",
               "--router", "least-busy") == 1
    out = capsys.readouterr().out
    assert "REFUSE least_busy_identical" in out and "1 refusing" in out


def test_cli_errors_are_one_line(cluster_file, capsys):
    assert cli("--cluster", cluster_file, "recipe", "plan", "deepseek-v4-flash", "-T", "solo") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cluster: {cluster_file}\n")          # where the cluster came from, then the error
    err = err.split("\n", 1)[1]
    assert "\n" not in err and "requires cluster mode" in err
    assert cli("--cluster", cluster_file, "recipe", "plan", "gpt-oss-120b", "--set", "oops") == 2
    assert "bad --set" in capsys.readouterr().err


def test_cli_launch_headless_needs_yes_and_respects_preflight(cluster_file, capsys, monkeypatch):
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    # preflight refuses before anything is asked or run (0.95 × a GB10's 121.7 GiB: over the node's budget)
    assert cli("--cluster", cluster_file, "recipe", "launch", "gpt-oss-120b", "-T", "solo", "--offline",
               "--gpu-mem", "0.95") == 2
    err = capsys.readouterr().err
    assert "preflight refuses the launch: gpu_memory_utilization" in err and "--force" in err
    # preflight clean, but no terminal to confirm on and no --yes
    assert cli("--cluster", cluster_file, "recipe", "launch", "gpt-oss-120b", "-T", "solo", "--offline") == 2
    assert "add --yes" in capsys.readouterr().err
