"""One guard, one severity everywhere (issue 39; issue 41 item 2): the recorded session's node has
vm.overcommit_memory=1 (bad: refuses a launch) and a small vm.min_free_kbytes (a warning). The dashboard's
checklist, `sparkconsole status`, the recipes screen and `recipe lint` draw each the same way, with the same fix,
because severity.py decides it once."""

from __future__ import annotations

from sparkconsole import severity
from sparkconsole.commands.status import node_record, render_table
from sparkconsole.launch.lint import preflight
from sparkconsole.nodes.guard import GuardResult
from sparkconsole.recipes import find_recipe
from tests.helpers import wait_for
from tests.test_tui_app import make_app, recording, state_dir, widget_text  # noqa: F401  (fixtures)

TITLES = {"overcommit": "vm.overcommit_memory=0", "min_free": "vm.min_free_kbytes ≥ 1.5 GiB"}
WANT = {"overcommit": severity.REFUSE, "min_free": severity.WARN}


def test_a_guard_s_state_is_its_severity_and_fix():
    g = GuardResult("page_cache", "Page cache dropped before load", "warn", "40 GiB", "sync && echo 3 | sudo tee x")
    assert severity.of_guard(g) is severity.WARN and severity.preflight_of_guard(g) == "warn"
    assert severity.guard_fix(g) == "sync && echo 3 | sudo tee x (or launch with --drop-caches, which drops it on " \
                                    "each node before the model loads)"
    assert severity.preflight_of_guard(GuardResult("swap", "Swap off", "unknown", "could not read")) == "warn"
    assert severity.of_guard(GuardResult("swap", "Swap off", "unknown", "could not read")).mark == "?"
    assert severity.preflight_of_guard(GuardResult("swap", "Swap off", "ok", "")) is None
    assert severity.named("nonsense") is severity.WARN            # never silently ok
    assert severity.worst([]) is severity.OK


async def test_one_guard_one_severity_on_every_view(recording):
    app, _, mon = make_app(recording)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: all(nm.last for nm in mon.nodes.values()), what="readings")
        await pilot.pause(0.4)
        nm = mon.nodes["spark1"]
        guards = {g.key: g for g in app.guards_for(nm)}
        assert {k: severity.of_guard(guards[k]) for k in WANT} == WANT

        # the dashboard's checklist
        rows = {}
        checklist = app.dashboard.panels["spark1"]._checklist
        for i in range(checklist.option_count):
            text = str(checklist.get_option_at_index(i).prompt)
            rows[checklist.get_option_at_index(i).id] = text
        for key, sev in WANT.items():
            assert rows[key].startswith(f"{sev.mark} {TITLES[key]}:"), rows[key]

        # `sparkconsole status`
        table = render_table([node_record(nm)])
        assert "✗ overcommit, ! min_free" in table
        for key, sev in WANT.items():
            assert f"spark1: {sev.mark} {TITLES[key]} — {sev.says}:" in table
            assert f"    fix: {severity.guard_fix(guards[key])}" in table

        # `recipe lint` (the facts the console has)
        found = [f for f in preflight(find_recipe("llama-3.1-8b"), "solo", app.cluster.nodes, app.node_facts())
                 if f.rule == "oom_guards" and f.node == "spark1"]
        for key, sev in WANT.items():
            [f] = [f for f in found if f.message.startswith(TITLES[key])]
            assert f.line().startswith(f"{sev.name.upper()} oom_guards: [spark1] {TITLES[key]}")
            assert f.fix == severity.guard_fix(guards[key])

        # the recipes screen
        await pilot.press("2")
        scr = app.recipes_screen
        await wait_for(pilot, lambda: scr.is_mounted and scr.selected is not None, what="the recipes")
        scr.choose(next(r for k, r in scr.recipe_choices() if k == "llama-3.1-8b"))
        await pilot.pause(0.3)
        head = widget_text(scr.query_one("#recipe-head"))
        for key, sev in WANT.items():
            assert f"{sev.mark} spark1: {TITLES[key]}:" in head, head
        await pilot.press("q")
