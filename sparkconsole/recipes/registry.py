"""Recipe registries: git repositories of recipes, mods and benchmark profiles, as sparkrun publishes them.

    sparkconsole recipe registry add URL [--name N] [--trust]   clone it (sparse) into the state dir
    sparkconsole recipe registry list                           each registry, its sections, fetched or not
    sparkconsole recipe registry update [NAME]                  fetch what changed (nothing, when nothing did)
    sparkconsole recipe registry rm NAME

Kept under the state dir (`registries/registries.yaml` and `registries/clones/NAME`). The Spark Arena
registries are known by default and fetched only by `registry update`. A recipe is addressed `@REGISTRY/NAME`
(REGISTRY: a registry's name, or one of its manifest's sections; NAME: the file's stem, or its path below the
section's recipe folder); a bare NAME found in two registries is refused, naming both. Trust is this machine's
decision (`--trust`, or the default registries'), never a manifest's: an untrusted registry's pre_exec commands
and mods run only after confirmation (recipes/trust.py).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from ..errors import UserError
from ..paths import state_dir
from . import gitrepo
from .manifest import NAME_RE, Section, read_manifest

CONFIG = "registries.yaml"


@dataclass(frozen=True)
class RegistryEntry:
    name: str
    url: str
    trusted: bool = False
    default: bool = False            # known by default (Spark Arena's); fetched only by `registry update`
    description: str = ""


# Spark Arena's registries, as sparkrun knows them. Trusted: the two it curates; the community one is anyone's.
DEFAULTS = (
    RegistryEntry("official", "https://github.com/spark-arena/recipe-registry.git", trusted=True, default=True,
                  description="Spark Arena's official recipes (and its experimental ones)"),
    RegistryEntry("community", "https://github.com/spark-arena/community-recipe-registry.git", default=True,
                  description="Spark Arena's community recipes"),
    RegistryEntry("eugr", "https://github.com/spark-arena/eugr-recipes.git", trusted=True, default=True,
                  description="eugr/spark-vllm-docker's recipes and mods, mirrored by Spark Arena"),
)


@dataclass(frozen=True)
class RegistryRecipe:
    registry: str
    section: str
    rel: str                         # the path below the section's recipe folder, without .yaml
    path: Path
    visible: bool = True

    @property
    def qualified(self) -> str:
        return f"@{self.registry}/{self.rel}"

    @property
    def stem(self) -> str:
        return self.rel.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class RegistryHit:
    registry: str
    path: Path
    qualified: str


def registries_dir() -> Path:
    return state_dir() / "registries"


@dataclass
class Registries:
    root: Path
    entries: list[RegistryEntry] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    _sections: dict[str, tuple[Section, ...]] = field(default_factory=dict)

    # --- the configuration ----------------------------------------------------------------------------------
    @classmethod
    def load(cls, root: Path | None = None) -> Registries:
        root = root or registries_dir()
        path = root / CONFIG
        entries: list[RegistryEntry] = []
        removed: list[str] = []
        if path.is_file():
            from ..yamlsrc import load_file
            doc = load_file(path)
            data = doc.data if isinstance(doc.data, dict) else {}
            for i, raw in enumerate(data.get("registries") or []):
                if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not isinstance(raw.get("url"), str):
                    raise doc.error(("registries", i), "a registry needs a name and a url",
                                    "remove the entry, or add it again with `recipe registry add URL`")
                entries.append(RegistryEntry(raw["name"], raw["url"], bool(raw.get("trusted", False)),
                                             bool(raw.get("default", False)), str(raw.get("description") or "")))
            removed = [str(n) for n in data.get("removed") or []]
        names = {e.name for e in entries}
        entries += [d for d in DEFAULTS if d.name not in names and d.name not in removed]
        return cls(root, entries, removed)

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = {"registries": [{"name": e.name, "url": e.url, "trusted": e.trusted, "default": e.default,
                                **({"description": e.description} if e.description else {})} for e in self.entries],
                "removed": sorted(set(self.removed))}
        tmp = self.root / (CONFIG + ".tmp")
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        os.replace(tmp, self.root / CONFIG)

    def entry(self, name: str) -> RegistryEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise UserError(f"no registry named {name[:40]!r}", field="NAME",
                        fix="use one of: " + (", ".join(e.name for e in self.entries) or "(none; add one)"))

    def clone_dir(self, name: str) -> Path:
        return self.root / "clones" / name

    def fetched(self, name: str) -> bool:
        return (self.clone_dir(name) / ".git").exists()

    def sections(self, name: str) -> tuple[Section, ...]:
        if name not in self._sections:
            self._sections[name] = read_manifest(self.clone_dir(name), name) if self.fetched(name) else ()
        return self._sections[name]

    # --- add / rm / update ------------------------------------------------------------------------------------
    def add(self, url: str, name: str | None = None, trusted: bool = False) -> tuple[RegistryEntry, tuple[Section, ...]]:
        url = gitrepo.check_url(url)
        name = name or _name_from_url(url)
        if not NAME_RE.match(name):
            raise UserError(f"registry name {name[:40]!r} is not a plain name", field="--name",
                            fix="give --name of letters, digits, '.', '_' and '-'")
        if any(e.name == name for e in self.entries):
            raise UserError(f"a registry named {name!r} exists", field="--name",
                            fix=f"give another --name, or `recipe registry rm {name}` first")
        entry = RegistryEntry(name, url, trusted=trusted)
        sections = self._clone(entry)
        self.entries.append(entry)
        self.removed = [n for n in self.removed if n != name]
        self.save()
        return entry, sections

    def _clone(self, entry: RegistryEntry) -> tuple[Section, ...]:
        dest = self.clone_dir(entry.name)
        if dest.exists():
            shutil.rmtree(dest)

        def prepare(repo: Path) -> tuple[Section, ...]:
            sections = read_manifest(repo, entry.name)
            gitrepo.set_sparse(repo, [".sparkrun", *(p for s in sections for p in s.sparse_paths())], entry.url)
            return sections
        sections = gitrepo.clone(entry.url, dest, prepare)
        self._sections[entry.name] = sections
        return sections

    def remove(self, name: str) -> None:
        e = self.entry(name)
        self.entries = [x for x in self.entries if x.name != name]
        if e.default:
            self.removed.append(name)
        shutil.rmtree(self.clone_dir(name), ignore_errors=True)
        self.save()

    def update(self, name: str | None = None) -> list[str]:
        """One line per registry: fetched, updated, unchanged (nothing fetched), or why not."""
        lines: list[str] = []
        offline: dict[str, list[str]] = {}
        targets = [self.entry(name)] if name else list(self.entries)
        for e in targets:
            try:
                if not self.fetched(e.name):
                    sections = self._clone(e)
                    lines.append(f"{e.name}: fetched ({_count(sections)} section(s))")
                    continue
                repo = self.clone_dir(e.name)
                changed = gitrepo.update(repo, e.url)
                self._sections.pop(e.name, None)
                sections = read_manifest(repo, e.name)
                gitrepo.set_sparse(repo, [".sparkrun", *(p for s in sections for p in s.sparse_paths())], e.url)
                lines.append(f"{e.name}: {'updated' if changed else 'unchanged (nothing fetched)'}")
            except UserError as err:
                if name:
                    raise
                offline.setdefault(err.problem, []).append(e.name) if err.problem.startswith("no network") else \
                    lines.append(f"{e.name}: {err.problem}" + (f" — fix: {err.fix}" if err.fix else ""))
        self.save()
        # no network: one line, whatever the number of registries it kept from being fetched
        lines += [f"{problem}: {', '.join(names)} not fetched — fix: connect this machine, then run "
                  "`sparkconsole recipe registry update`" for problem, names in offline.items()]
        return lines

    def trust(self, name: str, trusted: bool) -> None:
        e = self.entry(name)
        self.entries = [replace(x, trusted=trusted) if x.name == name else x for x in self.entries]
        del e
        self.save()

    # --- recipes --------------------------------------------------------------------------------------------
    def recipes(self, include_hidden: bool = True) -> Iterator[RegistryRecipe]:
        from .sources import yaml_files
        for e in self.entries:
            if not self.fetched(e.name):
                continue
            root = self.clone_dir(e.name)
            for s in self.sections(e.name):
                d = s.recipe_dir(root)
                if d is None or (not s.visible and not include_hidden):
                    continue
                for p in yaml_files(d):
                    if p.name.startswith("README"):
                        continue
                    yield RegistryRecipe(e.name, s.name, p.relative_to(d).with_suffix("").as_posix(), p, s.visible)

    def scopes(self, scope: str) -> list[tuple[str, str | None]]:
        """(registry, section or None for all of it) that `@scope` names: a registry, or a section of one."""
        if any(e.name == scope and self.fetched(e.name) for e in self.entries):
            return [(scope, None)]
        return [(e.name, s.name) for e in self.entries for s in self.sections(e.name) if s.name == scope]

    def find(self, ref: str) -> RegistryHit | None:
        """`@SCOPE/NAME` or a bare NAME (or SUBFOLDER/NAME) across every registry. Two candidates: refused, naming
        both."""
        scope, name = (ref[1:].split("/", 1) + [""])[:2] if ref.startswith("@") else ("", ref)
        if ref.startswith("@") and (not scope or not name):
            raise UserError(f"{ref[:60]!r} is not @REGISTRY/NAME", field="recipe", fix="write @REGISTRY/NAME")
        name = re.sub(r"\.ya?ml$", "", name)
        wanted = self.scopes(scope) if scope else None
        if scope and not wanted:
            raise UserError(f"no registry or section named {scope[:40]!r}", field="recipe",
                            fix="see `sparkconsole recipe registry list` (a registry not fetched yet: "
                                "`recipe registry update`)")
        # Each registry on its own, as sparkrun scans them: its exact path wins over stems found in its
        # sub-folders; then the registries' answers together.
        exact: dict[str, list[RegistryRecipe]] = {}
        by_stem: dict[str, list[RegistryRecipe]] = {}
        for rr in self.recipes():
            if wanted is not None and not any(rr.registry == reg and sec in (None, rr.section) for reg, sec in wanted):
                continue
            if rr.rel == name:
                exact.setdefault(rr.registry, []).append(rr)
            elif rr.stem == name.rsplit("/", 1)[-1] and (name.count("/") == 0 or rr.rel.endswith("/" + name)):
                by_stem.setdefault(rr.registry, []).append(rr)
        hits = [h for reg in dict.fromkeys([*exact, *by_stem]) for h in (exact.get(reg) or by_stem[reg])]
        if not hits:
            return None
        if len(hits) > 1:
            raise UserError(f"recipe {name[:60]!r} is in {len(hits)} places: "
                            + ", ".join(h.qualified for h in hits[:6]), field="recipe",
                            fix=f"name one of them, e.g. {hits[0].qualified}")
        h = hits[0]
        return RegistryHit(h.registry, h.path, h.qualified)

    def registry_of(self, path: Path) -> RegistryEntry | None:
        rp = path.resolve()
        for e in self.entries:
            if self.fetched(e.name) and rp.is_relative_to(self.clone_dir(e.name).resolve()):
                return e
        return None

    def mods_dir(self, registry: str, section: str | None = None) -> list[Path]:
        root = self.clone_dir(registry)
        out = []
        for s in self.sections(registry):
            if section is not None and s.name != section:
                continue
            d = s.mods_dir(root)
            if d is not None:
                out.append(d)
        return out


def _count(sections: tuple[Section, ...]) -> int:
    return len(sections)


def _name_from_url(url: str) -> str:
    tail = re.split(r"[/:]", url.rstrip("/"))[-1]
    tail = re.sub(r"\.git$", "", tail)
    return re.sub(r"[^A-Za-z0-9._-]", "-", tail).lstrip("-._") or "registry"


def find_in_registries(name: str) -> RegistryHit | None:
    return Registries.load().find(name)


def locate_recipe(ref: str) -> tuple[Path, str] | None:
    hit = find_in_registries(ref)
    return None if hit is None else (hit.path, hit.registry)
