"""Pilot tests of the console: every key, fed by a recorded session (real H100 NVML readings replayed through the
real ClusterMonitor and its line parsing), checked against what the screen shows."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sparkconsole import audit
from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.nodes.replay import read_recording, replay_factory, split_recording
from sparkconsole.nodes.samples import REASON_WORDS, NodeState, reasons_from_mask
from sparkconsole.tui.app import SparkConsoleApp
from sparkconsole.tui.screens.confirm import ConfirmScreen
from sparkconsole.tui.screens.help import HelpScreen
from sparkconsole.tui.widgets.sim_badge import SimBadge
from tests.helpers import recorded_vllm_endpoint, wait_for
from tests.screen import screen_text, widget_text  # noqa: F401  (imported from here by other test modules)

RECORDING = Path(__file__).parent / "fixtures" / "agent-h100-load.jsonl"
SIZE = (120, 40)


def cluster(n: int = 2, endpoints=()) -> ClusterConfig:
    nodes = tuple(NodeConfig(name=f"spark{i + 1}", address="127.0.0.1", role="head" if i == 0 else "worker")
                  for i in range(n))
    return ClusterConfig(nodes=nodes, endpoints=tuple(endpoints), source="test-cluster.yaml")


@pytest.fixture
def recording() -> list[str]:
    return read_recording(RECORDING)


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def make_app(recording, n=2, *, simulated=False, **kw):
    cfg = dataclasses.replace(cluster(n), simulated=simulated)
    factory = replay_factory(lambda node: recording, interval=kw.pop("interval", 0.05), **kw)
    mon = ClusterMonitor(cfg, transport_factory=factory)
    return SparkConsoleApp(cfg, monitor=mon), factory, mon


async def test_dashboard_draws_the_recorded_readings(recording):
    app, factory, mon = make_app(recording)
    _, ticks = split_recording(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(len(nm.history) >= 12 for nm in mon.nodes.values()), what="12 ticks")
        await pilot.pause(0.4)   # one redraw period
        nm = mon.nodes["spark1"]
        panel = app.dashboard.panels["spark1"]
        text = widget_text(panel)
        # The temperature shown is the latest parsed tick's, and the thresholds are the recording's.
        recorded_temps = {t["gpus"][0]["temp_c"] for t in ticks}
        shown = int(text.split("GPU ", 1)[1].split("°C", 1)[0])
        assert shown in recorded_temps
        assert f"slowdown {ticks[0]['gpus'][0]['slowdown_c']}°C" in text
        # Throttle reasons in words, as a recorded mask says: one of the last ticks', since the panel redraws
        # every 0.4 s while ticks come every 0.05 s (under load, nm.last had moved past the drawn one).
        def says(mask: int) -> bool:
            words = [REASON_WORDS[r] for r in reasons_from_mask(mask)]
            return any(w in text for w in words) if words else "no clock-event reason active" in text
        recent = [s.gpus[0].reasons_mask for s in list(nm.history)[-12:]]
        assert any(says(m) for m in recent), (recent, text)
        assert "Power" in text and "SM" in text and "Util" in text
        # Host memory headroom from the recorded MemAvailable / MemTotal.
        shown_mem = {f"{t['mem']['available_kb'] / 1048576:.1f} of {t['mem']['total_kb'] / 1048576:.1f} GiB free"
                     for t in ticks}
        assert any(m in text for m in shown_mem)
        assert "LIVE" in screen_text(app)
        # The graph's slowdown line is labelled with the recorded threshold.
        assert f"{ticks[0]['gpus'][0]['slowdown_c']}°" in widget_text(panel.query_one("TempGraph"))
        await pilot.press("q")
    assert all(not t.connected for t in factory.made.values())


async def test_stale_and_down_nodes_say_so_and_keep_their_last_values(recording):
    app, factory, mon = make_app(recording, interval=0.05,
                                 per_node={"spark1": {"stop_after": 8}, "spark2": {"drop_after": 8}})
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: mon.nodes["spark1"].state == NodeState.STALE, what="spark1 STALE")
        await wait_for(pilot, lambda: mon.nodes["spark2"].state == NodeState.DOWN, what="spark2 DOWN")
        await pilot.pause(1.2)    # past one age refresh
        p1, p2 = app.dashboard.panels["spark1"], app.dashboard.panels["spark2"]
        assert p1.has_class("-stale") and not p1.has_class("-down")
        assert p2.has_class("-stale") and p2.has_class("-down")
        for name, panel in (("spark1", p1), ("spark2", p2)):
            last = mon.nodes[name].last
            text = widget_text(panel)
            assert f"GPU {last.gpus[0].temp_c:.0f}°C" in text, f"{name} lost its last values"
        assert "STALE" in str(p1.border_subtitle) and "DOWN" in str(p2.border_subtitle)
        await pilot.press("q")


async def test_number_keys_and_help(recording):
    app, _, _ = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        for key, mode in (("2", "recipes"), ("3", "bench"), ("4", "logs"), ("1", "dashboard")):
            await pilot.press(key)
            await pilot.pause(0.1)
            assert app.current_mode == mode
        await pilot.press("question_mark")
        await pilot.pause(0.1)
        assert isinstance(app.screen, HelpScreen)
        assert "tail the node's vLLM container log" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("q")


@pytest.mark.slow       # ten keystrokes through the palette's fuzzy search: ~12 CPU s on 2 cores
async def test_palette_types_a_command_and_runs_it(recording):
    app, _, _ = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        # ':' opens the palette; every node action is there.
        await pilot.press("colon")
        await pilot.pause(0.2)
        from textual.command import CommandPalette
        assert isinstance(app.screen, CommandPalette)
        for ch in "Show bench":
            await pilot.press("space" if ch == " " else ch)
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.current_mode == "bench", what="bench via palette")
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        assert isinstance(app.screen, CommandPalette)
        await pilot.press("escape")
        await pilot.press("q")


async def test_palette_lists_every_action_and_recipe(recording):
    app, _, _ = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        titles = [c.title for c in app.palette_commands()]
        for node in ("spark1", "spark2"):
            assert f"{node}: Logs of vLLM" in titles and f"{node}: Restart vLLM" in titles
            assert f"{node}: Stop vLLM" in titles
        for mode in ("dashboard", "recipes", "bench", "logs"):
            assert any(t.startswith(f"Show {mode}") for t in titles)
        from sparkconsole.recipes import recipe_paths
        for key in recipe_paths():
            assert f"Recipe: {key}" in titles
        await pilot.press("q")


async def test_restart_and_stop_ask_first_then_run_and_audit(recording, state_dir):
    app, factory, mon = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: mon.nodes["spark2"].state == NodeState.LIVE, what="LIVE")
        app.dashboard.panels["spark2"].focus()
        await pilot.press("r")
        await pilot.pause(0.1)
        assert isinstance(app.screen, ConfirmScreen)
        assert "docker restart vllm_node" in screen_text(app)
        await pilot.press("n")
        await pilot.pause(0.2)
        t2 = factory.made["spark2"]
        assert not any(c.startswith("docker restart") for c in t2.commands), "cancel must not run anything"
        await pilot.press("r")
        await pilot.pause(0.1)
        await pilot.press("y")
        await wait_for(pilot, lambda: "docker restart vllm_node" in t2.commands, what="restart sent")
        await pilot.press("s")
        await pilot.pause(0.1)
        assert "docker stop vllm_node" in screen_text(app)
        await pilot.press("y")
        await wait_for(pilot, lambda: "docker stop vllm_node" in t2.commands, what="stop sent")
        assert not any("docker" in c and "logs" not in c for c in factory.made["spark1"].commands)
        entries = audit.read()
        assert [(e.node, e.command) for e in entries] == [("spark2", "docker restart vllm_node"),
                                                          ("spark2", "docker stop vllm_node")]
        assert any("docker stop vllm_node" in e for e in app.dashboard.events.history)
        await pilot.press("q")


async def test_failed_command_is_reported(recording):
    from sparkconsole.nodes.transport import CommandResult
    app, factory, mon = make_app(recording, replies={"docker stop": CommandResult(1, "", "Error response from daemon: No such container: vllm_node")})
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: mon.nodes["spark1"].state == NodeState.LIVE, what="LIVE")
        app.dashboard.panels["spark1"].focus()
        await pilot.press("s", "y")
        events = app.dashboard.events.history
        await wait_for(pilot, lambda: any("rc 1" in e for e in events), what="failure in the event log")
        assert any("No such container" in e for e in events)
        await pilot.press("q")


async def test_filter_hides_other_nodes(recording):
    app, _, _ = make_app(recording, n=4)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("slash")
        await pilot.press("3")
        await pilot.pause(0.1)
        shown = [n for n, p in app.dashboard.panels.items() if p.display]
        assert shown == ["spark3"]
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert all(p.display for p in app.dashboard.panels.values())
        await pilot.press("q")


# A real vLLM 0.32 (CPU) server log recorded by the test bed (the recording machine's paths written as a container's:
# /usr/local/lib/python3.11, /models/tiny-llama), plus one line carrying a token to prove redaction.
LOG_LINES = (Path(__file__).parent / "fixtures" / "tui-vllm-0.32.0-cpu.log").read_text().splitlines() + [
    "(APIServer pid=1) ERROR 11-22 17:10:41 [x.py:1] failed: HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123456",
]


async def test_logs_key_tails_the_container_log_and_searches(recording):
    app, factory, mon = make_app(recording, logs=LOG_LINES)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: mon.nodes["spark2"].state == NodeState.LIVE, what="LIVE")
        app.dashboard.panels["spark2"].focus()
        await pilot.press("l")
        await wait_for(pilot, lambda: app.current_mode == "logs", what="logs screen")
        await wait_for(pilot, lambda: len(app.logs_screen.lines) == len(LOG_LINES), what="log lines")
        assert "docker logs -f --tail 200 vllm_node 2>&1" in factory.made["spark2"].commands
        await wait_for(pilot, lambda: LOG_LINES[-2][-40:] in screen_text(app), what="the newest lines")  # followed
        text = screen_text(app)
        assert "spark2" in text
        assert "hf_abcdefghijklmnopqrstuvwxyz123456" not in text, "a token reached the screen"
        assert "hf_abcdefghijklmnopqrstuvwxyz123456" not in "\n".join(app.logs_screen.lines)
        await pilot.press("slash")
        for ch in "kv cache":
            await pilot.press("space" if ch == " " else ch)
        await wait_for(pilot, lambda: "CPU KV cache size" in screen_text(app)
                       and LOG_LINES[-2][-40:] not in screen_text(app), what="only the matching lines")
        await pilot.press("escape")
        await wait_for(pilot, lambda: LOG_LINES[-2][-40:] in screen_text(app), what="every line again")
        log = app.logs_screen.query_one("#log")
        await pilot.press("f")       # follow off: the pane stops scrolling, the tail keeps reading
        assert log.auto_scroll is False
        await pilot.press("f")
        assert log.auto_scroll is True
        await pilot.press("n")       # next node: spark1
        await wait_for(pilot, lambda: any("logs" in c for c in factory.made["spark1"].commands), what="spark1 tail")
        await pilot.press("q")
    # the tails ended with the app
    assert all(not t._streams for t in factory.made.values())


@pytest.mark.slow       # every screen's first mount: ~8 s on 2 cores
async def test_simulated_label_on_every_screen(recording):
    app, _, _ = make_app(recording, simulated=True)
    async with app.run_test(size=SIZE) as pilot:
        for key in ("1", "2", "3", "4"):
            await pilot.press(key)
            await pilot.pause(0.1)
            assert app.screen.query(SimBadge), f"no SIMULATED label on screen {key}"
            assert "SIMULATED" in screen_text(app)
        await pilot.press("q")
    app2, _, _ = make_app(recording, simulated=False)
    async with app2.run_test(size=SIZE) as pilot:
        assert not app2.screen.query(SimBadge)
        assert "SIMULATED" not in screen_text(app2)
        await pilot.press("q")


async def test_quit_ends_agents_and_connections(recording):
    app, factory, mon = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(nm.state == NodeState.LIVE for nm in mon.nodes.values()), what="LIVE")
        await pilot.press("q")
        await pilot.pause(0.1)
    assert all(nm._task is None for nm in mon.nodes.values())
    for t in factory.made.values():
        assert not t.connected and not t._streams


async def test_recipes_screen_lists_recipes_and_shows_a_plan_per_node(recording):
    from sparkconsole.recipes import recipe_paths
    app, _, _ = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await pilot.pause(0.3)
        text = screen_text(app)
        keys = sorted(recipe_paths())
        assert keys and keys[0] in text
        rs = app.recipes_screen
        first_topology = rs.topology
        plan = widget_text(rs.query_one("#plan"))
        if rs.plan is not None:
            assert "spark1" in plan
        await pilot.press("t")
        await pilot.pause(0.2)
        topos = rs.topologies(rs._recipe(rs.selected))
        if len(topos) > 1:
            assert rs.topology != first_topology
        # '/' filters the list
        await pilot.press("slash")
        for ch in keys[-1][:4]:
            await pilot.press(ch)
        await pilot.pause(0.2)
        listed = [o.id for o in rs.query_one("#recipe-list").options]
        assert keys[-1] in listed and all(keys[-1][:4] in k for k in listed)
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert len(rs.query_one("#recipe-list").options) == len(keys)
        await pilot.press("q")


async def test_guard_row_enter_shows_the_fix_and_runs_it_after_confirmation(recording, state_dir):
    from sparkconsole.tui.widgets.guard_list import GuardList
    app, factory, mon = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        gl = app.dashboard.panels["spark1"].query_one(GuardList)
        await wait_for(pilot, lambda: any(r.key == "overcommit" for r in gl.results), what="guard rows")
        row = next(i for i, r in enumerate(gl.results) if r.key == "overcommit")
        result = gl.results[row]
        assert result.status == "bad" and result.fix     # the recording has vm.overcommit_memory=1
        await wait_for(pilot, lambda: f"✗ {result.title}" in widget_text(gl), timeout=30, what="the guard row drawn")
        gl.focus()
        gl.highlighted = row
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=30, what="the confirmation")
        # the screen is pushed before its first frame is drawn: wait for the command on screen
        await wait_for(pilot, lambda: result.fix in screen_text(app), timeout=30, what="the fix on the confirmation")
        await pilot.press("y")
        t = factory.made["spark1"]
        await wait_for(pilot, lambda: result.fix in t.commands, what="fix sent")
        assert [(e.action, e.node, e.command) for e in audit.read()] == [("guard-fix:overcommit", "spark1", result.fix)]
        await pilot.press("q")


async def test_alerts_reach_the_event_log_and_a_toast(recording):
    app, _, mon = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.dashboard.events.count > 0, what="an alert")
        active = list(app.alerts.active.values())
        assert active
        log = "\n".join(app.dashboard.events.history)
        assert any(a.source in log and a.message.split(": ", 1)[-1][:40] in log for a in active)
        # the toast's title names the source; its text is the message without it
        await wait_for(pilot, lambda: any((n.title, n.message) in {(a.source, a.message.removeprefix(a.source + " "))
                                                                   for a in active} for n in app._notifications),
                       what="a toast")
        await pilot.press("q")


async def test_recipe_refused_by_preflight_runs_nothing(recording):
    app, factory, mon = make_app(recording)     # the recorded node has vm.overcommit_memory=1: a refusal
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(nm.state == NodeState.LIVE for nm in mon.nodes.values()), what="LIVE")
        await pilot.press("2")
        await pilot.pause(0.3)
        rs = app.recipes_screen
        rs.choose(rs._recipe("tiny-testbed"))
        await pilot.pause(0.3)
        assert "✗" in widget_text(rs.query_one("#recipe-head")) and "overcommit" in widget_text(rs.query_one("#recipe-head"))
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("preflight refuses" in n.message for n in app._notifications)
        assert not any("docker" in c for t in factory.made.values() for c in t.commands)
        await pilot.press("q")


def fixed_guards(recording: list[str]) -> list[str]:
    """The same recording as it reads after the guard fixes were applied (overcommit 0, 1.5 GiB reserve)."""
    out = []
    for line in recording:
        d = json.loads(line)
        if d.get("type") == "tick":
            d["guards"] = {**d["guards"], "overcommit_memory": 0, "min_free_kbytes": 1572864}
        out.append(json.dumps(d))
    return out


@pytest.mark.slow       # a launch through the runner on two replayed nodes: ~9 s on 2 cores
async def test_recipe_enter_asks_then_launches_with_a_progress_line_per_node(recording, state_dir):
    app, factory, mon = make_app(fixed_guards(recording))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(nm.state == NodeState.LIVE for nm in mon.nodes.values()), what="LIVE")
        await pilot.press("2")
        await pilot.pause(0.3)
        rs = app.recipes_screen
        rs.choose(rs._recipe("tiny-testbed"))
        await pilot.pause(0.3)
        assert rs.plan is not None and rs.selected == "tiny-testbed"
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert isinstance(app.screen, ConfirmScreen)
        assert "docker run" in screen_text(app)
        await pilot.press("n")
        await pilot.pause(0.2)
        assert not any("docker run" in c for t in factory.made.values() for c in t.commands)
        await pilot.press("enter")
        await pilot.pause(0.2)
        await pilot.press("y")
        node = rs.plan.nodes[0]
        await wait_for(pilot, lambda: any("docker run" in c for c in factory.made[node].commands), what="docker run")
        await wait_for(pilot, lambda: rs.progress.get(node, "queued") != "queued", what="progress line")
        await pilot.pause(0.3)
        assert node in widget_text(rs.query_one("#launch-progress"))
        # Nothing answers here, and the replayed nodes list no container of the launch: as this console's own
        # running plan, s still asks before stopping it.
        rs.running_plans[rs.plan.name] = rs.plan
        await pilot.press("s")
        await pilot.pause(0.2)
        assert isinstance(app.screen, ConfirmScreen)
        assert "docker stop -t 30 vllm_node" in screen_text(app)
        await pilot.press("y")
        await wait_for(pilot, lambda: "docker stop -t 30 vllm_node" in factory.made[node].commands, what="stop sent")
        assert any(e.command == "docker stop -t 30 vllm_node" for e in audit.read())
        await pilot.press("q")


async def test_mouse_click_focuses_a_node_and_its_keys_act_on_it(recording):
    app, factory, mon = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(nm.state == NodeState.LIVE for nm in mon.nodes.values()), what="LIVE")
        await pilot.click("#node-spark2", offset=(5, 1))
        await pilot.pause(0.1)
        assert app.focused is app.dashboard.panels["spark2"]
        await pilot.press("r")
        await pilot.pause(0.1)
        assert "Restart the vLLM container on spark2?" in screen_text(app)
        await pilot.click("#no")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ConfirmScreen)
        assert not any("restart" in c for t in factory.made.values() for c in t.commands)
        await pilot.press("q")


async def test_serving_panel_polls_a_real_endpoint_and_shows_it_down(recording):
    """A loopback HTTP server answering with /metrics recorded from a real vLLM 0.32 (CPU)."""
    from sparkconsole.config import EndpointConfig
    runner, url = await recorded_vllm_endpoint()
    try:
        cfg = ClusterConfig(nodes=(NodeConfig("spark1", "127.0.0.1", role="head"),),
                            endpoints=(EndpointConfig("spark1", url, kind="vllm", node="spark1"),))
        mon = ClusterMonitor(cfg, transport_factory=replay_factory(lambda n: recording, interval=0.1))
        app = SparkConsoleApp(cfg, monitor=mon)
        async with app.run_test(size=SIZE) as pilot:
            panel = app.dashboard.endpoint_panels["spark1"]
            # the model, the version and the engine figures come from separate reads: one refresh may show some
            shown = ("tiny-llama", "vLLM 0.32.0", "UP", "KV", "TTFT")
            await wait_for(pilot, lambda: all(k in widget_text(panel) for k in shown), timeout=20,
                           what="the served model, its version and engine figures")
            await runner.cleanup()          # the server goes away
            await wait_for(pilot, lambda: "DOWN" in widget_text(panel), timeout=20, what="endpoint DOWN")
            assert panel.has_class("-unhealthy")
            await wait_for(pilot, lambda: any("spark1" in e and "unhealthy" in e for e in app.dashboard.events.history),
                           timeout=20, what="an alert in the event log")
            await pilot.press("q")
    finally:
        await runner.cleanup()


async def test_a_server_loading_its_model_reads_loading_and_one_that_never_answers_reads_down(recording):
    """The node's endpoint refuses (nothing listens) while its vLLM container has run 30 s on the node's clock: the
    events pane says it is loading, not unhealthy, and nothing is BAD; a container up longer than a launch waits
    for it (alerts.LOAD_GRACE_S) that never answered reads unhealthy."""
    import datetime as dt

    from sparkconsole.alerts import LOAD_GRACE_S
    from sparkconsole.config import EndpointConfig
    from sparkconsole.nodes.samples import ContainerInfo
    from tests.helpers import free_port
    url = f"http://127.0.0.1:{free_port()}"
    cfg = ClusterConfig(nodes=(NodeConfig("spark1", "127.0.0.1", role="head"),),
                        endpoints=(EndpointConfig("spark1", url, kind="vllm", node="spark1"),))
    mon = ClusterMonitor(cfg, transport_factory=replay_factory(lambda n: recording, interval=0.1))
    app = SparkConsoleApp(cfg, monitor=mon)

    def started(age_s: float) -> tuple[ContainerInfo]:
        at = dt.datetime.fromtimestamp(mon.nodes["spark1"].last.time - age_s, dt.UTC)
        return (ContainerInfo("vllm_node", state="running", started_at=at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")),)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: mon.nodes["spark1"].last is not None, what="a tick")
        mon.nodes["spark1"].containers = started(30)
        events = app.dashboard.events.history
        await wait_for(pilot, lambda: any("spark1: loading: no answer yet, its container up" in e for e in events),
                       timeout=30, what="loading in the events pane")
        await pilot.pause(1.0)                 # several polls refused meanwhile
        since = list(events)[next(i for i, e in enumerate(events) if "loading: no answer yet" in e):]
        # (a poll before the container was listed read unhealthy: the loading line clears it)
        assert not any(e[9:].startswith(("WARN  spark1: unhealthy", "BAD   spark1: unhealthy")) for e in since), since
        panel = app.dashboard.endpoint_panels["spark1"]
        await wait_for(pilot, lambda: "LOADING" in str(panel.border_subtitle), what="the panel: LOADING")
        assert not panel.has_class("-unhealthy")
        mon.nodes["spark1"].containers = started(LOAD_GRACE_S + 60)
        await wait_for(pilot, lambda: any("spark1: unhealthy" in e for e in events), timeout=30, what="unhealthy")
        await wait_for(pilot, lambda: "DOWN" in str(panel.border_subtitle), what="the panel: DOWN")
        await pilot.press("q")


async def test_recipes_keys_offer_the_model_and_image_copy_preflight_names(recording, state_dir):
    app, factory, mon = make_app(fixed_guards(recording))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(nm.state == NodeState.LIVE for nm in mon.nodes.values()), what="LIVE")
        await pilot.press("2")
        rs = app.recipes_screen
        await wait_for(pilot, lambda: rs.is_current, what="recipes screen")
        rs.choose(rs._recipe("gpt-oss-120b"))
        await wait_for(pilot, lambda: rs.plan is not None, what="a plan")
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the model copy's confirmation")
        text = screen_text(app)
        assert "sparkconsole model pull openai/gpt-oss-120b" in text and f"--node {rs.plan.nodes[0]}" in text
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="cancelled")
        await pilot.press("i")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the image copy's confirmation")
        assert f"sparkconsole image pull {rs.plan.image}" in screen_text(app)
        await pilot.press("n")


async def test_node_panel_shows_what_each_workload_holds(recording):
    """The real agent's ticks from an H200 (two containers, 1 GiB and 3 GiB allocated): the panel's memory row gives
    each container its GPU memory and its cgroup against its cap, largest first."""
    import json
    rec = json.loads((Path(__file__).parent / "fixtures" / "nvidia-h200-gpu-procs.json").read_text())
    lines = [json.dumps(x) for x in [rec["agent"]["lines"][0], *rec["agent"]["lines"][2:]]]
    app, _, mon = make_app(lines, n=1)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "alloc-3g" in widget_text(app.dashboard.panels["spark1"]), what="the workloads")
        text = widget_text(app.dashboard.panels["spark1"])
        # largest first; on the narrow panel the row leaves out what does not fit whole (issue 39: no figure cut,
        # it read "… of 1.0" at the edge), the largest workload's total kept
        assert "Workloads alloc-3g 3.5 GiB" in text
        import re
        assert not re.search(r"[\d.]…", text), text
        await pilot.press("q")
