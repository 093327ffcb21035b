"""Placeholders of a recipe_version "2" template, filled as sparkrun fills them.

Only `{name}` (a plain identifier between single braces, nothing else inside) is a placeholder; every other brace
is kept as written, so literal JSON in a flag needs no escaping (`--limit-mm-per-prompt '{"image":2}'`). A
template that contains `{{` is written in v1's convention (`{{`/`}}` are one literal brace each), and is read
that way. A value that holds placeholders itself (`base_url: http://localhost:{port}`) is filled in turn. `${NAME}` is the shell's, left as written.
A placeholder with no value is a one-line error naming it (sparkrun leaves it in the command; we refuse, so that
a plan never holds a `{name}` the server would be handed).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Container, Mapping
from typing import Any

from ..errors import UserError
from .model import fmt_value

_SPAN = re.compile(r"\{([^{}]*)\}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_DEPTH = 10


def _scan(template: str, escapes: bool | None = None,
          names: Container[str] = ()) -> list[tuple[str, str | None]]:
    """(literal text, None) and ("", placeholder name) pieces, braces resolved as described above. `escapes`: the
    whole template's convention, for one word of it (None: this text's own). `names`: values there are, which
    make `{hf-overrides}` (a default whose name is no identifier, as sparkrun allows) a placeholder too."""
    if escapes is None:
        escapes = "{{" in template
    out: list[tuple[str, str | None]] = []
    i, n = 0, len(template)
    buf: list[str] = []
    while i < n:
        ch = template[i]
        if ch in "{}" and template.startswith(ch * 2, i):
            buf.append(ch if escapes else ch * 2)
            i += 2
            continue
        if ch == "{":
            m = _SPAN.match(template, i)
            if m and (_IDENT.match(m.group(1)) or m.group(1) in names) and not (i > 0 and template[i - 1] == "$"):
                # ${VAR} is the shell's
                out.append(("".join(buf), None))
                buf = []
                out.append(("", m.group(1)))
                i = m.end()
                continue
            if m:                     # `{"image":2}`: JSON, not a placeholder
                buf.append(m.group())
                i = m.end()
                continue
        buf.append(ch)
        i += 1
    out.append(("".join(buf), None))
    return out


def plain(v: Any) -> Any:
    """A value as it appears on the command line: true/false, JSON for a mapping or a list."""
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return fmt_value(v)


def placeholders_v2(template: str) -> list[str]:
    names: list[str] = []
    for _, name in _scan(template):
        if name is not None and name not in names:
            names.append(name)
    return names


def _quote_state(text: str, state: str) -> str:
    """Where a shell stands after `text`, from `state`: outside quotes (""), inside '…' ("'") or "…" ('"')."""
    i = 0
    while i < len(text):
        c = text[i]
        if state == "'":
            state = "" if c == "'" else state
        elif c == "\\":
            i += 1
        elif state == '"':
            state = "" if c == '"' else state
        elif c in "'\"":
            state = c
        i += 1
    return state


def shell_quote(value: str, state: str) -> str:
    """A value for the place in a shell line it lands: inside '…' with its ' closed and reopened, inside "…" with
    what the shell would expand escaped, outside quoted whole."""
    if state == "'":
        return value.replace("'", "'\\''")
    if state == '"':
        return "".join("\\" + c if c in '"$`\\' else c for c in value)
    return shlex.quote(value)


def render_v2(template: str, values: Mapping[str, Any], file: str, line: int | None, field_: str,
              _depth: int = 0, _chain: tuple[str, ...] = (), *, escapes: bool | None = None,
              quote: Callable[[str, str], str] | None = None) -> str:
    """The template filled. `quote(value, state)`: each value as the shell reads it where it lands (for a command
    run by `bash -c`)."""
    out: list[str] = []
    state = ""
    for text, name in _scan(template, escapes, values):
        out.append(text)
        if quote is not None:
            state = _quote_state(text, state)
        if name is None:
            continue
        if name not in values or values[name] is None:
            raise UserError(f"placeholder {{{name}}} has no value", file=file, line=line, field=field_,
                            fix=f"add '{name}: VALUE' under defaults, or pass --set {name}=VALUE")
        value = plain(values[name])
        if isinstance(value, str) and "{" in value and placeholders_v2(value):
            if name in _chain or _depth >= MAX_DEPTH:
                raise UserError(f"placeholder {{{name}}} refers to itself ({' → '.join((*_chain, name))})",
                                file=file, line=line, field=field_, fix=f"give {name} a value without {{{name}}}")
            value = render_v2(value, values, file, line, field_, _depth + 1, (*_chain, name))
        out.append(quote(str(value), state) if quote is not None else str(value))
    return "".join(out)
