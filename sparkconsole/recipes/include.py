"""`include:` in a recipe_version "2" recipe: the recipe is a delta over one base recipe, as sparkrun merges it.

    include: qwen3.6-27b-fp8           # a file beside this one (no path separators)
    include: "@official/qwen3.6-27b"   # a registry's recipe

The base is read (and its own include resolved, at most 8 deep; a file already in the chain is a cycle), then
this recipe is merged over it: mappings merge key by key, scalars and lists replace, an explicit null deletes the
inherited key; the values inside `defaults` and `env` are single settings and replace as a whole; `overrides:`
entries are appended after the base's; a recipe that serves another model does not inherit the base's
`metadata` (it describes the base's model). A base must be a v2 recipe. Every refusal is one line naming the
including file, the `include` field and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from copy import deepcopy
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..yamlsrc import load_file

MAX_DEPTH = 8
ATOMIC_SECTIONS = frozenset({"defaults", "env"})
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")
# A registry reference → (file, registry name); None when no registry holds it.
Locate = Callable[[str], "tuple[Path, str] | None"]


def merge(base: Mapping[str, Any], outer: Mapping[str, Any]) -> dict[str, Any]:
    """`outer` merged over `base` by the rules above; neither is changed."""
    merged = deepcopy(dict(base))
    merged.pop("include", None)
    if "model" in outer and outer["model"] != base.get("model"):
        merged.pop("metadata", None)
    for key, value in outer.items():
        if key == "include":
            continue
        if value is None:
            merged.pop(key, None)
        elif key == "overrides" and isinstance(value, list) and isinstance(merged.get(key), list):
            merged[key] = [*merged[key], *deepcopy(value)]
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge_mapping(merged[key], value, atomic=key in ATOMIC_SECTIONS)
        else:
            merged[key] = deepcopy(value)
    return merged


def _merge_mapping(base: Mapping[str, Any], outer: Mapping[str, Any], *, atomic: bool) -> dict[str, Any]:
    out = dict(base)
    for key, value in outer.items():
        if value is None:
            out.pop(key, None)
        elif not atomic and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge_mapping(out[key], value, atomic=False)
        else:
            out[key] = deepcopy(value)
    return out


def resolve_includes(data: Mapping[str, Any], source: Path, locate: Locate | None = None,
                     line: int | None = None) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the merged document, the included files outermost base first). A document without `include` comes back
    as it is."""
    if "include" not in data:
        return dict(data), ()
    return _resolve(dict(data), source, source, locate, {str(source.resolve())}, 0, line)


def _error(origin: Path, line: int | None, problem: str, fix: str) -> UserError:
    return UserError(problem, file=str(origin), line=line, field="include", fix=fix)


def _resolve(data: dict[str, Any], here: Path, origin: Path, locate: Locate | None, seen: set[str], depth: int,
             line: int | None) -> tuple[dict[str, Any], tuple[str, ...]]:
    if "include" not in data:
        return data, ()
    ref = data["include"]
    if not isinstance(ref, str) or not ref.strip():
        raise _error(origin, line, f"include must name one recipe, got {type(ref).__name__}",
                     "write include: NAME (a file beside this one) or include: \"@REGISTRY/NAME\"")
    ref = ref.strip()
    if depth >= MAX_DEPTH:
        raise _error(origin, line, f"the include chain is deeper than {MAX_DEPTH} recipes (at {ref[:60]!r})",
                     "include a recipe that includes fewer others, or write the values out")
    path = _locate(ref, here, origin, locate, line)
    key = str(path.resolve())
    if key in seen:
        raise _error(origin, line, f"include cycle: {ref[:60]!r} is already in this recipe's include chain",
                     "remove the include that leads back to a recipe of the chain")
    seen.add(key)
    doc = load_file(path, duplicates="last")
    base = doc.data
    if not isinstance(base, dict):
        raise _error(origin, line, f"included recipe {ref[:60]!r} ({path}) is not a mapping", "include a recipe file")
    if str(base.get("recipe_version", "2")) == "1":
        raise _error(origin, line, f"included recipe {ref[:60]!r} is recipe_version \"1\"; include is v2's",
                     "include a v2 recipe, or copy the values over")
    base, chain = _resolve(base, path, origin, locate, seen, depth + 1, line)
    return merge(base, data), (*chain, str(path))


def _locate(ref: str, here: Path, origin: Path, locate: Locate | None, line: int | None) -> Path:
    if ref.startswith("@"):
        scope, _, name = ref[1:].partition("/")
        if not scope or not name or not all(_COMPONENT.match(p) for p in name.split("/")):
            raise _error(origin, line, f"include {ref[:60]!r} is not a valid @REGISTRY/NAME", "write \"@REGISTRY/NAME\"")
        hit = locate(ref) if locate is not None else None
        if hit is None:
            raise _error(origin, line, f"included recipe {ref[:60]!r} is in no registry",
                         "add the registry (`sparkconsole recipe registry add URL`) or run `recipe registry update`")
        return hit[0]
    if not _COMPONENT.match(ref):
        raise _error(origin, line, f"include {ref[:60]!r} names a path",
                     "name a recipe beside this one (no '/'), or a registry's as \"@REGISTRY/NAME\"")
    directory = here.parent
    names = [ref] if ref.endswith((".yaml", ".yml")) else [ref + ".yaml", ref + ".yml"]
    for n in names:
        candidate = directory / n
        if candidate.is_file():
            # a symlink in a registry may point anywhere: the file itself must be beside the includer
            if not candidate.resolve().is_relative_to(directory.resolve()):
                raise _error(origin, line, f"included recipe {ref[:60]!r} resolves outside {directory}",
                             "include a file that lives beside this one")
            return candidate
    raise _error(origin, line, f"included recipe {ref[:60]!r} not found beside {here.name}",
                 f"put {ref}.yaml in {directory}, or include a registry's recipe as \"@REGISTRY/NAME\"")
