"""What of a recipe runs as root in its container on someone else's word, and so only after confirmation.

- A recipe from a registry not marked trusted: each `pre_exec` command, and each mod.
- Any recipe: a mod that lies outside the recipe's checkout and every registry (`../../..`, an absolute path,
  a symlink out): its run.sh runs as root in the container. And a mod from a registry not marked trusted.
A local recipe file is the operator's own, as is a trusted registry's: sparkrun's rule, and ours. The plan lists
these lines (launch/steps.py `Plan.untrusted`); the runner refuses a plan that has them until it is confirmed
(`--trust`, or the question the CLI and the console ask).
"""

from __future__ import annotations

from collections.abc import Sequence

from .model import Recipe
from .modrefs import ModRef


def registry_trusted(name: str | None) -> bool:
    if name is None:
        return True
    from .registry import Registries
    regs = Registries.load()
    return any(e.name == name and e.trusted for e in regs.entries)


def untrusted_items(recipe: Recipe, mods: Sequence[ModRef]) -> tuple[str, ...]:
    """One line per thing that needs confirmation, saying what runs and why it is asked."""
    out: list[str] = []
    from_untrusted = recipe.registry is not None and not registry_trusted(recipe.registry)
    why = f"recipe from registry {recipe.registry}, not marked trusted"
    if from_untrusted:
        for i, p in enumerate(recipe.pre_exec):
            out.append(f"pre_exec[{i}] runs as root in the container ({why}): {' '.join(p.describe().split())[:300]}")
    for m in mods:
        if m.field == "--apply-mod":
            continue                      # named on this command line by the operator
        if not m.inside:
            out.append(f"mod {m.ref} ({m.origin}): its run.sh runs as root in the container")
        elif m.registry is not None and not registry_trusted(m.registry):
            out.append(f"mod {m.ref} from registry {m.registry}, not marked trusted: its run.sh runs as root in "
                       "the container")
        elif from_untrusted:
            out.append(f"mod {m.ref} ({m.origin}; {why}): its run.sh runs as root in the container")
    return tuple(out)
