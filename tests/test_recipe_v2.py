"""recipe_version "2", read as sparkrun reads it (issue 36 item 1), and planned: name from the stem, any version but
"1", injected placeholders, literal JSON, runtime and node range, include and overrides, env templates, pre_exec,
executor_config into the container, readiness, metadata, a command generated from defaults."""

from __future__ import annotations

import json
import math
import shlex
import textwrap
from pathlib import Path

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.errors import UserError
from sparkconsole.launch import lint
from sparkconsole.launch.plan import make_plan
from sparkconsole.recipes import load_recipe
from sparkconsole.recipes.sources import version_of

CLUSTER = ClusterConfig(nodes=(NodeConfig(name="spark1", address="192.168.100.10", role="head", container="vllm_a"),
                               NodeConfig(name="spark2", address="192.168.100.11", container="vllm_b")),
                        endpoints=(), source="<test>")
ETH = {"eth_if": "enp1s0f0np0"}


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def server_argv(plan, key=None):
    return list(plan.server_args[key or next(iter(plan.server_args))])


def run_step(plan, node="spark1"):
    return next(s for s in plan.steps if s.node == node and s.argv[:2] == ("docker", "run"))


def test_name_from_stem_any_version_and_injected_placeholders(tmp_path):
    p = write(tmp_path, "qwen-mini", """\
        recipe_version: "4"
        model: Qwen/Qwen3-0.6B
        model_revision: abc123
        container: vllm/vllm-openai:v0.12.0
        defaults: {port: 8001}
        command: vllm serve {model} --revision {model_revision} --chat-template {resolved_model_path}/t.jinja --port {port}
        """)
    r = load_recipe(p)
    assert (r.key, r.name, r.recipe_version, r.v2, r.runtime) == ("qwen-mini", "qwen-mini", "4", True, "vllm")
    argv = server_argv(make_plan(r, "solo", CLUSTER))
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-0.6B"]
    assert argv[argv.index("--revision") + 1] == "abc123"
    assert argv[argv.index("--chat-template") + 1] == "Qwen/Qwen3-0.6B/t.jinja"


def test_the_version_decides_the_reader():
    assert version_of({"recipe_version": "1", "name": "x"}) == "1"
    assert version_of({"recipe_version": 3}) == "2"
    assert version_of({"name": "x", "container": "c", "command": "c"}) == "1"        # a v1 file without a version
    assert version_of({"model": "m", "container": "c"}) == "2"                       # no name: sparkrun's
    assert version_of({"name": "x", "runtime": "vllm", "model": "m"}) == "2"         # a v2-only key


def test_literal_json_braces_are_kept_and_the_shells_variables_too(tmp_path):
    p = write(tmp_path, "mm", """\
        recipe_version: "2"
        model: org/vl
        container: img
        defaults: {port: 8000}
        command: |
          vllm serve {model} --port {port} --limit-mm-per-prompt '{"image":2}' \\
            --compilation-config '{"cudagraph_mode":"PIECEWISE","pass_config":{"fuse":true}}' \\
            --cuda-home ${CUDA_HOME}
        """)
    argv = server_argv(make_plan(load_recipe(p), "solo", CLUSTER))
    assert argv[argv.index("--limit-mm-per-prompt") + 1] == '{"image":2}'
    assert json.loads(argv[argv.index("--compilation-config") + 1])["pass_config"] == {"fuse": True}
    assert argv[argv.index("--cuda-home") + 1] == "${CUDA_HOME}"


def test_a_placeholder_without_value_is_refused_naming_it(tmp_path):
    p = write(tmp_path, "hole", 'recipe_version: "2"\nmodel: m\ncontainer: img\ncommand: vllm serve {model} --x {nothing}\n')
    with pytest.raises(UserError) as ei:
        make_plan(load_recipe(p), "solo", CLUSTER)
    assert "{nothing} has no value" in str(ei.value) and "hole.yaml:4" in str(ei.value)


@pytest.mark.parametrize("body, topologies, lo, hi", [
    ("min_nodes: 2", ("cluster-tp2",), 2, None),
    ("max_nodes: 1", ("solo", "2x-solo"), 1, 1),
    ("mode: solo", ("solo", "2x-solo"), 1, 1),
    ("mode: cluster", ("cluster-tp2",), 2, None),
    ("cluster_only: true", ("cluster-tp2",), 2, None),
    ("solo_only: true", ("solo", "2x-solo"), 1, 1),
    ("min_nodes: 1", ("solo", "cluster-tp2", "2x-solo"), 1, None),
])
def test_node_range_decides_the_topologies(tmp_path, body, topologies, lo, hi):
    r = load_recipe(write(tmp_path, "n", f'recipe_version: "2"\nmodel: m\ncontainer: img\ncommand: vllm serve m\n{body}\n'))
    assert (r.topologies, r.min_nodes, r.max_nodes) == (topologies, lo, hi)


def test_a_cluster_launch_outside_the_node_range_is_refused(tmp_path):
    p = write(tmp_path, "three", 'recipe_version: "2"\nmodel: m\ncontainer: img\nmin_nodes: 3\nmax_nodes: 3\n'
                                 'defaults: {tensor_parallel: 2}\ncommand: vllm serve m\n')
    with pytest.raises(UserError, match=r"runs on 3 nodes; this launch would use 2"):
        make_plan(load_recipe(p), "cluster-tp2", CLUSTER, ETH)


@pytest.mark.parametrize("runtime, command, backend", [
    ("vllm-ray", "vllm serve m", "ray"), ("vllm-distributed", "vllm serve m", "mp"), (None, "vllm serve m", "mp"),
    (None, "vllm serve m --distributed-executor-backend ray", "ray"),
])
def test_vllm_runtimes_and_their_backend(tmp_path, runtime, command, backend):
    head = f"runtime: {runtime}\n" if runtime else ""
    r = load_recipe(write(tmp_path, "v", f'recipe_version: "2"\nmodel: m\ncontainer: img\n{head}command: {command}\n'))
    assert r.runtime == "vllm" and r.cluster.backend == backend
    plan = make_plan(r, "cluster-tp2", CLUSTER, ETH)
    assert plan.backend == backend


@pytest.mark.parametrize("runtime, command", [("ds4-cuda", None), ("trtllm", "trtllm-serve m")])
def test_a_runtime_we_do_not_run_is_read_and_refused_by_the_plan_naming_it(tmp_path, runtime, command):
    text = 'recipe_version: "2"\nmodel: m\ncontainer: img\n' + (f"runtime: {runtime}\n" if runtime else "") \
        + (f"command: {command}\n" if command else "")
    r = load_recipe(write(tmp_path, "other", text))
    assert r.runtime != "vllm"
    with pytest.raises(UserError) as ei:
        make_plan(r, "solo", CLUSTER)
    msg = str(ei.value)
    assert f"runtime {r.runtime!r} is not one sparkconsole runs" in msg and "fix:" in msg and "\n" not in msg


@pytest.mark.parametrize("runtime, command, planned", [
    ("sglang", "python3 -m sglang.launch_server --model-path m --host 0.0.0.0", "sglang"),
    (None, "python3 -m sglang.launch_server --model-path m --host 0.0.0.0", "sglang"),
    (None, "llama-server -m m --host 0.0.0.0", "llama-cpp")])
def test_sglang_and_llamacpp_recipes_are_read_and_planned_as_their_runtime(tmp_path, runtime, command, planned):
    """The runtime read from `runtime:` or from what the command starts, planned in its own words
    (tests/test_runtimes.py has the rest)."""
    text = 'recipe_version: "2"\nmodel: m\ncontainer: img\n' + (f"runtime: {runtime}\n" if runtime else "") \
        + f"command: {command}\n"
    r = load_recipe(write(tmp_path, "other", text))
    assert r.runtime == planned and make_plan(r, "solo", CLUSTER).runtime == planned


def test_no_command_is_built_from_defaults_for_vllm(tmp_path):
    r = load_recipe(write(tmp_path, "gen", """\
        recipe_version: "2"
        model: Qwen/Qwen3-8B
        container: img
        defaults:
          port: 8123
          tensor_parallel: 1
          max_model_len: 8192
          enable_prefix_caching: false
          trust_remote_code: true
          speculative_config: {method: mtp, num_speculative_tokens: 2}
          python_home: /usr
        """))
    assert r.command_generated and any("python_home" in w for w in r.warnings)
    argv = server_argv(make_plan(r, "solo", CLUSTER))
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--max-model-len") + 1] == "8192"
    assert "--no-enable-prefix-caching" in argv and "--trust-remote-code" in argv
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 2}
    assert "--python-home" not in argv and "/usr" not in argv


def test_include_merges_a_base_beside_it_and_refuses_cycles_and_depth(tmp_path):
    write(tmp_path, "base", """\
        recipe_version: "2"
        model: org/base
        container: img:1
        metadata: {model_params: 8B}
        defaults: {port: 8000, max_model_len: 4096, speculative_config: {method: a, n: 1}}
        env: {A: "1", B: "2"}
        command: vllm serve {model} --port {port} --max-model-len {max_model_len}
        overrides: [{when: {nodes: 1}, defaults: {max_model_len: 1024}}]
        """)
    r = load_recipe(write(tmp_path, "child", """\
        recipe_version: "2"
        include: base
        defaults: {max_model_len: 8192, speculative_config: {method: b}}
        env: {B: null, C: "3"}
        overrides: [{when: {nodes: 2}, defaults: {max_model_len: 2048}}]
        """))
    assert r.model == "org/base" and r.container == "img:1" and r.metadata == {"model_params": "8B"}
    assert r.defaults == {"port": 8000, "max_model_len": 8192, "speculative_config": {"method": "b"}}
    assert r.env == {"A": "1", "C": "3"} and len(r.overrides) == 2 and r.include_chain[-1].endswith("base.yaml")
    other = load_recipe(write(tmp_path, "other-model", 'recipe_version: "2"\ninclude: base\nmodel: org/other\n'))
    assert other.metadata == {}                        # the base's metadata describes the base's model
    write(tmp_path, "a", 'recipe_version: "2"\ninclude: b\n')
    write(tmp_path, "b", 'recipe_version: "2"\ninclude: a\n')
    with pytest.raises(UserError) as ei:
        load_recipe(tmp_path / "a.yaml")
    assert "include cycle" in str(ei.value) and "a.yaml:2: include:" in str(ei.value)
    for i in range(10):
        write(tmp_path, f"d{i}", f'recipe_version: "2"\ninclude: d{i + 1}\n')
    write(tmp_path, "d10", 'recipe_version: "2"\nmodel: m\ncontainer: c\ncommand: vllm serve m\n')
    with pytest.raises(UserError, match="deeper than 8"):
        load_recipe(tmp_path / "d0.yaml")
    for i in range(2, 10):
        (tmp_path / f"d{i}.yaml").unlink()
    write(tmp_path, "d2", 'recipe_version: "2"\nmodel: m\ncontainer: c\ncommand: vllm serve m\n')
    assert load_recipe(tmp_path / "d0.yaml").model == "m"
    with pytest.raises(UserError, match="names a path"):
        load_recipe(write(tmp_path, "walk", 'recipe_version: "2"\ninclude: ../etc/x\n'))


def test_overrides_apply_per_launch_and_say_so(tmp_path):
    r = load_recipe(write(tmp_path, "ov", """\
        recipe_version: "2"
        model: m
        container: img
        defaults: {port: 8000, max_model_len: 4096, max_num_seqs: 8}
        command: vllm serve {model} --port {port} --max-model-len {max_model_len} --max-num-seqs {max_num_seqs}
        overrides:
          - when: {nodes: 1}
            defaults: {max_model_len: 1024}
          - when: {tp: {gte: 2}, runtime: vllm}
            defaults: {max_num_seqs: 32}
            env: {NCCL_DEBUG: INFO}
          - when: {memory_gb: {gte: 100}, arch: sm_121, config: {max_model_len: 4096}}
            defaults: {max_num_seqs: 64}
          - when: {nodes: [3, 4]}
            container: other-image
        """))
    solo = make_plan(r, "solo", CLUSTER)
    argv = server_argv(solo)
    assert argv[argv.index("--max-model-len") + 1] == "1024" and argv[argv.index("--max-num-seqs") + 1] == "64"
    assert any("overrides[0]: applied" in n for n in solo.notes) and any("overrides[3]: skipped" in n for n in solo.notes)
    cluster = make_plan(r, "cluster-tp2", CLUSTER, ETH)
    argv = server_argv(cluster)
    assert argv[argv.index("--max-model-len") + 1] == "4096" and argv[argv.index("--max-num-seqs") + 1] == "64"
    assert "NCCL_DEBUG=INFO" in run_step(cluster).argv and cluster.image == "img"


@pytest.mark.parametrize("when, words", [
    ("{gpu: 1}", "overrides[0].when.gpu: unknown selector 'gpu'"),
    ("{tp: {about: 2}}", "overrides[0].when.tp.about: unknown operator 'about'"),
    ("{runtime: {gt: vllm}}", "needs a numeric selector"),
])
def test_an_override_the_reader_cannot_evaluate_is_refused_in_one_line(tmp_path, when, words):
    p = write(tmp_path, "bad", f'recipe_version: "2"\nmodel: m\ncontainer: c\ncommand: vllm serve m\n'
                               f'overrides: [{{when: {when}, defaults: {{max_model_len: 1}}}}]\n')
    with pytest.raises(UserError) as ei:
        load_recipe(p)
    assert words in str(ei.value) and str(ei.value).startswith(str(p)) and "fix:" in str(ei.value)


def test_env_templates_fill_per_node_and_nothing_else_expands(tmp_path, monkeypatch):
    monkeypatch.setenv("SECRET_ON_THIS_MACHINE", "leaked")
    r = load_recipe(write(tmp_path, "env", """\
        recipe_version: "2"
        model: m
        container: img
        defaults: {max_model_len: 4096}
        env:
          LEN: "{config.max_model_len}"
          RANK: "rank-{launch.node_rank}-of-{launch.num_nodes}"
          HOSTVAR: "$SECRET_ON_THIS_MACHINE"
          LITERAL: "{{config.max_model_len}}"
          JSON: '{"a": 1}'
        command: vllm serve m
        """))
    plan = make_plan(r, "cluster-tp2", CLUSTER, ETH)
    for node, rank in (("spark1", 0), ("spark2", 1)):
        argv = run_step(plan, node).argv
        assert "LEN=4096" in argv and f"RANK=rank-{rank}-of-2" in argv and '{"a": 1}' in "".join(argv)
        assert "HOSTVAR=$SECRET_ON_THIS_MACHINE" in argv and "LITERAL={config.max_model_len}" in argv
        assert "leaked" not in run_step(plan, node).shell()
    with pytest.raises(UserError, match=r"env.X.*launch.model_path"):
        load_recipe(write(tmp_path, "mp", 'recipe_version: "2"\nmodel: m\ncontainer: c\ncommand: vllm serve m\n'
                                          'env: {X: "{launch.model_path}"}\n'))


def test_executor_config_reaches_docker_run_and_preflight(tmp_path):
    r = load_recipe(write(tmp_path, "ex", """\
        recipe_version: "2"
        model: m
        container: img
        command: vllm serve m
        executor_config:
          shm_size: 200gb
          privileged: false
          cap_add: [IPC_LOCK, SYS_ADMIN]
          devices: [/dev/infiniband]
          volumes: ["/var/run/docker.sock:/var/run/docker.sock"]
          ulimit: ["memlock=-1:-1", "nofile=65535:65535"]
          security_opt: [seccomp=unconfined]
          user: root
          entrypoint: ""
          auto_remove: true
        """))
    assert any("auto_remove not used" in w for w in r.warnings)
    plan = make_plan(r, "solo", CLUSTER)
    words = shlex.join(run_step(plan).argv)
    for want in ("--cap-add SYS_ADMIN", "--device /dev/infiniband", "--security-opt seccomp=unconfined",
                 "--ulimit memlock=-1:-1", "--ulimit nofile=65535:65535", "--user root", "--shm-size 200gb",
                 "-v /var/run/docker.sock:/var/run/docker.sock", "--entrypoint= img"):
        assert want in words, want
    assert "--privileged" not in words and "nofile=1048576" not in words
    findings = {(f.rule, f.severity, f.message.split(":")[0]) for f in lint.preflight(r, "solo", CLUSTER.nodes, None, plan=plan)}
    assert ("container_options", "refuse", "volume /var/run/docker.sock") in findings
    assert any(f[0] == "container_options" and "cap_add SYS_ADMIN" in f[2] for f in findings)
    assert any(f[0] == "container_options" and "shm_size 200gb is above" in f[2] for f in findings)


def test_hf_cache_where_sparkrun_mounts_it(tmp_path):
    r = load_recipe(write(tmp_path, "hf", 'recipe_version: "2"\nmodel: m\ncontainer: img\ncommand: vllm serve m\n'))
    argv = run_step(make_plan(r, "solo", CLUSTER)).argv
    assert '"${HF_HOME:-$HOME/.cache/huggingface}":/cache/huggingface' in argv and "HF_HOME=/cache/huggingface" in argv


def test_readiness_is_read_and_reaches_the_plan(tmp_path):
    r = load_recipe(write(tmp_path, "rd", """\
        recipe_version: "2"
        model: m
        container: img
        command: vllm serve m
        readiness: {port_timeout_s: 0, health_timeout_s: 60, inference_timeout_s: 90, inference_prompt: "Say ok"}
        """))
    assert r.readiness is not None and math.isinf(r.readiness.port_timeout_s)
    assert (r.readiness.health_timeout_s, r.readiness.inference_timeout_s, r.readiness.inference) == (60, 90, True)
    assert make_plan(r, "solo", CLUSTER).readiness == r.readiness
    plain = load_recipe(write(tmp_path, "rd2", 'recipe_version: "2"\nmodel: m\ncontainer: img\ncommand: vllm serve m\n'))
    assert plain.readiness is None and make_plan(plain, "solo", CLUSTER).readiness.inference  # sparkrun's default
    for bad, words in (("{inference_timeout_s: 0}", "bad timeout"), ("{colour: red}", "unknown key 'colour'"),
                       ("{inference_style: anthropic-messages-stream-v1}", "not one sparkconsole probes")):
        with pytest.raises(UserError, match=words):
            load_recipe(write(tmp_path, "rd3", f'recipe_version: "2"\nmodel: m\ncontainer: c\ncommand: c\nreadiness: {bad}\n'))


def test_pre_exec_runs_after_the_mods_before_the_server_and_metadata_is_kept(tmp_path):
    (tmp_path / "patch.txt").write_text("x")
    r = load_recipe(write(tmp_path, "pe", """\
        recipe_version: "2"
        model: m
        container: img
        command: vllm serve m
        metadata: {model_params: 27B, model_dtype: fp8, num_layers: 64}
        pre_exec:
          - pip install foo
          - {copy: patch.txt, dest: /workspace/patches}
        """))
    assert r.metadata["num_layers"] == 64 and len(r.pre_exec) == 2
    plan = make_plan(r, "solo", CLUSTER)
    whats = [s.what for s in plan.steps]
    i_pre = whats.index("pre_exec[0]: run in vllm_a")
    assert whats.index("pre_exec[1]: copy " + str(tmp_path / "patch.txt") + " to /workspace/patches") > i_pre
    assert whats[-1].startswith("start vLLM in vllm_a") and plan.pre_exec == 2 and not plan.restartable_in_place
    assert "sparkconsole-mods-gate" in run_step(plan).argv          # the server waits for them
    assert plan.untrusted == ()                                      # a local file is the operator's own


def test_unknown_keys_warn_and_sparkruns_unused_keys_say_why(tmp_path):
    r = load_recipe(write(tmp_path, "w", 'recipe_version: "2"\nmodel: m\ncontainer: c\ncommand: vllm serve m\n'
                                         'post_commands: [echo hi]\nmy_fork_key: 1\n'))
    assert any("post_commands not used" in w for w in r.warnings)
    assert any("unknown key 'my_fork_key'" in w for w in r.warnings)
