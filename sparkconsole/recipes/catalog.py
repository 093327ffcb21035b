"""Every recipe sparkconsole can see, in one list: the local ones (./recipes, ~/.config/sparkconsole/recipes, the
bundle) and each fetched registry's, with what a listing and a search need (key, registry, name, model, runtime,
node range, topologies, description), read fast (libyaml, no validation) and kept in a cache keyed by each file's
size and modification time, so `recipe list` of 500 recipes answers within a second and a search across all of
them within one keystroke. The full, validated read is `find_recipe` / `load_recipe` (recipes/sources.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from .sources import bundled_dir, recipe_key, user_dirs, version_of, yaml_files

CACHE = "catalog.json"
CACHE_VERSION = 1
SEARCHED = ("key", "name", "model", "description", "registry", "runtime")


@dataclass(frozen=True)
class Entry:
    key: str                      # what `recipe plan KEY` takes: NAME, SUBFOLDER/NAME or @REGISTRY/NAME
    registry: str                 # a registry's name, or "local" / "bundled"
    name: str
    model: str
    runtime: str
    version: str
    description: str
    topologies: str               # as `recipe list` prints them
    path: str
    visible: bool = True
    error: str = ""               # the file could not be read as a mapping

    def matches(self, needle: str) -> bool:
        n = needle.lower()
        return any(n in str(getattr(self, f)).lower() for f in SEARCHED)


def _summary(path: Path, key: str, registry: str, visible: bool) -> Entry:
    try:
        with path.open("rb") as f:
            data = yaml.load(f.read(1_000_001), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError, ValueError) as exc:
        return Entry(key, registry, path.stem, "", "", "?", "", "-", str(path), visible, type(exc).__name__)
    if not isinstance(data, dict):
        return Entry(key, registry, path.stem, "", "", "?", "", "-", str(path), visible, "not a mapping")
    v2 = version_of(data) == "2"
    meta: dict[str, Any] = data["metadata"] if isinstance(data.get("metadata"), dict) else {}
    runtime = str(data.get("runtime") or "vllm") if v2 else "vllm"
    lo = data.get("min_nodes", 1) if v2 else 1
    hi = data.get("max_nodes") if v2 else None
    cluster_only = bool(data.get("cluster_only")) or data.get("mode") == "cluster" or (isinstance(lo, int) and lo > 1)
    solo_only = bool(data.get("solo_only")) or data.get("mode") == "solo" or hi == 1
    section: dict[str, Any] = data["sparkconsole"] if isinstance(data.get("sparkconsole"), dict) else {}
    topologies: list[Any] = section["topologies"] if isinstance(section.get("topologies"), list) else \
        ["cluster-tp2"] if cluster_only else ["solo", "2x-solo"] if solo_only else ["solo", "cluster-tp2", "2x-solo"]
    desc = data.get("description") or meta.get("description") or ""
    return Entry(key, registry, str(data.get("name") or path.stem), str(data.get("model") or ""), runtime.replace(
        "vllm-ray", "vllm").replace("vllm-distributed", "vllm"), "2" if v2 else "1", " ".join(str(desc).split())[:200],
        ",".join(map(str, topologies)), str(path), visible)


def _sources(include_hidden: bool) -> Iterable[tuple[Path, str, str, bool]]:
    """(file, key, registry, visible) of every recipe: local first, as lookups find them."""
    seen: set[str] = set()
    for d, where in [*((u, "local") for u in user_dirs()), (bundled_dir(), "bundled")]:
        for p in yaml_files(d):
            key = recipe_key(d, p)
            if key not in seen:
                seen.add(key)
                yield p, key, where, True
    from .registry import Registries
    for rr in Registries.load().recipes(include_hidden=include_hidden):
        yield rr.path, rr.qualified, rr.registry, rr.visible


def _cache_path() -> Path:
    from .registry import registries_dir
    return registries_dir() / CACHE


def catalog(include_hidden: bool = False) -> list[Entry]:
    cache_file = _cache_path()
    try:
        raw = json.loads(cache_file.read_text())
        cached: dict[str, Any] = raw["entries"] if raw.get("version") == CACHE_VERSION else {}
    except (OSError, ValueError, KeyError, AttributeError):
        cached = {}
    out: list[Entry] = []
    fresh: dict[str, Any] = {}
    changed = False
    for path, key, registry, visible in _sources(include_hidden):
        try:
            st = path.stat()
        except OSError:
            continue
        stamp = [st.st_size, st.st_mtime_ns]
        hit = cached.get(str(path))
        if hit is not None and hit["stamp"] == stamp and hit["entry"]["key"] == key \
                and hit["entry"]["registry"] == registry and hit["entry"]["visible"] == visible:
            entry = Entry(**hit["entry"])
        else:
            entry = _summary(path, key, registry, visible)
            changed = True
        fresh[str(path)] = {"stamp": stamp, "entry": asdict(entry)}
        out.append(entry)
    registries = any(e.registry not in ("local", "bundled") for e in out)
    if registries and (changed or set(fresh) != set(cached)):     # nothing written for local files alone
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"version": CACHE_VERSION, "entries": fresh}))
            os.replace(tmp, cache_file)
        except OSError:
            pass                  # a read-only state dir: the listing is only slower
    return out


def search(entries: Iterable[Entry], text: str) -> list[Entry]:
    """Entries whose key, name, model, description, registry or runtime holds every word of `text`."""
    words = text.split()
    return [e for e in entries if all(e.matches(w) for w in words)]
