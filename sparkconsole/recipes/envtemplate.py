"""`env:` values of a v2 recipe: literal, except sparkrun's two reserved templates.

`{config.NAME}` is the launch's value of NAME (defaults, then --set); `{launch.NAME}` is a fact of the launch on
that node: num_nodes, node_rank, node_host, cluster_id, model_revision. `{{config.NAME}}` is the literal text
`{config.NAME}`. Nothing else is expanded: not the control machine's `$VAR` (a third-party recipe could carry
this machine's secrets into a container), not the node's (the value reaches `docker run -e` quoted).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import UserError
from .render import plain

LAUNCH_FIELDS = frozenset({"num_nodes", "node_rank", "node_host", "cluster_id", "model_revision"})
# sparkrun's fields that need a prepared model or runtime cache on the node, which sparkconsole does not make.
LAUNCH_UNSUPPORTED = frozenset({"model_path", "runtime_cache_dir"})
_OPEN = re.compile(r"(?<![$\{])(\{+)(config|launch)\.")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _parts(value: str) -> list[tuple[str, str | None]]:
    """(literal, None) and ("", "config.NAME" | "launch.NAME") pieces; raises ValueError on a malformed token."""
    out: list[tuple[str, str | None]] = []
    cursor = 0
    for m in _OPEN.finditer(value):
        if m.start() < cursor:
            continue
        width = len(m.group(1))
        end = value.find("}", m.end())
        if end < 0 or "{" in value[m.end():end]:
            raise ValueError(f"an unclosed {{{m.group(2)}.…}}")
        name = value[m.end():end]
        out.append((value[cursor:m.start()], None))
        if width > 1:       # {{config.x}}: the literal text {config.x}
            closing = end + 1
            while closing < len(value) and value[closing] == "}" and closing - end < width:
                closing += 1
            out.append((value[m.start() + 1:closing - 1], None))
            cursor = closing
            continue
        if not _NAME.match(name):
            raise ValueError(f"{{{m.group(2)}.{name}}} is not a plain name")
        if m.group(2) == "launch" and name in LAUNCH_UNSUPPORTED:
            raise ValueError(f"{{launch.{name}}} needs sparkrun's prepared model or cache, which sparkconsole does "
                             "not make")
        if m.group(2) == "launch" and name not in LAUNCH_FIELDS:
            raise ValueError(f"{{launch.{name}}} is not a launch fact (those are: {', '.join(sorted(LAUNCH_FIELDS))})")
        out.append(("", f"{m.group(2)}.{name}"))
        cursor = end + 1
    out.append((value[cursor:], None))
    return out


def check_env(env: Mapping[str, str], file: str, line_of: Any) -> None:
    """Refuse a malformed template when the recipe is read (one line naming env.NAME)."""
    for key, value in env.items():
        try:
            _parts(value)
        except ValueError as exc:
            raise UserError(str(exc), file=file, line=line_of(("env", key)), field=f"env.{key}",
                            fix="write {config.NAME} or {launch.NAME}, or {{…}} for the literal text") from None


def is_template(value: str) -> bool:
    return _OPEN.search(value) is not None


def render_env(env: Mapping[str, str], config: Mapping[str, Any], launch: Mapping[str, Any], file: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in env.items():
        if not is_template(value):
            out[key] = value
            continue
        chunks: list[str] = []
        for text, name in _parts(value):
            chunks.append(text)
            if name is None:
                continue
            space, field_ = name.split(".", 1)
            got = (config if space == "config" else launch).get(field_)
            if got is None or got == "":
                raise UserError(f"{{{name}}} has no value in this launch", file=file, field=f"env.{key}",
                                fix=f"add '{field_}: VALUE' under defaults, or pass --set {field_}=VALUE"
                                if space == "config" else "remove it from env")
            chunks.append(str(plain(got)))
        out[key] = "".join(chunks)
    return out
