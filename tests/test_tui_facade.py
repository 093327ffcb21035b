"""The console's screens and widgets reach the console only through its facade (tui/facade.py), and the facade
answers what the app holds."""

from __future__ import annotations

import ast
from pathlib import Path

from sparkconsole.tui.facade import ConsoleFacade
from tests.helpers import wait_for
from tests.test_tui_app import SIZE, make_app, recording  # noqa: F401  (recording: a fixture)

TUI = Path(__file__).resolve().parent.parent / "sparkconsole" / "tui"
# Textual's own App API that a widget uses as a widget, not the console's
TEXTUAL_APP_API = {"get_key_display", "simulate_key", "bell"}


def reaches(path: Path) -> list[str]:
    """Each use of `self.app` in a file other than `self.app.<Textual's own API>`, as 'line: source'."""
    tree = ast.parse(path.read_text())
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in TEXTUAL_APP_API and _is_self_app(node.value):
            allowed.add(id(node.value))
    return [f"{path.name}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
            if _is_self_app(node) and id(node) not in allowed]


def _is_self_app(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "app" and isinstance(node.value, ast.Name) \
        and node.value.id == "self"


def test_screens_and_widgets_reach_the_console_only_through_its_facade():
    found = [r for d in ("screens", "widgets") for p in sorted((TUI / d).glob("*.py")) for r in reaches(p)]
    assert found == [], "use self.facade (tui/facade.py) instead of:\n" + "\n".join(found)


def test_the_check_sees_a_reach():
    """The walk above finds what it is meant to (a reach through getattr, an alias, a plain attribute)."""
    import tempfile
    src = ("class S:\n    def f(self):\n        a = self.app\n        getattr(self.app, 'read_only', False)\n"
           "        self.app.cluster\n        self.app.bell()\n")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(src)
    try:
        assert len(reaches(Path(fh.name))) == 3
    finally:
        Path(fh.name).unlink()


async def test_the_facade_answers_what_the_app_holds(recording):  # noqa: F811
    app, _, mon = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.core is not None and all(nm.last for nm in mon.nodes.values()),
                       what="the nodes' first readings")
        f = app.facade
        assert isinstance(f, ConsoleFacade)
        assert (f.cluster, f.simulated, f.read_only, f.replay_at) == (app.cluster, app.simulated, app.read_only, None)
        assert f.monitor is mon and f.node_monitor("spark1") is mon.nodes["spark1"]
        assert f.recorder is None and f.events is app.dashboard.events
        assert f.workloads() == [] and f.chosen_workload() is None and f.launched_plan("any") is None
        assert f.node_facts().mem == app.node_facts().mem and f.thermal_note() == app.thermal_note()
        f.restart_stages = {("spark1", "vllm_node"): "draining"}
        assert app.restart_stages == {("spark1", "vllm_node"): "draining"}
        f.show("logs")
        await wait_for(pilot, lambda: app.current_mode == "logs", what="the logs screen")
        await pilot.press("q")
