"""Recipe registries with the real git, on file:// repositories made here (issue 36 item 4): add (sparse clone of
the folders the manifest names), list, update (nothing fetched when nothing changed), rm; @REGISTRY/NAME and
sections; a name in two registries refused; sub-folders (issue 39); the listing and its search."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sparkconsole.errors import UserError
from sparkconsole.recipes import find_recipe
from sparkconsole.recipes.catalog import catalog, search
from sparkconsole.recipes.registry import Registries
from tests.helpers import git_repo

V2 = 'recipe_version: "2"\nmodel: org/{name}\ncontainer: img\ncommand: vllm serve {{model}}\n'


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def arena(state):
    return git_repo(state / "arena", {
        ".sparkrun/registry.yaml": "registries:\n  - name: official\n    recipes: official-recipes\n"
                                   "    mods: official-mods\n  - name: experimental\n    recipes: exp-recipes\n"
                                   "    visible: false\n",
        "official-recipes/qwen/qwen-8b.yaml": V2.format(name="qwen-8b"),
        "official-recipes/qwen/vllm/qwen-32b.yaml": V2.format(name="qwen-32b"),
        "official-mods/fix/run.sh": "true\n",
        "exp-recipes/wild.yaml": V2.format(name="wild"),
        "untouched/big.bin": "x" * 1000,
        "README.md": "arena\n",
    })


def test_add_clones_only_the_folders_the_manifest_names(state, arena):
    regs = Registries.load()
    assert [e.name for e in regs.entries] == ["official", "community", "eugr"]       # known, not fetched
    assert not any(regs.fetched(e.name) for e in regs.entries)
    entry, sections = regs.add(f"file://{arena}", name="arena")
    assert [s.name for s in sections] == ["official", "experimental"] and not entry.trusted
    clone = regs.clone_dir("arena")
    assert (clone / "official-recipes/qwen/qwen-8b.yaml").is_file() and (clone / "official-mods/fix/run.sh").is_file()
    assert not (clone / "untouched").exists()                               # sparse: not a folder it names
    again = Registries.load()                                                # saved in the state dir
    assert again.entry("arena").url == f"file://{arena}" and again.fetched("arena")
    assert sorted(r.qualified for r in again.recipes()) == ["@arena/qwen/qwen-8b", "@arena/qwen/vllm/qwen-32b",
                                                            "@arena/wild"]


def test_addressing_by_registry_section_subfolder_and_stem(state, arena):
    Registries.load().add(f"file://{arena}", name="arena")
    for ref in ("@arena/qwen-8b", "@arena/qwen/qwen-8b", "@official/qwen-8b", "qwen-8b", "qwen/qwen-8b"):
        r = find_recipe(ref)
        assert r.model == "org/qwen-8b" and r.registry == "arena" and r.key == "@arena/qwen/qwen-8b", ref
    assert find_recipe("@experimental/wild").model == "org/wild"
    with pytest.raises(UserError, match="no recipe named 'nope'"):
        find_recipe("nope")
    with pytest.raises(UserError, match="no registry or section named 'ghost'"):
        find_recipe("@ghost/qwen-8b")


def test_a_name_in_two_registries_is_refused_naming_both(state, arena):
    other = git_repo(state / "other", {"recipes/qwen-8b.yaml": V2.format(name="fork")})
    regs = Registries.load()
    regs.add(f"file://{arena}", name="arena")
    regs.add(f"file://{other}", name="fork")                                 # no manifest: recipes/ and mods/
    with pytest.raises(UserError) as ei:
        find_recipe("qwen-8b")
    assert "@arena/qwen/qwen-8b" in str(ei.value) and "@fork/qwen-8b" in str(ei.value) and "\n" not in str(ei.value)
    assert find_recipe("@fork/qwen-8b").model == "org/fork"


def test_a_local_recipe_wins_and_sub_folders_are_found(state, arena):
    d = state / "recipes" / "3x-spark-cluster"
    d.mkdir(parents=True)
    (d / "big-one.yaml").write_text('recipe_version: "1"\nname: big\ncontainer: c\ncommand: vllm serve m\n')
    assert find_recipe("big-one").key == "3x-spark-cluster/big-one"
    assert find_recipe("3x-spark-cluster/big-one").name == "big"
    (state / "recipes" / "4x-spark-cluster").mkdir()
    (state / "recipes" / "4x-spark-cluster" / "big-one.yaml").write_text((d / "big-one.yaml").read_text())
    with pytest.raises(UserError, match=r"in 2 folders: 3x-spark-cluster/big-one, 4x-spark-cluster/big-one"):
        find_recipe("big-one")


def test_update_fetches_nothing_when_nothing_changed_and_follows_a_change(state, arena):
    regs = Registries.load()
    regs.add(f"file://{arena}", name="arena")
    clone = regs.clone_dir("arena")
    objects = sorted(p.name for p in (clone / ".git" / "objects").rglob("*") if p.is_file())
    head = git(clone, "rev-parse", "HEAD")
    assert regs.update("arena") == ["arena: unchanged (nothing fetched)"]
    assert sorted(p.name for p in (clone / ".git" / "objects").rglob("*") if p.is_file()) == objects
    assert git(clone, "rev-parse", "HEAD") == head
    (arena / "official-recipes/new.yaml").write_text(V2.format(name="new"))
    git(arena, "add", "-A")
    git(arena, "commit", "-qm", "new")
    assert regs.update("arena") == ["arena: updated"]
    assert find_recipe("@arena/new").model == "org/new"


def test_rm_removes_the_clone_and_a_default_stays_removed(state, arena):
    regs = Registries.load()
    regs.add(f"file://{arena}", name="arena")
    regs.remove("arena")
    regs.remove("community")
    again = Registries.load()
    assert [e.name for e in again.entries] == ["official", "eugr"] and not (state / "state/registries/clones/arena").exists()


def test_list_and_search_across_registries(state, arena, capsys):
    from sparkconsole.cli import main
    Registries.load().add(f"file://{arena}", name="arena")
    entries = catalog()
    keys = {e.key: e.registry for e in entries}
    assert keys["@arena/qwen/qwen-8b"] == "arena" and keys["tiny-testbed"] == "bundled" and "@arena/wild" not in keys
    assert "@arena/wild" in {e.key for e in catalog(include_hidden=True)}
    assert [e.key for e in search(entries, "32b arena")] == ["@arena/qwen/vllm/qwen-32b"]
    assert main(["recipe", "list", "qwen"]) == 0
    out = capsys.readouterr().out
    assert "@arena/qwen/qwen-8b" in out and "arena: " in out and "tiny-testbed" not in out
    assert main(["recipe", "registry", "list"]) == 0
    out = capsys.readouterr().out
    assert "arena" in out and "untrusted" in out and "3 recipe(s); sections: official, experimental (hidden)" in out


def test_registry_cli_add_update_rm(state, arena, capsys):
    from sparkconsole.cli import main
    assert main(["recipe", "registry", "add", f"file://{arena}", "--name", "arena", "--trust"]) == 0
    assert "added arena" in capsys.readouterr().out and Registries.load().entry("arena").trusted
    assert main(["recipe", "registry", "update", "arena"]) == 0
    assert "arena: unchanged (nothing fetched)" in capsys.readouterr().out
    assert main(["recipe", "registry", "rm", "arena"]) == 0
    assert main(["recipe", "registry", "rm", "arena"]) == 2
    assert "no registry named 'arena'" in capsys.readouterr().err
