"""A recipe's command as argv, and reading flags back out of an argv (the last one wins: sparkconsole/runtimes.py)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import UserError
from ..recipes import Recipe
from ..recipes.render import render_v2, shell_quote
from ..runtimes import RUNTIMES, VLLM, Runtime, model_source
from ..runtimes import flag_value as flag_value  # re-exported: launch modules read flags from here
from ..runtimes import has_flag as has_flag

SHELL_OPERATORS = {"&&", "||", ";", "|", ">", ">>", "<", "&"}


def command_argv(recipe: Recipe, params: Mapping[str, Any], extra_args: Sequence[str] = (), *,
                 multi_node: bool = False, runtime: str = VLLM) -> tuple[list[str], bool]:
    """The recipe's command as argv: the template split into words first, then each word's placeholders
    filled, so a value can never become several arguments. vLLM's executor flag is the topology's business where
    it must be: a multi-node launch drops any (it adds ray, or mp's default serves), a one-node launch drops
    only `ray` (it would need a Ray cluster nobody started) and keeps `uni` or `mp`; another runtime's command is
    left as written. Returns (argv, shell):
    shell when the command uses shell operators and runs under `bash -c`, its values then quoted for that
    shell."""
    recipe.render_command(params)            # names a missing placeholder with the file and line
    # The runner writes the command into a bash script: read it as bash does (comments dropped, a line that
    # does not end in a backslash ends the command). One command → argv; several → the shell path below.
    from ..recipes.bashread import bash_command_lines
    commands = [text for _, text in bash_command_lines(recipe.command)]
    template = "\n".join(commands)
    if len(commands) > 1:
        return ["bash", "-c", " ".join([_fill_quoted(recipe, template, params), *map(shlex.quote, extra_args)])], True
    try:
        # v2, as sparkrun: the template filled, then split as bash splits it (a value may be several words);
        # v1, as sparkconsole always read it: split first, each word filled (a value is one word)
        words = shlex.split(_fill_v2(recipe, template, params) if recipe.v2 else template)
    except ValueError as exc:
        raise UserError(f"the command cannot be split into arguments ({exc})", file=recipe.source,
                        line=recipe.command_line, field="command", fix="balance the quotes in the command") from None
    if not words:
        raise UserError("the command is empty", file=recipe.source, line=recipe.command_line, field="command",
                        fix="write the vllm serve command")
    if any(w in SHELL_OPERATORS for w in words):
        return ["bash", "-c", " ".join([_fill_quoted(recipe, template, params), *map(shlex.quote, extra_args)])], True
    if recipe.v2:
        argv = words
    else:
        values = {k: _plain(v) for k, v in params.items()}
        argv = [w.format(**values) for w in words]
    if runtime != VLLM:
        return [*argv, *extra_args], False
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--distributed-executor-backend" or a.startswith("--distributed-executor-backend="):
            value = a.partition("=")[2] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
            if multi_node or value == "ray":
                i += 1 if "=" in a else 2
                continue
        out.append(a)
        i += 1
    return [*out, *extra_args], False


def _fill_v2(recipe: Recipe, template: str, params: Mapping[str, Any]) -> str:
    return render_v2(template, recipe.template_values(params), recipe.source, recipe.command_line, "command")


def _fill_quoted(recipe: Recipe, template: str, params: Mapping[str, Any]) -> str:
    """The template for `bash -c`, each value quoted for where it lands in that shell line (v2: inside '…' or
    "…" as written, so a JSON value in quotes stays one literal word)."""
    if recipe.v2:
        return render_v2(template, recipe.template_values(params), recipe.source, recipe.command_line, "command",
                         quote=shell_quote)
    return template.format(**{k: shlex.quote(str(_plain(v))) for k, v in params.items()})


def _plain(v: Any) -> Any:
    if isinstance(v, bool):
        return "true" if v else "false"
    return v


def served_model(recipe: Recipe, argv: Sequence[str], runtime: Runtime = RUNTIMES[VLLM]) -> str | None:
    """The name /v1/models lists: the runtime's served-name flag, else the model it loads, else the recipe's."""
    return flag_value(argv, *runtime.served_name) or model_source(runtime, argv) or recipe.model
