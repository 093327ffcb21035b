"""Issue 24, a newcomer's first hour: each key does what it says, on the screens a recorded H100 session feeds
(real NVML readings replayed through the real monitor), and the CLI answers odd input in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sparkconsole.bench.results import LevelKey, LevelResult, ResultsStore
from sparkconsole.config import EndpointConfig
from sparkconsole.tui.screens.confirm import ConfirmScreen
from sparkconsole.tui.screens.help import HelpScreen
from sparkconsole.tui.widgets.key_bar import KeyBar
from tests.helpers import free_port, wait_for
from tests.test_tui_app import SIZE, make_app, recording, state_dir, widget_text  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkconsole", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=timeout)


# --- 1. the dashboard's filter ---------------------------------------------------------------------------------
async def test_a_filter_that_matches_nothing_says_so_and_escape_brings_every_node_back(recording):
    app, _, _ = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.dashboard.complete(), what="the dashboard")
        await pilot.press("slash", "z", "z", "z")
        await wait_for(pilot, lambda: not any(p.display for p in app.dashboard.panels.values()), what="no panel")
        await pilot.pause(0.1)
        assert "no node matches 'zzz'" in widget_text(app.dashboard.query_one("#nodes"))
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert app.is_running and app.return_code is None          # the console used to exit with a traceback
        assert all(p.display for p in app.dashboard.panels.values())
        assert not app.dashboard.query_one("#node-nomatch").display
        assert app.focused is app.dashboard.panels["spark1"]
        await pilot.press("q")


async def test_a_filter_that_looks_like_markup_is_shown_as_typed(recording):
    # the long key fuzz found it: `[/` in the filter ended the console with a MarkupError
    app, _, _ = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.dashboard.complete(), what="the dashboard")
        await pilot.press("slash", "left_square_bracket", "slash", "x")
        await wait_for(pilot, lambda: not any(p.display for p in app.dashboard.panels.values()), what="no panel")
        await pilot.pause(0.1)
        assert app.is_running and "no node matches '[/x'" in widget_text(app.dashboard.query_one("#nodes"))
        await pilot.press("escape", "q")


# --- 2. the recipes screen acts only on what it shows ----------------------------------------------------------
async def test_the_recipe_filter_moves_the_detail_and_enter_never_acts_on_a_hidden_recipe(recording):
    app, _, _ = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        scr = app.recipes_screen
        await wait_for(pilot, lambda: scr.is_mounted and scr.selected is not None, what="the recipes")
        assert scr.selected != "tiny-testbed"
        await pilot.press("slash", *"tiny")
        await wait_for(pilot, lambda: scr.listed == ["tiny-testbed"], what="the filtered list")
        await pilot.pause(0.1)
        assert scr.selected == "tiny-testbed"
        assert "Tiny Llama" in widget_text(scr.query_one("#recipe-head"))
        await pilot.press("tab", "enter")
        await pilot.pause(0.2)
        if isinstance(app.screen, ConfirmScreen):                   # preflight may let it through: then it is this one
            assert "tiny-testbed" in app.screen.title_text
            await pilot.press("n")
        # nothing matches: the detail says so and Enter launches nothing
        await pilot.press("slash", "ctrl+u", *"qqq")
        await wait_for(pilot, lambda: scr.listed == [], what="an empty list")
        await pilot.pause(0.1)
        assert scr.selected is None and "no recipe matches 'qqq'" in widget_text(scr.query_one("#recipe-head"))
        await pilot.press("tab", "enter")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ConfirmScreen)
        scr.action_launch()
        await pilot.pause(0.1)
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("q")


# --- 4. bench: b asks first, with its levels ---------------------------------------------------------------------
def bench_app(recording, url: str):
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.nodes.replay import replay_factory
    from sparkconsole.tui.app import SparkConsoleApp
    from tests.test_tui_app import cluster

    cfg = cluster(1, endpoints=[EndpointConfig("sim", url, kind="vllm")])
    mon = ClusterMonitor(cfg, transport_factory=replay_factory(lambda n: recording, interval=0.1))
    return SparkConsoleApp(cfg, monitor=mon)


async def test_b_opens_the_sweep_setup_and_nothing_is_sent_until_enter(recording, tmp_path, monkeypatch):
    from sparkconsole.tui.screens.bench_setup import BenchSetupScreen
    monkeypatch.chdir(tmp_path)
    app = bench_app(recording, f"http://127.0.0.1:{free_port()}")     # nothing listens there
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        bench = app.bench_screen
        await wait_for(pilot, lambda: bench.is_mounted, what="the bench screen")
        await pilot.press("b")
        await wait_for(pilot, lambda: isinstance(app.screen, BenchSetupScreen), what="the setup")
        assert app.screen.query_one("#bench-concurrency").value == "1,2,4,8,16,32,64"
        assert "runs/bench.sqlite (in the working directory)" in widget_text(app.screen.query_one("#bench-setup-detail"))
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert bench.sweep_worker is None
        await pilot.press("b")
        await wait_for(pilot, lambda: isinstance(app.screen, BenchSetupScreen), what="the setup again")
        await pilot.press("ctrl+u", *"1,4", "tab", "ctrl+u", "0", "enter")
        await pilot.pause(0.1)
        assert "runs: a whole number" in widget_text(app.screen.query_one("#bench-setup-error"))
        await pilot.press("ctrl+u", "2", "enter")
        await wait_for(pilot, lambda: bench.sweep_worker is not None and not bench.sweep_worker.is_running,
                       what="the sweep to end")
        assert (bench.concurrency, bench.runs) == ((1, 4), 2)
        status = widget_text(bench.query_one("#bench-status"))
        assert "cannot connect to" in status and "Error" not in status
        assert not (tmp_path / "runs" / "bench.sqlite").exists()     # no empty run recorded
        await pilot.press("q")


def level(run_id: str, label: str, c: int, decode: float = 50.0) -> LevelResult:
    return LevelResult(run_id=run_id, label=label, key=LevelKey(1024, 128, 0, c), runs=1,
                       metrics={"tg_throughput": {"mean": decode}, "pp_throughput": {"mean": 900.0},
                                "e2e_ttft": {"mean": 300.0}, "requests_ok": c, "requests_failed": 0})


def store_with(path: Path, runs: dict[str, list[int]]) -> list[str]:
    ids = []
    with ResultsStore(path) as store:
        for label, levels in runs.items():
            run_id, _ = store.begin_run(source="sparkconsole", label=label, spec={"label": label}, model="m")
            for c in levels:
                store.record_level(level(run_id, label, c))
            if levels:
                store.finish_run(run_id)
            ids.append(run_id)
    return ids


async def test_p_does_not_overlay_the_run_on_screen_as_past(recording, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old, new = store_with(tmp_path / "runs" / "bench.sqlite", {"older": [1, 2], "just-now": [1, 2]})
    app = bench_app(recording, "http://127.0.0.1:9")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        bench = app.bench_screen
        await wait_for(pilot, lambda: bench.is_mounted, what="the bench screen")
        with ResultsStore(tmp_path / "runs" / "bench.sqlite") as store:
            for lv in store.levels(new):
                bench.add_level(lv)                   # the sweep that just finished, drawn as its line
        await pilot.press("p")
        await pilot.pause(0.2)
        past = {s.label.split(" ")[0] for s in bench.charts()["decode"].series.values() if s.style == "past"}
        assert past == {"older"}
        await pilot.press("q")


def test_report_leaves_out_a_stopped_run_and_advise_with_one_run_names_no_runner_up(tmp_path):
    from sparkconsole.bench import report
    from sparkconsole.bench.advisor import advise, markdown
    store_with(tmp_path / "r.sqlite", {"solo": [1, 2, 4], "stopped": []})
    with ResultsStore(tmp_path / "r.sqlite") as store:
        text = report.markdown(store)
        levels = store.levels()
    assert "## solo" in text and "## stopped" not in text and "unfinished" not in text
    assert "Stopped before a level finished, nothing measured: stopped" in text
    advice = markdown(advise(levels))
    assert "runner-up" not in advice and "best decode" not in advice and "Only solo was measured" in advice


def test_the_eta_of_a_sweep_is_not_proportional_to_concurrency():
    """A decode-bound sweep: each batch takes about as long as the last, whatever its concurrency. The first ETA
    (after one c1 batch) of c1…c64 × 4 batches used to count a c64 batch as 64 c1 batches: 31 min for 28 s."""
    from sparkconsole.bench.sweep import BatchClock
    clock = BatchClock()
    clock.add(1, 1.0)
    remaining = [c for c in (1, 2, 4, 8, 16, 32, 64) for _ in range(4)][1:]
    assert clock.left(remaining) == len(remaining)
    for c, t in ((1, 1.0), (1, 1.0), (1, 1.0), (2, 1.1)):
        clock.add(c, t)
    # a + b·c fitted on what was timed: growing with concurrency, never below the fastest batch
    assert 1.0 <= clock.predict(1) < clock.predict(64) < 64


# --- 5. REPLAY reads everything from the recording, and acts on nothing ------------------------------------------
async def test_scrubbed_back_the_guards_come_from_the_recording_and_nothing_is_offered(recording, tmp_path):
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.nodes.replay import replay_factory
    from sparkconsole.tui.app import SparkConsoleApp
    from tests.test_tui_app import cluster

    cfg = cluster(1)
    live = ClusterMonitor(cfg, transport_factory=replay_factory(lambda n: recording, interval=0.05))
    app = SparkConsoleApp(cfg, monitor=live, record=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.recorder is not None and len(live.nodes["spark1"].history) >= 10,
                       what="ticks recorded")
        panel = app.dashboard.panels["spark1"]
        live_guards = {g.key: g.status for g in panel._checklist.results}
        assert "Fix guard" in [k.description for k in app.dashboard.query_one(KeyBar).keys]
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: app.monitor is not live and app.node_monitor("spark1").last is not None,
                       what="a replayed tick")
        await wait_for(pilot, lambda: "REPLAY" in str(panel.border_subtitle), what="REPLAY on the panel")
        await pilot.pause(0.5)
        text = widget_text(panel)
        assert "could not read /proc/swaps" not in text and "LIVE" not in str(panel.border_subtitle)
        assert {g.key: g.status for g in panel._checklist.results} == live_guards
        keys = [k.description for k in app.dashboard.query_one(KeyBar).keys]
        assert "Restart vLLM" not in keys and "Fix guard" not in keys
        panel.focus()
        await pilot.press("r", "f", "enter")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ConfirmScreen)
        app.confirm_container("spark1", "restart")            # the palette's way in: refused too
        await pilot.pause(0.1)
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: app.monitor is live, what="live again")
        await pilot.press("q")


# --- 6. console --at -15m --------------------------------------------------------------------------------------
def test_console_at_a_negative_relative_time_parses(monkeypatch):
    from sparkconsole import cli
    from sparkconsole.commands import console
    seen = {}
    monkeypatch.setattr(console, "run", lambda args: seen.setdefault("at", args.at) and 0)
    assert cli.main(["console", "--at", "-15m"]) == 0
    assert seen["at"] == "-15m"
    from sparkconsole.commands import postmortem
    monkeypatch.setattr(postmortem, "run", lambda args: seen.__setitem__("pm", args.at) or 0)
    assert cli.main(["postmortem", "spark1", "--at", "-2h"]) == 0 and seen["pm"] == "-2h"


# --- 7. the guard fix is one key away ---------------------------------------------------------------------------
async def test_enter_or_f_on_a_node_asks_to_fix_its_first_bad_guard(recording):
    app, _, mon = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        panel = app.dashboard.panels["spark1"]
        await wait_for(pilot, lambda: any(r.status != "ok" for r in panel._checklist.results), what="a guard not ok")
        assert "Fix guard" in [k.description for k in app.dashboard.query_one(KeyBar).keys]
        assert app.focused is panel
        wanted = next(r for r in panel._checklist.results if r.status in ("bad", "warn") and r.fix)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the fix's confirmation")
        assert app.screen.title_text == f"Fix '{wanted.title}' on spark1?" and app.screen.command == wanted.fix
        await pilot.press("n")
        await pilot.press("f")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the same, from f")
        await pilot.press("n")
        await pilot.press("q")


# --- 8. text status shows what --json shows ---------------------------------------------------------------------
def test_status_text_shows_the_agents_docker_error():
    from sparkconsole.commands.status import render_table
    err = "docker: permission denied while trying to connect to the Docker daemon socket"
    rec = {"name": "spark1", "address": "127.0.0.1", "local": True, "state": "LIVE", "since": 0, "error": None,
           "bad_lines": 0, "reboots": 0, "info": None, "containers": [], "guards": [],
           "tick": {"gpus": [], "mem": None, "errors": [err]}}
    assert f"spark1: {err}" in render_table([rec])


# --- 9. a bench against nothing -----------------------------------------------------------------------------------
def test_bench_run_against_a_closed_port_says_so_in_one_line_and_records_nothing(tmp_path):
    port = free_port()
    for extra in ((), ("--model", "foo")):
        r = cli("bench", "run", "--url", f"http://127.0.0.1:{port}", *extra, "--results", str(tmp_path / "b.sqlite"))
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"cannot connect to http://127.0.0.1:{port}" in lines[0], r.stderr
        assert "ClientConnectorError" not in r.stderr and "lists no model" not in r.stderr
    assert not (tmp_path / "b.sqlite").exists()


# --- 10. the small words -----------------------------------------------------------------------------------------
async def test_help_lists_every_key_the_readme_promises(recording):
    app, _, _ = make_app(recording)
    async with app.run_test(size=(120, 60)) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        await pilot.pause(0.1)
        text = widget_text(app.screen.query_one("#help"))
        assert "m / i" in text and "copy the plan's model / image" in text
        assert "f or enter" in text
        await pilot.press("escape", "q")


def test_demo_help_says_the_number_and_counts_read_right():
    from sparkconsole.commands.demo import RUNAWAY_AFTER_S
    from sparkconsole.tui.fmt import plural
    r = cli("demo", "--help")
    assert "RUNAWAY_AFTER_S" not in r.stdout and f"{RUNAWAY_AFTER_S:g} seconds" in r.stdout
    assert (plural(1, "line"), plural(2, "line"), plural(1, "past run")) == ("1 line", "2 lines", "1 past run")


def test_in_the_way_names_the_launch_a_container_belongs_to():
    from sparkconsole.nodes.launches import in_the_way
    from sparkconsole.nodes.samples import ContainerInfo

    labels = (("sparkconsole.recipe", "gpt-oss-120b"), ("sparkconsole.topology", "2x-solo"),
              ("sparkconsole.role", "server"), ("sparkconsole.node", "spark1"))
    node = type("N", (), {"name": "spark1", "containers": (ContainerInfo("vllm_node", state="running", labels=labels),
                                                           ContainerInfo("other", state="exited"))})()
    hits = in_the_way([node], [("spark1", "vllm_node"), ("spark1", "other"), ("spark2", "vllm_node")])
    assert [(h.node, h.container) for h in hits] == [("spark1", "vllm_node")]
    assert hits[0].words() == "container vllm_node is running (gpt-oss-120b × 2x-solo)"
    assert json.dumps(hits[0].group.key) == '"gpt-oss-120b:2x-solo"'


# --- found by the fuzzer: at 100×30 a long preflight pushed the plan (focusable) below the terminal's edge ---------
async def test_the_plan_stays_on_screen_at_100x30_whatever_preflight_says(recording):
    app, _, _ = make_app(recording)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: all(nm.last for nm in app.monitor.nodes.values()), what="readings")
        await pilot.press("2")
        scr = app.recipes_screen
        await wait_for(pilot, lambda: scr.is_mounted and scr.selected is not None, what="the recipes")
        await pilot.pause(0.2)
        head = widget_text(scr.query_one("#recipe-head"))
        assert head.count("✗") + head.count("!") >= 2                 # a long preflight: it must not take it all
        plan = scr.query_one("#plan-scroll")
        region = app.screen.find_widget(plan).region
        assert region.bottom <= 30 - 1 and region.height >= 5, region  # above the key bar, rows of the plan shown
        await pilot.press("tab", "tab")
        if app.focused is not None:
            assert app.screen.find_widget(app.focused).region.bottom <= 30
        await pilot.press("q")


def test_a_row_that_must_drop_parts_drops_a_label_or_separator_with_its_figure():
    """A narrow node panel showed 'Workloads vllm_node 89.4 GiB (…) ·' (the second workload's separator left
    before nothing) and could show '  SM ' without its clock: neighbouring parts of one priority go together."""
    from sparkconsole.tui.fmt import fit
    workloads = [("Workloads ", "", 0), ("vllm_node ", "", 0), ("89.4 GiB", "", 0), (" (GPU 85.2 + CPU 4.2)", "", 1),
                 (" · ", "", 2), ("vllm_node_router ", "", 2), ("0.5 GiB", "", 2), (" (GPU 0.0 + CPU 0.5)", "", 3)]
    for width in range(20, 90):
        text = fit(workloads, width).plain
        assert not text.rstrip().endswith("·"), (width, text)
        assert ("vllm_node_router" in text) == ("0.5 GiB" in text), (width, text)
    power = [("Power ", "", 0), ("52 W", "", 0), ("  SM ", "", 2), ("3003 MHz", "", 2), ("  Util ", "", 1),
             ("96%", "", 1)]
    assert fit(power, 30).plain == "Power 52 W  Util 96%"
    assert fit(power, 12).plain == "Power 52 W"
    # parts of one priority apart from each other still go one at a time, the last first
    row = [("a", "", 0), ("bb", "", 1), ("c", "", 0), ("dd", "", 1)]
    assert fit(row, 4).plain == "abbc"


async def test_the_recipes_screen_shows_each_fix_whole_and_cuts_a_message_only_at_a_word(recording):
    """A fix cut at 120 characters ('… --prefer '"'"'(^|/)(vllm|VLLM::.*|') is not a fix: copied, it half-runs.
    Messages past 220 characters (now 400) were cut mid-word ('the node runs ou — fix: …'); they end at a word, with ' …'.
    (The recorded H100s raise no finding that long: one as long as the demo's budget and earlyoom findings is
    added to what preflight found for the selected recipe.)"""
    from sparkconsole.tui.screens.recipes_running import _Finding
    app, _, _ = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(nm.last for nm in app.monitor.nodes.values()), what="readings")
        await pilot.press("2")
        scr = app.recipes_screen
        await wait_for(pilot, lambda: scr.is_mounted and scr.selected is not None and scr.topology is not None,
                       what="the recipes")
        findings = scr.preflight(scr._recipe(scr.selected), scr.topology)
        message = ("gpu_memory_utilization 0.7 × 121.7 GiB = 85.2 GiB, over the node's budget of 24.3 GiB (MemTotal "
                   "121.7 − 8.0 reserve (headroom floor + vm.min_free_kbytes) − 89.4 held by other workloads "
                   "(vllm_node 89.4)): the node runs out of memory while the model loads, and a GB10 that runs out "
                   "of memory freezes whole: nothing answers, not even SSH, until it is power-cycled at the wall, so "
                   "this launch is refused before anything starts")
        fix = ("sudo apt-get install -y earlyoom && printf 'EARLYOOM_ARGS=\"%s\"\\n' '-r 3600 -M 3145728 --prefer "
               "(^|/)(vllm|VLLM::.*|sglang)' | sudo tee /etc/default/earlyoom && sudo systemctl restart earlyoom")
        findings.append(_Finding("refuse", message, node="node1", fix=fix))
        scr._show()
        await pilot.pause(0.2)
        head = scr.query_one("#recipe-head").render().plain
        for f in findings:
            if getattr(f, "fix", None):
                assert f" — fix: {' '.join(f.fix.split())}\n" in head, (f.fix, head)
            said = " ".join(f.message.split())
            if said not in head:
                shown = next(line for line in head.splitlines() if said[:40] in line).split(" — fix: ")[0]
                shown = shown[shown.index(said[:40]):]
                # cut where a word ends, and said so
                assert shown.endswith(" …") and said.startswith(shown[:-2]) and said[len(shown) - 2] == " ", shown
        assert len(message) > 400 and " ".join(message.split()) not in head, head
        await pilot.press("q")
