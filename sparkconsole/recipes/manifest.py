"""A registry's `.sparkrun/registry.yaml`: the sections of one git repository, as sparkrun declares them.

    registries:
      - name: official
        description: …
        recipes: official-recipes        # (or subpath)        where its recipes are
        mods: official-mods              # (or mods_subpath)   where its mods are
        benchmarks: benchmarking         # (or benchmark_subpath)
        tuning: tuning                   # (or tuning_subpath)
        visible: false                   # listed only with `recipe list --all`

A repository without the file (a spark-vllm-docker checkout or fork) is one section named after the registry,
with `recipes` and `mods` at its top. Every path must stay inside the repository: a manifest is someone else's
text, and its paths become directories this machine reads. A malformed manifest is one line naming the file, the
field and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..yamlsrc import load_file

MANIFEST = ".sparkrun/registry.yaml"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SECTION_KEYS = {"name", "description", "recipes", "subpath", "mods", "mods_subpath", "benchmarks",
                "benchmark_subpath", "tuning", "tuning_subpath", "visible", "enabled", "format", "url"}


@dataclass(frozen=True)
class Section:
    name: str
    recipes: str                 # "" serves none; "/" the repository's top
    mods: str = ""
    benchmarks: str = ""
    tuning: str = ""
    description: str = ""
    visible: bool = True

    def sparse_paths(self) -> list[str]:
        return [p for p in (self.recipes, self.mods, self.benchmarks, self.tuning) if p]

    def recipe_dir(self, root: Path) -> Path | None:
        return None if not self.recipes else root if self.recipes == "/" else root / self.recipes

    def mods_dir(self, root: Path) -> Path | None:
        return None if not self.mods else root if self.mods == "/" else root / self.mods


def default_sections(name: str) -> tuple[Section, ...]:
    return (Section(name=name, recipes="recipes", mods="mods"),)


def _subpath(value: object, file: str, line: int | None, field: str) -> str:
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise UserError(f"{field} must be a folder of the repository", file=file, line=line, field=field,
                        fix="write a relative folder, e.g. recipes")
    if value == "/":
        return "/"
    if "\\" in value or value.startswith("/") or not all(_SEGMENT.match(s) for s in value.split("/") if s) \
            or not any(value.split("/")):
        raise UserError(f"{field} {value[:60]!r} leaves the repository or is not a plain folder", file=file,
                        line=line, field=field, fix="write a relative folder inside the repository, e.g. recipes")
    return value.strip("/")


def read_manifest(root: Path, registry: str) -> tuple[Section, ...]:
    path = root / MANIFEST
    if not path.is_file():
        return default_sections(registry)
    doc = load_file(path)
    f = f"{registry}:{MANIFEST}"
    data = doc.data
    if not isinstance(data, dict) or not isinstance(data.get("registries"), list) or not data["registries"]:
        raise UserError("the manifest declares no sections", file=f, line=doc.line(("registries",)),
                        field="registries", fix="write registries: [{name: NAME, recipes: FOLDER}]")
    out: list[Section] = []
    for i, raw in enumerate(data["registries"]):
        p = ("registries", i)
        where = f"registries[{i}]"
        if not isinstance(raw, dict):
            raise UserError("a section must be a mapping", file=f, line=doc.line(p), field=where,
                            fix="write {name: NAME, recipes: FOLDER}")
        for k in raw:
            if k not in SECTION_KEYS:
                raise UserError(f"unknown key {str(k)[:30]!r}", file=f, line=doc.line(p + (k,)), field=f"{where}.{k}",
                                fix=f"use one of: {', '.join(sorted(SECTION_KEYS))}")
        name = raw.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise UserError(f"section name {str(name)[:40]!r} is not a plain name", file=f, line=doc.line(p + ("name",)),
                            field=f"{where}.name", fix="write a name of letters, digits, '.', '_' and '-'")
        if any(s.name == name for s in out):
            raise UserError(f"section {name!r} is declared twice", file=f, line=doc.line(p + ("name",)),
                            field=f"{where}.name", fix="give each section its own name")
        fmt = raw.get("format", "sparkrun")
        if fmt not in (None, "sparkrun"):
            raise UserError(f"format {str(fmt)[:20]!r} is not sparkrun's recipe format", file=f,
                            line=doc.line(p + ("format",)), field=f"{where}.format",
                            fix="only sparkrun-format registries are read")
        if raw.get("enabled") is False:
            continue

        visible = raw.get("visible", True)
        if not isinstance(visible, bool):
            raise UserError("visible must be true or false", file=f, line=doc.line(p + ("visible",)),
                            field=f"{where}.visible", fix="write visible: true")
        desc = raw.get("description", "")
        def sub(*keys: str, default: str = "", raw: dict[str, object] = raw, p: tuple[str, int] = p) -> str:
            for k in keys:
                if k in raw:
                    return _subpath(raw[k], f, doc.line(p + (k,)), f"registries[{p[1]}].{k}")
            return default
        out.append(Section(name=name, recipes=sub("recipes", "subpath", default="recipes"),
                           mods=sub("mods", "mods_subpath"), benchmarks=sub("benchmarks", "benchmark_subpath"),
                           tuning=sub("tuning", "tuning_subpath"), visible=visible,
                           description=" ".join(str(desc).split())[:200]))
    return tuple(out)
