"""What runs as root on someone else's word runs only after confirmation (issue 36 item 4, issue 40 item 9): a
registry not marked trusted (its pre_exec and mods), a mod outside the recipe's checkout or registry (`../../..`,
an absolute path, a symlink out); the plan says where each mod comes from; the runner refuses an unconfirmed plan;
the CLI asks, or takes --trust."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.errors import UserError
from sparkconsole.launch.plan import make_plan
from sparkconsole.launch.runner import LaunchError, Runner
from sparkconsole.recipes import find_recipe, load_recipe
from sparkconsole.recipes.registry import Registries
from tests.helpers import git_repo
from tests.test_registry import state  # noqa: F401 (fixture: a state dir and working directory of its own)

CLUSTER = ClusterConfig(nodes=(NodeConfig(name="spark1", address="192.168.100.10", role="head", container="vllm_a"),),
                        endpoints=(), source="<test>")
REGISTRY_RECIPE = ('recipe_version: "2"\nmodel: org/m\ncontainer: img\ncommand: vllm serve {model}\n'
                   "mods: [mods/fix]\npre_exec: [\"pip install something-from-the-internet\"]\n")




@pytest.fixture
def registry(state):
    return git_repo(state / "reg", {"recipes/r.yaml": REGISTRY_RECIPE, "mods/fix/run.sh": "echo patched\n"})


def test_an_untrusted_registrys_pre_exec_and_mods_need_confirmation(state, registry):
    Registries.load().add(f"file://{registry}", name="thirdparty")
    plan = make_plan(find_recipe("@thirdparty/r"), "solo", CLUSTER)
    assert plan.mod_origins == ("registry thirdparty (not trusted)",)
    assert len(plan.untrusted) == 2 and "pip install something-from-the-internet" in plan.untrusted[0]
    assert "mod mods/fix" in plan.untrusted[1]
    text = plan.render()
    assert "mod: fix from registry thirdparty (not trusted)" in text and text.count("needs confirmation:") == 2
    Registries.load().trust("thirdparty", True)
    assert make_plan(find_recipe("@thirdparty/r"), "solo", CLUSTER).untrusted == ()


def test_the_runner_refuses_an_unconfirmed_plan_before_running_anything(state, registry):
    Registries.load().add(f"file://{registry}", name="thirdparty")
    plan = make_plan(find_recipe("@thirdparty/r"), "solo", CLUSTER)

    class NoTransport(dict):
        def __missing__(self, key):
            raise AssertionError("a step ran")
    runner = Runner(CLUSTER, NoTransport())
    import asyncio
    with pytest.raises(LaunchError) as ei:
        asyncio.run(runner.launch(plan))
    assert "not confirmed: pre_exec[0]" in str(ei.value) and "(+1 more)" in str(ei.value) and "--trust" in str(ei.value)
    from sparkconsole.launch.rolling import restart
    with pytest.raises(LaunchError, match="not confirmed"):
        asyncio.run(restart(runner, plan))
    confirmed = replace(plan, trusted=True)
    from sparkconsole.launch.runner import check_trusted
    check_trusted(confirmed)                  # no error once confirmed


@pytest.mark.parametrize("where", ["dotdot", "absolute", "symlink"])
def test_a_mod_outside_the_checkout_needs_confirmation_even_for_a_local_recipe(tmp_path, where):
    checkout = tmp_path / "svd"
    (checkout / "recipes").mkdir(parents=True)
    (checkout / "run-recipe.sh").write_text("# the runner\n")
    outside = tmp_path / "elsewhere" / "evil"
    outside.mkdir(parents=True)
    (outside / "run.sh").write_text("rm -rf /\n")
    if where == "dotdot":
        ref = "../elsewhere/evil"
    elif where == "absolute":
        ref = str(outside)
    else:
        (checkout / "mods").mkdir()
        (checkout / "mods" / "evil").symlink_to(outside)
        ref = "mods/evil"
    recipe = checkout / "recipes" / "r.yaml"
    recipe.write_text(f'recipe_version: "1"\nname: r\ncontainer: img\ncommand: vllm serve m\nmods: ["{ref}"]\n')
    plan = make_plan(load_recipe(recipe), "solo", CLUSTER)
    assert plan.mod_origins == (f"outside the recipe's checkout: {outside}",)
    assert plan.untrusted == (f"mod {ref} (outside the recipe's checkout: {outside}): its run.sh runs as root in "
                              "the container",)


def test_a_mod_inside_the_checkout_or_named_on_the_command_line_is_not_asked(tmp_path):
    checkout = tmp_path / "svd"
    (checkout / "recipes").mkdir(parents=True)
    (checkout / "run-recipe.sh").write_text("# the runner\n")
    (checkout / "mods" / "ok").mkdir(parents=True)
    (checkout / "mods" / "ok" / "run.sh").write_text("true\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "run.sh").write_text("true\n")
    recipe = checkout / "recipes" / "r.yaml"
    recipe.write_text('recipe_version: "1"\nname: r\ncontainer: img\ncommand: vllm serve m\nmods: [mods/ok]\n')
    plan = make_plan(load_recipe(recipe), "solo", CLUSTER, {"apply_mods": [str(mine)]})
    assert plan.untrusted == () and plan.mod_origins == (f"checkout {checkout}", "--apply-mod (this command line)")


def test_the_cli_asks_or_takes_trust(state, registry, capsys, monkeypatch):
    from sparkconsole.cli import main
    Registries.load().add(f"file://{registry}", name="thirdparty")
    cluster = state / "c.yaml"
    cluster.write_text("nodes:\n  - {name: spark1, address: 127.0.0.1}\n")
    # no terminal, no --trust: refused before anything touches the node
    rc = main(["--cluster", str(cluster), "recipe", "launch", "@thirdparty/r", "-T", "solo", "--offline", "--yes",
               "--force"])
    err = capsys.readouterr().err
    assert rc == 2 and "2 item(s) need confirmation, first: pre_exec[0]" in err and "--trust" in err
    from sparkconsole.commands.recipe import _confirm_trust

    class Args:
        trust = True
    plan = make_plan(find_recipe("@thirdparty/r"), "solo", ClusterConfig(
        nodes=(NodeConfig(name="spark1", address="127.0.0.1"),), endpoints=(), source="c"))
    assert _confirm_trust(Args(), plan).trusted
    Args.trust = False
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    with pytest.raises(UserError, match="not confirmed"):
        _confirm_trust(Args(), plan)
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert _confirm_trust(Args(), plan).trusted
