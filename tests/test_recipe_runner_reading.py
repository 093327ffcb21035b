"""Recipes read as spark-vllm-docker's runner reads them (issue 18, items 1 and 2).

The runner fills the command template, writes it into a bash script and runs it; its YAML loader is
PyYAML's safe_load. The oracle here is a real bash running the filled template with `vllm` defined as a
function that prints its argv: the plan must hand vLLM exactly those arguments.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.errors import UserError
from sparkconsole.launch.argv import command_argv
from sparkconsole.launch.plan import make_plan
from sparkconsole.recipes import load_recipe, parse_recipe
from sparkconsole.recipes.bashread import bash_command_lines
from sparkconsole.yamlsrc import load_file, load_text

FIX = Path(__file__).parent / "fixtures" / "recipes"
NODE = NodeConfig(name="spark1", address="192.168.100.10", role="head", container="vllm_a", vllm_port=8000)
CLUSTER = ClusterConfig(nodes=(NODE,), endpoints=(), source="cluster.yaml")


def bash_argv(template: str, params: dict, solo: bool = True) -> list[list[str]]:
    """What each `vllm` call receives when bash runs the template filled as the runner fills it (str.format,
    then in solo mode `--distributed-executor-backend X` removed)."""
    text = template.format(**params)
    if solo:
        text = re.sub(r"--distributed-executor-backend\s+\S+", "", text)
    shim = f'vllm() {{ {sys.executable} -c "import json,sys; print(json.dumps(sys.argv[1:]))" "$@"; }}\n'
    out = subprocess.run(["bash", "-c", shim + text], capture_output=True, text=True, timeout=30)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[")]


def ours(recipe, params, **kw) -> list[str]:
    argv, shell = command_argv(recipe, params, **kw)
    assert not shell
    return argv


def test_commented_flag_after_the_last_continued_line_is_dropped_as_bash_drops_it():
    r = load_recipe(FIX / "commented-flag-tail.yaml")
    params = r.params(overrides={"tensor_parallel": 1})
    argv = ours(r, params)
    assert not any("#" in a for a in argv) and "flashinfer" not in argv and "--enable-expert-parallel" not in argv
    assert [argv[1:]] == bash_argv(r.command, params)
    assert r.warnings == ()                       # nothing left over: comments only
    # and through the whole plan: the container's command ends where bash ends it
    plan = make_plan(r, "solo", CLUSTER)
    served = next(iter(plan.server_args.values()))
    assert not any(a.startswith("#") for a in served) and "flashinfer" not in served


def test_extra_args_are_not_swallowed_by_a_trailing_comment():
    r = load_recipe(FIX / "commented-flag-tail.yaml")
    argv = ours(r, r.params(), extra_args=["--seed", "42"])
    assert argv[-2:] == ["--seed", "42"]


def test_hash_inside_a_word_or_quotes_is_kept_and_a_trailing_comment_dropped():
    r = load_recipe(FIX / "hash-not-comment.yaml")
    params = r.params()
    argv = ours(r, params)
    assert "model#1" in argv and "string # not a comment" in argv and '{"note": "a # b"}' in argv
    assert "trailing" not in " ".join(argv)
    assert [argv[1:]] == bash_argv(r.command, params)


def test_a_comment_that_swallows_the_continuation_ends_the_command_with_a_warning():
    r = load_recipe(FIX / "commented-flag-middle.yaml")
    params = r.params()
    # bash runs `vllm serve … --port 8000`, then `--max-model-len 8192` as a command of its own
    assert bash_argv(r.command, params) == [["serve", "example-org/example-model", "--port", "8000"]]
    argv, shell = command_argv(r, params)
    assert shell and argv[:2] == ["bash", "-c"]
    script = argv[2]
    assert "kv-cache-dtype" not in script and script.splitlines()[-1].strip() == "--max-model-len 8192"
    [w] = r.warnings
    assert "line 4 of the command" in w and "--max-model-len 8192" in w and str(FIX / "commented-flag-middle.yaml") in w


@pytest.mark.parametrize("text, expected", [
    ("a \\\n  b # c \\\n d\n", [(1, "a   b"), (3, "d")]),
    ("a 'x\n#y' \\\n b\n", [(1, "a 'x\n#y'  b")]),
    ("a \"q \\\n r\" #z\n\n  #only\nb", [(1, 'a "q  r"'), (5, "b")]),
    ("a \\  \n b", [(1, "a  b")]),                 # blanks after the backslash forgiven (said in bashread)
    ("a;#x\nb&&#y", [(1, "a;"), (2, "b&&")]),
])
def test_bash_lines(text, expected):
    assert bash_command_lines(text) == expected


def test_repeated_key_is_read_as_safe_load_reads_it_with_a_warning_naming_both_lines():
    path = FIX / "duplicate-keys.yaml"
    r = load_recipe(path)
    runner = yaml.safe_load(path.read_text())
    assert r.container == runner["container"] == "vllm-node"
    assert dict(r.defaults) == runner["defaults"] == {"port": 8001}
    warns = [w for w in r.warnings if "duplicate key" in w]
    assert len(warns) == 2
    assert f"{path}:9: duplicate key 'container' (first on line 4)" in warns[0]
    assert f"{path}:10: duplicate key 'defaults' (first on line 6)" in warns[1]
    # the line map follows the value that is read: an error in `defaults` names the second mapping
    doc = load_file(path, duplicates="last")
    assert doc.line(("defaults", "port")) == 11 and doc.line(("defaults", "max_model_len")) == 10


def test_repeated_key_stays_an_error_outside_recipes():
    text = "a: 1\nb: 2\na: 3\n"
    with pytest.raises(UserError, match=r"x.yaml:3: duplicate key 'a'"):
        load_text(text, "x.yaml")
    doc = load_text(text, "x.yaml", duplicates="last")
    assert doc.data == yaml.safe_load(text) and len(doc.warnings) == 1


def test_repeated_key_keeps_the_alias_limits():
    text = "a: &x [1]\n" + "".join(f"k{i}: *x\n" for i in range(70)) + "a: 2\n"
    with pytest.raises(UserError, match="aliases"):
        load_text(text, "x.yaml", duplicates="last")


def test_repeated_nested_key_in_a_recipe_is_read_last():
    text = ('recipe_version: "1"\nname: n\ncontainer: c\ncommand: vllm serve m --port {port}\n'
            "defaults:\n  port: 1\n  port: 2\n")
    r = parse_recipe(load_text(text, "r.yaml", duplicates="last"))
    assert r.defaults == {"port": 2} and "r.yaml:7: duplicate key 'port' (first on line 6)" in r.warnings[0]


def test_env_as_an_empty_list_is_no_variables_as_the_runner_reads_it():
    r = load_recipe(FIX / "env-empty-list.yaml")
    assert dict(r.env) == {} and any("env is an empty list" in w for w in r.warnings)
    with pytest.raises(UserError, match="env: expected dict"):
        parse_recipe(load_text('recipe_version: "1"\nname: n\ncontainer: c\ncommand: vllm serve m\nenv: [A]\n',
                               "r.yaml"))
