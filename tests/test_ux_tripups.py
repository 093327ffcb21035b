"""Issue 39, the console: small terminals (what each size shows, docs/UX.md), the command palette as every action,
and a recorded moment judged at its own time. On the screens a recorded H100 session feeds (its node has
vm.overcommit_memory=1, a guard that refuses a launch, and a small min_free_kbytes, a warning)."""

from __future__ import annotations

import json
import re

import pytest

from sparkconsole.config import NodeConfig, Thresholds
from sparkconsole.nodes.monitor import NodeMonitor
from sparkconsole.nodes.view import node_view
from tests.helpers import wait_for
from tests.screen import screen_lines, screen_text
from tests.test_tui_app import make_app, recording, state_dir  # noqa: F401  (fixtures)

SIZES = ((80, 24), (100, 30), (160, 48), (220, 60))
# a figure cut by an ellipsis: a digit, or a decimal point, right before it ("p95 96…", "17.…")
CUT_FIGURE = re.compile(r"[\d.]…")


def grid(lines: list[str]) -> str:
    return "\n".join(lines)


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_what_each_size_shows(recording, size):
    app, _, mon = make_app(recording)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: all(len(nm.history) >= 3 for nm in mon.nodes.values()), what="readings")
        # the BAD guards' alerts raised, their toasts up (two of them covered spark2's panel at 80×24)
        await wait_for(pilot, lambda: app.dashboard.events.count >= 2, what="the alerts")
        await pilot.pause(0.6)
        lines = screen_lines(app)
        text = grid(lines)
        # the key bar keeps Help, Quit and the Events key with their words, at every width
        bar = lines[-1]
        for words in ("e Events", "? Help", "q Quit"):
            assert words in bar, (size, bar)
        # every node's guard that refuses a launch is on screen (80×24 scrolled spark2's swap out of view)
        assert text.count("✗ vm.overcommit_memory=0") == 2, text
        # no pressure label without its value, no figure cut short
        assert not re.search(r"PSI(?! \d)", text), text
        assert not CUT_FIGURE.search(text), [ln for ln in lines if CUT_FIGURE.search(ln)]
        short = size[1] < 40
        assert ("╭─ Events" in text) is not short          # the pane itself where there is room for it
        # `e`: the Events pane at any size, over the nodes; escape brings the nodes back
        await pilot.press("e")
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "╭─ Events" in text and "╭─ Nodes" not in text, text
        await pilot.press("escape")
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "╭─ Nodes" in text and text.count("✗ vm.overcommit_memory=0") == 2
        assert app.focused in app.dashboard.panels.values()
        await pilot.press("q")


async def test_e_reaches_the_events_from_another_screen(recording):
    app, _, mon = make_app(recording)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: all(nm.last for nm in mon.nodes.values()), what="readings")
        app.dashboard.events.note("a restart's progress, say")
        await pilot.press("2")
        await wait_for(pilot, lambda: app.current_mode == "recipes", what="the recipes")
        await pilot.press("e")
        await wait_for(pilot, lambda: app.current_mode == "dashboard" and app.dashboard.events_only, what="events")
        await pilot.pause(0.3)
        assert "a restart's progress, say" in screen_text(app)
        await pilot.press("e")
        await pilot.pause(0.2)
        assert not app.dashboard.events_only
        await pilot.press("q")


PALETTE_WORDS = {"fix": "node.fix", "guard": "node.fix", "swap": "node.fix", "replay": "app.scrub",
                 "model": "recipes.copy_model", "image": "recipes.copy_image", "topology": "recipes.next_topology",
                 "launch": "recipes.launch", "filter": "dashboard.filter"}


async def test_the_palette_is_every_action(recording):
    from textual.fuzzy import Matcher
    app, _, mon = make_app(recording)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: all(nm.last for nm in mon.nodes.values()), what="readings")
        cmds = app.palette_commands()
        for word, action in PALETTE_WORDS.items():
            # what the palette's own fuzzy matcher finds for the word: an entry for that action
            m = Matcher(word)
            assert any(c.action == action and m.match(c.title) > 0 for c in cmds), (word, action)
        # Quit and Help once each, with Textual's own entries
        system = [c.title for c in app.get_system_commands(app.screen)]
        titles = [c.title for c in cmds] + system
        assert sum(t in ("Quit", "Quit the application") for t in titles) == 1
        assert sum(t.startswith("Help") or t == "Keys" for t in titles) == 1, titles
        # every node's guards by their own names
        assert any(c.title.startswith("spark2: Fix guard (OOM) ✗ vm.overcommit_memory=0") for c in cmds)
        await pilot.press("q")


async def test_a_recipe_entry_opens_that_recipe(recording):
    app, _, mon = make_app(recording)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: all(nm.last for nm in mon.nodes.values()), what="readings")
        await pilot.press("2")
        scr = app.recipes_screen
        await wait_for(pilot, lambda: scr.is_mounted and scr.selected is not None, what="the recipes")
        await pilot.press("1")
        # a filter left on the recipes screen would hide it; a running launch would take the selection back
        scr._pick_running = True
        [entry] = [c for c in app.palette_commands() if c.title == "Recipe: tiny-testbed"]
        entry.run()
        await wait_for(pilot, lambda: app.current_mode == "recipes", what="the recipes screen")
        await pilot.pause(0.3)
        assert scr.selected == "tiny-testbed" and not scr._pick_running
        scr.launches_changed()          # what a launch coming or going does
        assert scr.selected == "tiny-testbed"
        await pilot.press("q")


def test_a_recorded_moment_is_judged_at_its_own_time():
    # Issue 39: in a replay the container's uptime stayed live. Its age is counted to the replayed tick.
    nm = NodeMonitor(NodeConfig(name="n1", address="127.0.0.1"), None, interval=0.5, history=8)
    nm.handle_line(json.dumps({"type": "hello", "hostname": "n1", "interval_s": 0.5, "time": 1000.0, "gpus": []}))
    nm.handle_line(json.dumps({"type": "tick", "seq": 1, "time": 1_700_000_100.0, "containers": [
        {"name": "vllm_node", "state": "running", "started_at": "2023-11-14T22:13:20Z", "restart_count": 0}]}))
    live = node_view(nm, [], now=1_700_009_000.0, thresholds=Thresholds())
    past = node_view(nm, [], now=1_700_009_000.0, thresholds=Thresholds(), replay=True)
    assert live.container.up_s == pytest.approx(9000.0) and past.container.up_s == pytest.approx(100.0)
    assert past.state.label == "REPLAY" and live.state.label == "LIVE"


async def test_the_events_pane_wraps_again_at_a_new_width(recording):
    # The walk at 80×24: a line written at 100 columns kept that wrap, its URL cut at the pane's edge.
    app, _, mon = make_app(recording)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: all(nm.last for nm in mon.nodes.values()), what="readings")
        app.dashboard.events.note("sim: router litellm-simple-shuffle starting at http://127.0.0.2:4000 " + "x" * 60)
        await pilot.resize_terminal(80, 24)
        await pilot.press("e")
        await pilot.pause(0.5)
        text = screen_text(app)
        assert "http://127.0.0.2:4000" in text, text
        await pilot.press("q")


def test_the_workloads_row_keeps_each_figure_whole():
    # The walk's replay at 80×24: "Workloads  · PID 31555 vllm 1.9" — a separator before nothing, the figure cut.
    from sparkconsole.nodes.samples import GpuProcess
    from sparkconsole.nodes.view import NodeView, StateView
    from sparkconsole.tui.widgets.node_panel import NodePanel

    class Narrow(NodePanel):
        def _width(self, row: str) -> int | None:
            return 28
    v = NodeView(state=StateView("LIVE", "green", None, None, None), gpu_name=None, simulated=False, gpu=None,
                 no_gpu=None, gpu_error=None, guards=(), container_name="vllm_node", container=None, at=0.0,
                 loose=(GpuProcess(pid=31555, gpu=0, used_b=2 * 2**30, comm="vllm"),), read=True)
    text = Narrow("n1", "vllm_node")._workloads_line(v, None).plain
    assert text == "Workloads PID 31555 2.0 GiB", text
