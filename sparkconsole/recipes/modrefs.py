"""Where each of a recipe's mods is, and where it comes from (the plan says so; recipes/trust.py judges it).

recipe_version "1", as spark-vllm-docker's runner: relative to the checkout the recipe lives in (the folder that
holds the runner, else the parent of its `recipes/` folder), or an absolute path.
recipe_version "2", as sparkrun: `@REGISTRY/NAME` in that registry's mods folder; else beside the recipe (`NAME`,
`mods/NAME`); else the mods folder of the recipe's own registry; else the `eugr` registry's (where sparkrun
looks last, and where the official registry's recipes find theirs). A leading `mods/` is dropped first.

A mod is *inside* when it lies in the recipe's checkout or in a registry: anything else (`../../..`, an absolute
path, a symlink out) runs its run.sh as root in the container only after confirmation (recipes/trust.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .model import Recipe

EUGR_REGISTRY = "eugr"
# A directory holding one of these is a spark-vllm-docker checkout: its recipes' mod paths start there.
CHECKOUT_MARKERS = ("run-recipe.py", "run-recipe.sh", "launch-cluster.sh")


@dataclass(frozen=True)
class ModRef:
    ref: str                      # as the recipe (or --apply-mod) wrote it
    path: Path                    # where it was found (not yet resolved through symlinks)
    origin: str                   # in words: "checkout DIR", "registry eugr", "outside: PATH", "--apply-mod"
    registry: str | None = None   # the registry it lies in
    inside: bool = True           # in the recipe's checkout or a registry
    field: str = "mods"


def checkout_root(recipe_source: str) -> Path:
    """The spark-vllm-docker checkout a recipe file belongs to: the nearest directory above it holding the
    runner; else the parent of its `recipes/` directory; else its own directory."""
    here = Path(recipe_source).resolve().parent
    for d in (here, *here.parents):
        if any((d / m).is_file() for m in CHECKOUT_MARKERS):
            return d
    for d in (here, *here.parents):
        if d.name == "recipes":
            return d.parent
    return here


def _is_mod(p: Path) -> bool:
    return (p.is_dir() and (p / "run.sh").is_file()) or (p.suffix == ".zip" and p.is_file())


def locate_mods(recipe: Recipe, extra: Sequence[str] = ()) -> tuple[ModRef, ...]:
    """The recipe's mods, then the command line's (`--apply-mod`, relative to the working directory)."""
    from .registry import Registries
    for i, m in enumerate(recipe.mods):
        _check_path(m, recipe.source, f"mods[{i}]")
    for m in extra:
        _check_path(m, None, "--apply-mod")
    regs = Registries.load() if recipe.mods else None
    out = [(_v2_ref if recipe.v2 else _v1_ref)(recipe, m, i, regs) for i, m in enumerate(recipe.mods)]
    out += [ModRef(m, Path(m).expanduser().resolve(), "--apply-mod (this command line)", field="--apply-mod")
            for m in extra]
    return tuple(out)


def _check_path(m: str, source: str | None, field: str) -> None:
    """A mod reference no file system takes (a NUL byte, a name past 255 bytes, a path past 4096) is refused in
    one line here: looked up, it raised from deep in pathlib."""
    shown = repr(m[:60]) + ("…" if len(m) > 60 else "")
    raw = m.encode("utf-8", "surrogateescape")
    if "\0" in m:
        why = "holds a NUL byte: no path does"
    elif len(raw) > 4096 or any(len(part) > 255 for part in raw.split(b"/")):
        why = "is longer than a path can be (255 bytes a name, 4096 a path)"
    else:
        return
    raise UserError(f"mod {shown} {why}", file=source, field=field,
                    fix="write the mod's directory or .zip, e.g. mods/fix-gptoss")


def _judge(path: Path, recipe: Recipe, regs: object, origin: str, registry: str | None = None) -> tuple[str, str | None, bool]:
    """(origin in words, registry, inside) of a found mod, from where it really is (symlinks followed)."""
    from .registry import Registries
    real = path.resolve()
    if isinstance(regs, Registries):
        e = regs.registry_of(real)
        if e is not None:
            return f"registry {e.name}" + ("" if e.trusted else " (not trusted)"), e.name, True
    root = checkout_root(recipe.source)
    if recipe.registry is None and real.is_relative_to(root):
        return origin or f"checkout {root}", None, True
    return f"outside the recipe's {'registry' if recipe.registry else 'checkout'}: {real}", registry, False


def _v1_ref(recipe: Recipe, m: str, i: int, regs: object) -> ModRef:
    p = Path(m).expanduser()
    root = checkout_root(recipe.source)
    path = p if p.is_absolute() else root / p
    origin, registry, inside = _judge(path, recipe, regs, f"checkout {root}")
    return ModRef(m, path, origin, registry, inside, field=f"mods[{i}]")


def _v2_ref(recipe: Recipe, m: str, i: int, regs: object) -> ModRef:
    from .registry import Registries
    assert isinstance(regs, Registries)
    tried: list[Path] = []
    rel = m[5:] if m.startswith("mods/") else m
    if m.startswith("@"):
        scope, _, rel = m[1:].partition("/")
        rel = rel[5:] if rel.startswith("mods/") else rel
        for reg, sec in regs.scopes(scope):
            for d in regs.mods_dir(reg, sec):
                tried.append(d / rel)
    else:
        base = Path(recipe.source).parent
        p = Path(rel).expanduser()
        if p.is_absolute():
            tried.append(p)
        else:
            tried += [base / rel, base / "mods" / rel]
            if recipe.registry:
                tried += [d / rel for d in regs.mods_dir(recipe.registry)]
            for reg, sec in regs.scopes(EUGR_REGISTRY):
                tried += [d / rel for d in regs.mods_dir(reg, sec)]
    for path in tried:
        if _is_mod(path):
            origin, registry, inside = _judge(path, recipe, regs, f"beside the recipe ({path.parent})")
            return ModRef(m, path, origin, registry, inside, field=f"mods[{i}]")
    where = ", ".join(str(t) for t in tried[:3]) + (f" and {len(tried) - 3} more" if len(tried) > 3 else "") \
        if tried else "no registry of that name is fetched"
    raise UserError(f"mod {m[:60]!r} not found (looked in: {where})", file=recipe.source, field=f"mods[{i}]",
                    fix="fetch the registry that holds it (`sparkconsole recipe registry update`), or correct the name")
