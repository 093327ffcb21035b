"""A command template whose file ends in a backslash with no newline after it (issue 23 item 5).

The oracle is a real bash reading the filled template as a script file (the runner writes one and runs it):
bash drops a backslash that ends the script, so vLLM gets the flags before it and nothing more.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.launch.argv import command_argv
from sparkconsole.recipes import load_recipe
from sparkconsole.recipes.bashread import bash_command_lines

FIX = Path(__file__).parent / "fixtures" / "recipes"


def bash_script_argv(script: str, tmp_path: Path) -> list[list[str]]:
    """Each `vllm` call's argv when bash runs `script` as a file, its bytes exactly as given."""
    shim = f'vllm() {{ {sys.executable} -c "import json,sys; print(json.dumps(sys.argv[1:]))" "$@"; }}\n'
    path = tmp_path / "launch.sh"
    path.write_text(shim + script)
    out = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[")]


def test_the_fixture_really_ends_in_a_backslash_with_no_newline():
    assert (FIX / "trailing-backslash-eof.yaml").read_bytes().endswith(b"\\")


def test_a_recipe_ending_in_a_backslash_plans_what_bash_runs(tmp_path):
    r = load_recipe(FIX / "trailing-backslash-eof.yaml")
    assert r.command.endswith("\\")                 # the YAML block keeps it: no newline follows
    params = r.params()
    argv, shell = command_argv(r, params)
    assert not shell and r.warnings == ()
    assert [argv[1:]] == bash_script_argv(r.command.format(**params), tmp_path)
    assert argv[-2:] == ["--gpu-memory-utilization", "0.7"]


def test_extra_args_follow_the_last_flag(tmp_path):
    r = load_recipe(FIX / "trailing-backslash-eof.yaml")
    argv, _ = command_argv(r, r.params(), extra_args=["--seed", "42"])
    assert argv[-4:] == ["--gpu-memory-utilization", "0.7", "--seed", "42"]


@pytest.mark.parametrize("text", [
    "vllm serve m \\",            # a word, then a backslash that ends the file
    "vllm serve m\\",             # glued to the last word
    "vllm serve m \\\n  --x 1 \\",  # after a continued line
    "vllm serve m \\\\",          # an escaped backslash is a literal one, kept
])
def test_lines_match_bash_reading_a_script(text, tmp_path):
    [(_, line)] = bash_command_lines(text)
    assert [shlex.split(line)[1:]] == bash_script_argv(text, tmp_path)
