"""`console --at`: the dashboard as it was, from the flight recorder, labelled REPLAY with the recorded time; the
guard never acts on a replayed node, it says what it would have done."""

from __future__ import annotations

import time

from sparkconsole.alerts import AlertEngine
from sparkconsole.config import ClusterConfig, NodeConfig, ProtectSettings, Thresholds
from sparkconsole.nodes.samples import Tick
from sparkconsole.protect import Guardian
from sparkconsole.recorder.reader import RecorderReader
from sparkconsole.recorder.replay import agent_lines, replay_monitor_factory
from sparkconsole.recorder.store import RecorderStore
from sparkconsole.tui.app import SparkConsoleApp
from tests.helpers import wait_for
from tests.test_tui_app import SIZE, widget_text

GIB_KB = 1 << 20


def record_runaway(path, t0: float) -> None:
    store = RecorderStore(path)
    store.put_event("spark1", "hello", {"hostname": "spark1", "boot_id": "b1", "interval_s": 0.5,
                                        "gpu_names": ["NVIDIA GB10"], "simulated": False}, t0 - 1)
    for i in range(120):
        t = t0 + i * 0.5
        store.put_tick("spark1", Tick.from_json({
            "type": "tick", "seq": i, "time": t,
            "gpus": [{"index": 0, "temp_c": 61, "slowdown_c": 89, "power_w": 95, "reasons_mask": 4}],
            "mem": {"total_kb": 128 * GIB_KB, "available_kb": int((40 - i * 0.3) * GIB_KB), "cached_kb": GIB_KB},
            "pressure": {"some_avg10": 5.0, "full_avg10": 1.0}}, t))
    store.close()


def test_recorded_rows_become_agent_lines_again(tmp_path):
    t0 = 1_700_000_000.0
    record_runaway(tmp_path / "r.sqlite", t0)
    lines = agent_lines(RecorderReader(tmp_path / "r.sqlite"), "spark1", t0 + 10, t0 + 20)
    import json
    hello, ticks = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    assert hello["type"] == "hello" and hello["gpu_source"] == "replay" and hello["gpus"][0]["name"] == "NVIDIA GB10"
    assert len(ticks) == 21 and ticks[0]["time"] == t0 + 10
    t = Tick.from_json(ticks[0], 0)
    assert t.mem.available_kb == int((40 - 20 * 0.3) * GIB_KB) and t.gpus[0].reasons == ("sw_power_cap",)


async def test_console_at_shows_replay_label_and_the_guard_never_acts(tmp_path):
    t0 = time.time() - 3600
    record_runaway(tmp_path / "r.sqlite", t0)
    cfg = ClusterConfig(nodes=(NodeConfig("spark1", "127.0.0.1", role="head"),), endpoints=(), source="lab.yaml",
                        protect=ProtectSettings(stop_container_before_exhaustion_s=600, containers="any"))
    app = SparkConsoleApp(cfg, monitor_factory=replay_monitor_factory(tmp_path / "r.sqlite", t0 + 5), replay_at=t0 + 5)
    async with app.run_test(size=SIZE) as pilot:
        assert app.sub_title.startswith("REPLAY " + time.strftime("%Y-%m-%d %H:%M", time.localtime(t0 + 5)))
        await wait_for(pilot, lambda: app.monitor is not None and app.monitor.nodes["spark1"].last is not None,
                       what="a replayed tick")
        panel = app.dashboard.panels["spark1"]
        await wait_for(pilot, lambda: "61" in widget_text(panel), what="the recorded temperature")
        assert app.recorder is None                   # a replay is never recorded again
    # the guard, on a replayed node, says what it would have done and runs nothing
    g = Guardian(cfg, AlertEngine(Thresholds()), replay=True, say=lambda *a: None)
    nm = type("NM", (), {"name": "spark1", "config": cfg.nodes[0], "info": None, "transport": None})()
    for line in agent_lines(RecorderReader(tmp_path / "r.sqlite"), "spark1", t0, t0 + 60)[1:]:
        import json
        nm.last = Tick.from_json(json.loads(line), 0)
        g.on_node(nm)
    assert g.actions and g.actions[0]["result"] == "not run (REPLAY)"


async def test_live_console_scrubs_back_through_the_recorder_and_returns_live(tmp_path, monkeypatch):
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.nodes.replay import read_recording, replay_factory
    from tests.test_tui_app import RECORDING, cluster

    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    cfg = cluster(2)
    live = ClusterMonitor(cfg, transport_factory=replay_factory(lambda n: read_recording(RECORDING), interval=0.1))
    app = SparkConsoleApp(cfg, monitor=live, record=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.recorder is not None and all(len(nm.history) >= 10 for nm in live.nodes.values()),
                       what="ticks recorded")
        assert not app.sub_title.startswith("REPLAY")
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: app.monitor is not live and app.sub_title.startswith("REPLAY "), what="REPLAY")
        replayed = app.monitor
        await wait_for(pilot, lambda: replayed.nodes["spark1"].last is not None, what="a replayed tick")
        assert app.node_monitor("spark1").transport.runs_commands is False    # a replay refuses commands
        n_live = len(live.nodes["spark1"].history)
        await wait_for(pilot, lambda: len(live.nodes["spark1"].history) > n_live, what="the live monitor still ticking")
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: app.monitor is live and not app.sub_title.startswith("REPLAY"), what="live again")
    rows = RecorderReader(app.recorder.store.path).tick_counts()
    assert set(rows) == {"spark1", "spark2"} and min(rows.values()) >= 10


async def test_a_node_that_goes_down_gets_its_post_mortem_on_its_panel(tmp_path, monkeypatch):
    """The recorder's post-mortem reaches the node's own panel (and the events pane), from a recorded H100 session
    whose connection drops: red while the node is out, the verdict and the command for the whole of it."""
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.nodes.replay import read_recording, replay_factory
    from tests.test_tui_app import RECORDING, cluster

    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    cfg = cluster(2)
    live = ClusterMonitor(cfg, transport_factory=replay_factory(
        lambda n: read_recording(RECORDING), interval=0.1, per_node={"spark2": {"drop_after": 30}}))
    app = SparkConsoleApp(cfg, monitor=live, record=True)
    async with app.run_test(size=SIZE) as pilot:
        panel = app.dashboard.panels["spark2"]
        assert "Post-mortem" not in widget_text(panel) and not panel.has_class("-postmortem")
        await wait_for(pilot, lambda: panel.postmortem is not None, timeout=60, what="spark2's post-mortem")
        await pilot.pause(0.3)
        row = widget_text(panel.query_one(".postmortem"))
        assert row.startswith("Post-mortem ") and panel.postmortem["verdict"] in row, row
        assert panel.postmortem["evidence"][0][:10] in row
        assert panel.has_class("-postmortem") and panel.query_one(".postmortem").display
        assert app.dashboard.panels["spark1"].postmortem is None
        events = widget_text(app.dashboard.events)
        assert f"post-mortem spark2: {panel.postmortem['verdict']}" in events
        assert "sparkconsole postmortem spark2" in events
