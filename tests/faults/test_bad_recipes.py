"""Thousands of malformed recipes through sparkconsole.recipes (and, when one is accepted, through plan).

Each document is either accepted, and then plans for every topology it lists or refuses with a one-line UserError,
or refused with one line naming the file, the line, the field and the fix. Never another exception (a traceback),
never a hang (each document well under a second), never half-applied (reading a recipe writes nothing, and the
bundled files stay byte-for-byte what they were). A secret's value written into a recipe is never echoed.
"""

from __future__ import annotations

import copy
import hashlib
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.errors import UserError
from sparkconsole.launch.plan import make_plan
from sparkconsole.recipes import Recipe, bundled_dir, load_recipe, parse_recipe
from sparkconsole.yamlsrc import load_text
from tests.faults.fuzz import fuzz

FILE = "fuzz-recipe.yaml"
BUNDLED = sorted(bundled_dir().glob("*.yaml"))
BASES = [yaml.safe_load(p.read_text()) for p in BUNDLED]
DIGEST = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in BUNDLED}
CLUSTER = ClusterConfig(nodes=(
    NodeConfig(name="spark1", address="192.168.100.10", role="head", container="vllm_a"),
    NodeConfig(name="spark2", address="192.168.100.11", role="worker", container="vllm_b", vllm_port=8001)),
    endpoints=(), source="cluster.yaml")

weird_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=200),
    st.sampled_from(["", " ", "$(reboot)", "a;b", "`id`", "\n", "é" * 80, "{", "}", "{port", "{0}", "{__class__}",
                     "{port.__class__}", "{port!r:>{9999999}}", "{{}}", "0" * 5000, "1e309", "solo", "cluster-tp2",
                     "1.82.7", "ghcr.io/berriai/litellm:v1.82.8", "file:", "file:/etc/shadow", "env", "100g",
                     "-1g", "x" * 300, "\x00", "ＶＬＬＭ", "--help", "../../etc/passwd", "vllm serve {model"]),
)
weird_values = st.recursive(weird_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=10)

PATHS = [
    ("name",), ("container",), ("command",), ("model",), ("recipe_version",), ("defaults",), ("defaults", "port"),
    ("defaults", "tensor_parallel"), ("defaults", "max_model_len"), ("defaults", "served_model_name"), ("env",),
    ("env", "HF_TOKEN"), ("env", "ROUTER_API_KEY"), ("env", "VLLM_X"), ("mods",), ("build_args",), ("cluster_only",),
    ("solo_only",), ("description",), ("sparkconsole",), ("sparkconsole", "topologies"),
    ("sparkconsole", "topology_defaults"), ("sparkconsole", "container"), ("sparkconsole", "container", "memory"),
    ("sparkconsole", "container", "name"), ("sparkconsole", "container", "volumes"),
    ("sparkconsole", "container", "gpus"), ("sparkconsole", "secrets"), ("sparkconsole", "cluster"),
    ("sparkconsole", "cluster", "backend"), ("sparkconsole", "cluster", "master_port"),
    ("sparkconsole", "cluster", "eth_if"), ("sparkconsole", "router"), ("sparkconsole", "router", "default"),
    ("sparkconsole", "router", "port"), ("sparkconsole", "router", "litellm"),
    ("sparkconsole", "router", "litellm", "version"), ("sparkconsole", "router", "litellm", "image"),
    ("sparkconsole", "router", "vllm_router", "command"), ("sparkconsole", "disagg"), ("extra_fork_key",),
]


def mutate(doc, path, value, delete):
    d = copy.deepcopy(doc)
    cur = d
    for key in path[:-1]:
        if not isinstance(cur.get(key), dict):
            cur[key] = {}
        cur = cur[key]
    if delete:
        cur.pop(path[-1], None)
    else:
        cur[path[-1]] = value
    return d


def check_error(err: UserError, file: str = FILE) -> str:
    msg = str(err)
    assert "\n" not in msg and "\r" not in msg, msg
    assert msg.startswith(file), msg
    assert "fix:" in msg, msg
    assert len(msg) < 700, msg
    return msg


def check(text: str, secret: str | None = None) -> Recipe | None:
    # The work this thread did (a bomb costs CPU, not waiting), so other tests on the same cores cannot fail it
    t0 = time.thread_time()
    try:
        recipe = parse_recipe(load_text(text, FILE), "fuzz")
    except UserError as err:
        msg = check_error(err)
        assert secret is None or secret not in msg, msg
        assert time.thread_time() - t0 < 2.0
        return None
    assert isinstance(recipe, Recipe) and recipe.name and recipe.container and recipe.command
    for topology in recipe.topologies:
        try:
            plan = make_plan(recipe, topology, CLUSTER, {})
        except UserError as err:
            msg = str(err)
            assert "\n" not in msg and "fix:" in msg, msg
            continue
        rendered = plan.render()
        assert secret is None or secret not in rendered
        for step in plan.steps:
            assert all(isinstance(a, str) for a in step.argv)
    assert time.thread_time() - t0 < 5.0
    return recipe


@fuzz(2500)
@given(st.sampled_from(range(len(BASES))), st.sampled_from(PATHS), weird_values, st.booleans())
def test_mutated_bundled_recipes(base, path, value, delete):
    doc = mutate(BASES[base], path, value, delete)
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return
    check(text)


@fuzz(300)
@given(st.sampled_from(range(len(BASES))), st.sampled_from(["HF_TOKEN", "ROUTER_API_KEY", "MY_SECRET", "PASSWORD"]),
       st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-", min_size=12, max_size=40))
def test_secret_values_in_recipes_are_refused_without_echo(base, name, value):
    secret = "hf_" + value
    doc = copy.deepcopy(BASES[base])
    doc.setdefault("env", {})[name] = secret
    assert check(yaml.safe_dump(doc), secret=secret) is None


@fuzz(1000)
@given(st.text(max_size=400))
def test_arbitrary_text(text):
    check(text)


@fuzz(200)
@given(st.integers(min_value=1, max_value=12), st.integers(min_value=2, max_value=12))
def test_anchor_bombs_refused_quickly(depth, width):
    lines = ['recipe_version: "1"', "name: bomb", "container: vllm-node", "command: vllm serve x", "b0: &b0 [x]"]
    for i in range(1, depth + 1):
        lines.append(f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * width) + "]")
    lines.append(f"defaults: {{port: 8000}}\nmods: *b{depth}")
    check("\n".join(lines) + "\n")


def test_format_specs_that_cannot_be_filled_are_one_line_errors(ledger):
    """Found by the fuzz above: `{port:{}}` in a router command raised IndexError (a traceback) at plan time."""
    for spec in ("{port:{}}", "{port:{x}}", "{port!r:>{9999999}}", "{port:>999999999}", "{port!z}", "{port:d}x",
                 "{served_model_name:d}"):
        ledger.bad_inputs()
        doc = copy.deepcopy(BASES[0])
        doc.setdefault("sparkconsole", {}).setdefault("router", {}).setdefault("vllm_router", {})["command"] = [spec]
        doc["command"] = "vllm serve x --port {port} " + spec
        check(yaml.safe_dump(doc))


def test_mod_references_no_file_system_takes_are_one_line_errors(ledger):
    """Found by the fuzz above (a CI-like run): a mod `\\x00` raised ValueError from pathlib, a 300-character name
    OSError (ENAMETOOLONG), both as tracebacks at plan time. Each is refused in one line naming mods[0]."""
    for ref, said in (("\x00", "NUL byte"), ("x" * 300, "longer than a path can be"),
                      ("a/" + "b" * 256, "longer than a path can be"), ("/" + "c/" * 2100, "longer than a path can be")):
        ledger.bad_inputs()
        doc = copy.deepcopy(BASES[0])
        doc["mods"] = [ref]
        recipe = check(yaml.safe_dump(doc, allow_unicode=True))
        assert recipe is not None
        with pytest.raises(UserError) as err:
            make_plan(recipe, recipe.topologies[0], CLUSTER, {})
        msg = check_error(err.value)
        assert "mods[0]" in msg and said in msg, msg


def test_files_on_disk_one_line_each_and_nothing_written(tmp_path, ledger):
    cases = {
        "empty.yaml": b"",
        "binary.yaml": bytes(range(256)),
        "bom.yaml": b"\xef\xbb\xbfname: x\n",
        "latin1.yaml": "name: caf\xe9\n".encode("latin-1"),
        "huge.yaml": b"name: x\nmods:\n" + b"  - m\n" * 300000,
        "tabs.yaml": b"name:\n\t- x\n",
        "deep.yaml": b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n",
        "list.yaml": b"- a\n- b\n",
    }
    (tmp_path / "dir.yaml").mkdir()
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    before = sorted(p.name for p in tmp_path.iterdir())
    for name in [*cases, "dir.yaml", "absent.yaml"]:
        ledger.bad_inputs()
        path = tmp_path / name
        try:
            load_recipe(path)
        except UserError as err:
            check_error(err, str(path))
        else:
            raise AssertionError(f"{name} was accepted")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in BUNDLED} == DIGEST


# --- recipe_version "2" and registries (issue 36 item 7): one line naming file, field and fix; nothing half-made ----

V2_BASE = {"recipe_version": "2", "model": "org/m", "runtime": "vllm", "container": "vllm/vllm-openai:v0.12.0",
           "defaults": {"port": 8000, "tensor_parallel": 2, "max_model_len": 4096},
           "env": {"A": "{config.max_model_len}", "B": "{launch.node_rank}"},
           "command": "vllm serve {model} --port {port} -tp {tensor_parallel} --limit-mm-per-prompt '{\"image\":2}'",
           "overrides": [{"when": {"nodes": 1}, "defaults": {"max_model_len": 1024}}],
           "readiness": {"inference_timeout_s": 60}, "pre_exec": ["echo hi"],
           "executor_config": {"shm_size": "64gb", "cap_add": ["IPC_LOCK"], "ulimit": ["memlock=-1"]},
           "metadata": {"model_params": "8B"}, "min_nodes": 1}
V2_PATHS = [("recipe_version",), ("model",), ("runtime",), ("container",), ("command",), ("defaults",),
            ("defaults", "port"), ("defaults", "tensor_parallel"), ("env",), ("env", "A"), ("env", "B"),
            ("overrides",), ("overrides", "x"), ("readiness",), ("readiness", "inference_timeout_s"),
            ("readiness", "inference"), ("pre_exec",), ("executor_config",), ("executor_config", "shm_size"),
            ("executor_config", "ulimit"), ("executor_config", "user"), ("executor_config", "volumes"),
            ("executor_config", "network"), ("metadata",), ("min_nodes",), ("max_nodes",), ("mode",), ("mods",),
            ("include",), ("model_revision",), ("solo_only",), ("cluster_only",)]


@fuzz(1000)
@given(st.sampled_from(V2_PATHS), weird_values, st.booleans())
def test_mutated_v2_recipes(path, value, delete):
    doc = mutate(V2_BASE, path, value, delete)
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return
    t0 = time.thread_time()
    try:
        recipe = parse_recipe(load_text(text, FILE), "fuzz")
    except UserError as err:
        check_error(err)
        return
    for topology in recipe.topologies:
        try:
            make_plan(recipe, topology, CLUSTER, {"eth_if": "enp1s0f0np0"})
        except UserError as err:
            msg = str(err)
            assert "\n" not in msg and "fix:" in msg, msg
    assert time.thread_time() - t0 < 5.0


def _v2(tmp_path, name, text):
    p = tmp_path / f"{name}.yaml"
    p.write_text('recipe_version: "2"\n' + text)
    return p


def test_bad_v2_inputs_are_one_line_each(tmp_path, ledger):
    big = tmp_path / "big.yaml"
    big.write_bytes(b'recipe_version: "2"\nmodel: m\ncontainer: c\ncommand: vllm serve m\n# '
                    + b"x" * (5 * 1024 * 1024 + 10) + b"\n")
    cases = [
        (_v2(tmp_path, "cycle-a", "include: cycle-b\n"), "include", "include cycle"),
        (_v2(tmp_path, "over", "model: m\ncontainer: c\ncommand: vllm serve m\n"
                               "overrides: [{when: {gpu_count: 2}, defaults: {max_model_len: 1}}]\n"),
         "overrides[0].when.gpu_count", "unknown selector"),
        (big, None, "larger than"),
    ]
    _v2(tmp_path, "cycle-b", "include: cycle-a\n")
    for i in range(10):
        _v2(tmp_path, f"deep{i}", f"include: deep{i + 1}\n")
    _v2(tmp_path, "deep10", "model: m\ncontainer: c\ncommand: vllm serve m\n")
    cases.append((tmp_path / "deep0.yaml", "include", "deeper than 8"))
    for path, field, words in cases:
        ledger.bad_inputs()
        try:
            load_recipe(path)
        except UserError as err:
            msg = check_error(err, str(path))
            assert words in msg and (field is None or f": {field}:" in msg), msg
        else:
            raise AssertionError(f"{path.name} was accepted")
    # SGLang plans with its own multi-node flags, never vLLM's rendezvous ones; a runtime it does not run is refused
    sglang = load_recipe(_v2(tmp_path, "sg", "model: m\nruntime: sglang\ncontainer: c\n"
                                             "command: python3 -m sglang.launch_server --model-path m\n"))
    lines = " ".join(step.shell() for step in make_plan(sglang, "cluster-tp2", CLUSTER, {"eth_if": "eth0"}).steps)
    assert "--dist-init-addr" in lines and "--headless" not in lines, lines
    ledger.bad_inputs()
    trt = load_recipe(_v2(tmp_path, "trt", "model: m\nruntime: trtllm\ncontainer: c\ncommand: trtllm-serve m\n"))
    try:
        make_plan(trt, "solo", CLUSTER)
    except UserError as err:
        msg = check_error(err, str(tmp_path / "trt.yaml"))
        assert ": runtime: runtime 'trtllm' is not one sparkconsole runs" in msg, msg
    else:
        raise AssertionError("a trtllm recipe planned")


def test_bad_registries_are_one_line_and_leave_nothing_behind(tmp_path, monkeypatch, ledger):
    from sparkconsole.recipes.registry import Registries
    from tests.helpers import git_repo

    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))

    def repo(name, files):
        return git_repo(tmp_path / name, files)

    bad_manifest = repo("badman", {".sparkrun/registry.yaml": "registries:\n  - name: x\n    recipes: ../../etc\n",
                                   "recipes/a.yaml": "model: m\n"})
    not_list = repo("notlist", {".sparkrun/registry.yaml": "registries: yes\n"})
    cases = [
        ("http://github.com/x/y.git", "URL", "scheme 'http://' is not allowed"),
        ("ext::sh -c touch% /tmp/pwned", "URL", "is not allowed"),
        ("--upload-pack=touch /tmp/pwned", "URL", "is not allowed"),
        (f"file://{tmp_path}/absent-repo", "URL", "git could not clone"),
        (f"file://{bad_manifest}", "registries[0].recipes", "leaves the repository"),
        (f"file://{not_list}", "registries", "declares no sections"),
    ]
    for url, field, words in cases:
        ledger.bad_inputs()
        regs = Registries.load()
        try:
            regs.add(url, name="r")
        except UserError as err:
            msg = str(err)
            assert "\n" not in msg and "fix:" in msg and f"{field}:" in msg and words in msg, msg
        else:
            raise AssertionError(f"{url} was added")
        clones = tmp_path / "state" / "registries" / "clones"
        assert not clones.exists() or list(clones.iterdir()) == [], list(clones.iterdir())   # nothing half-cloned
        assert [e.name for e in Registries.load().entries] == ["official", "community", "eugr"]
    assert not Path("/tmp/pwned").exists()
