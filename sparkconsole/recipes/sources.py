"""Where recipes live, and which reader reads a file.

A recipe argument is a path to a YAML file, `@REGISTRY/NAME` (recipes/registry.py), or a name: looked up in
./recipes, ~/.config/sparkconsole/recipes and the bundle (in that order), then in the registries. A name may
carry its sub-folder (`3x-spark-cluster/NAME`), and a bare NAME also finds `SUBFOLDER/NAME.yaml` when only one
sub-folder holds it, as the spark-vllm-docker forks' runners resolve them.

recipe_version "1" is read by recipes/v1.py exactly as run-recipe.sh reads it; every other value is sparkrun's
format (recipes/v2.py), as sparkrun reads it. A file without recipe_version is v1 when it looks like one (a
`name:` and none of v2's own keys), else v2.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError
from ..yamlsrc import Located, load_file
from .model import Recipe
from .v1 import read_v1

# Keys only sparkrun's format has: a file without recipe_version that uses one is v2.
V2_ONLY_KEYS = {"runtime", "runtime_version", "include", "overrides", "metadata", "readiness", "pre_exec",
                "post_exec", "post_commands", "executor", "executor_config", "min_nodes", "max_nodes", "mode",
                "model_revision", "builder", "builder_config", "runtime_config", "sparkrun_version", "containers",
                "distribution_config", "layout", "benchmark"}
YAML_SUFFIXES = (".yaml", ".yml")
MAX_SUBFOLDER_DEPTH = 3


def version_of(data: object) -> str:
    """"1" or "2": which reader a loaded document goes to."""
    if not isinstance(data, dict):
        return "1"
    v = data.get("recipe_version", data.get("sparkrun_version"))
    if v is not None:
        return "1" if str(v) == "1" else "2"
    if "name" in data and not V2_ONLY_KEYS & set(data):
        return "1"
    return "2"


def parse_recipe(doc: Located, key: str | None = None, *, registry: str | None = None) -> Recipe:
    if version_of(doc.data) == "1":
        return read_v1(doc, key)
    from .registry import locate_recipe
    from .v2 import read_v2
    return read_v2(doc, key, registry=registry, locate=locate_recipe)


def load_recipe(path: str | Path, *, key: str | None = None, registry: str | None = None) -> Recipe:
    # duplicates="last": a repeated key is read as the runner's PyYAML safe_load reads it, with a warning.
    return parse_recipe(load_file(path, duplicates="last"), key or Path(path).stem, registry=registry)


# --- where recipes live ----------------------------------------------------------------------------------------

def bundled_dir() -> Path:
    return Path(__file__).with_name("bundled")


def user_dirs() -> list[Path]:
    xdg = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    return [Path.cwd() / "recipes", xdg / "sparkconsole" / "recipes"]


def yaml_files(d: Path, depth: int = 0) -> list[Path]:
    """The recipe files of a directory, its sub-folders' too (`3x-spark-cluster/NAME.yaml`), hidden ones skipped."""
    if not d.is_dir():
        return []
    out: list[Path] = []
    try:
        entries = sorted(d.iterdir())
    except OSError:
        return []
    for p in entries:
        if p.name.startswith("."):
            continue
        if p.suffix in YAML_SUFFIXES and p.is_file():
            out.append(p)
        elif depth < MAX_SUBFOLDER_DEPTH and p.is_dir() and not p.is_symlink():
            out.extend(yaml_files(p, depth + 1))
    return out


def recipe_key(d: Path, p: Path) -> str:
    """A file's key below its directory: `NAME`, or `SUBFOLDER/NAME` for one in a sub-folder."""
    return p.relative_to(d).with_suffix("").as_posix()


def bundled_recipes() -> list[Recipe]:
    return [load_recipe(p) for p in yaml_files(bundled_dir())]


def recipe_paths() -> dict[str, Path]:
    """Recipe key → file; ./recipes/ wins over ~/.config/sparkconsole/recipes/, which wins over the bundled."""
    found: dict[str, Path] = {}
    for d in [*user_dirs(), bundled_dir()]:
        for p in yaml_files(d):
            found.setdefault(recipe_key(d, p), p)
    return found


def _by_stem(paths: dict[str, Path], name: str) -> list[str]:
    """Keys whose last part is `name` (a bare NAME for `SUBFOLDER/NAME`)."""
    return [k for k in paths if k.rsplit("/", 1)[-1] == name]


def local_recipe_path(name: str) -> Path | None:
    """A recipe key from ./recipes, ~/.config/sparkconsole/recipes or the bundle; None when none has it. A bare
    name held by several sub-folders is refused, naming them."""
    paths = recipe_paths()
    if name in paths:
        return paths[name]
    hits = _by_stem(paths, name)
    if len(hits) == 1:
        return paths[hits[0]]
    if len(hits) > 1:
        raise UserError(f"recipe {name[:60]!r} is in {len(hits)} folders: {', '.join(sorted(hits))}", field="recipe",
                        fix="name it with its folder, e.g. " + sorted(hits)[0])
    return None


def recipe_path(name_or_path: str) -> Path:
    """The file a recipe argument names: a path to a YAML file, or a key from ./recipes,
    ~/.config/sparkconsole/recipes or the bundle (in that order), then the registries."""
    p = Path(name_or_path).expanduser()
    if p.suffix in YAML_SUFFIXES or (os.sep in name_or_path and p.exists()):
        return p
    if not name_or_path.startswith("@"):
        local = local_recipe_path(name_or_path)
        if local is not None:
            return local
    from .registry import find_in_registries
    hit = find_in_registries(name_or_path)
    if hit is not None:
        return hit.path
    known = ", ".join(sorted(recipe_paths())) or "(none)"
    raise UserError(f"no recipe named {name_or_path[:60]!r}", field="recipe",
                    fix=f"use one of: {known}, `recipe list --all` for the registries' recipes, or give a path to a "
                        ".yaml file")


def find_recipe(name_or_path: str) -> Recipe:
    """A path to a YAML file, a recipe key from ./recipes, ~/.config/sparkconsole/recipes or the bundle, or a
    registry's recipe (`@REGISTRY/NAME`, or NAME when one registry has it)."""
    if not name_or_path.startswith("@"):
        p = Path(name_or_path).expanduser()
        if p.suffix in YAML_SUFFIXES or (os.sep in name_or_path and p.exists()):
            return load_recipe(p)
        local = local_recipe_path(name_or_path)
        if local is not None:
            return load_recipe(local, key=_key_of(local))
    from .registry import find_in_registries
    hit = find_in_registries(name_or_path)
    if hit is None:
        recipe_path(name_or_path)          # raises the one-line error naming what exists
        raise AssertionError("unreachable")
    return load_recipe(hit.path, key=hit.qualified, registry=hit.registry)


def _key_of(path: Path) -> str:
    for d in [*user_dirs(), bundled_dir()]:
        if path.is_relative_to(d):
            return recipe_key(d, path)
    return path.stem
