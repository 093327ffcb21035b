"""The recipe files of a folder: what the local recipe folders (recipes/sources.py) and a registry's sections
(recipes/registry.py) hold, found the same way."""

from __future__ import annotations

from pathlib import Path

YAML_SUFFIXES = (".yaml", ".yml")
MAX_SUBFOLDER_DEPTH = 3


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
