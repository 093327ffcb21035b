"""Every screen and modal at 80×24, 100×30, 160×48 and 220×60, against the SVG snapshots in __snapshots__/ (pytest-textual-
snapshot's snap_compare). Fed by the recorded H100 session: its first ticks parsed by the real monitor and then
held (no stream, no staleness timer), the clock pinned to just after the last of them, local time in UTC, so each
frame is the same on every run. Update after a deliberate change of the screens with `--snapshot-update`, and look
at the SVGs before committing them."""

from __future__ import annotations

import json
import time

import pytest
from textual.command import CommandList
from textual.widgets import Input

from sparkconsole.config import ClusterConfig, EndpointConfig, NodeConfig
from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.nodes.recording import read_recording
from sparkconsole.tui.app import SparkConsoleApp
from tests.test_tui_app import RECORDING

SIZES = [(80, 24), (100, 30), (160, 48), (220, 60)]
TICKS = 40          # recorded ticks fed before the frame: 20 s of the session, enough for the temperature graph


class HeldMonitor(ClusterMonitor):
    """The recording's first TICKS ticks, parsed as the live monitor parses them, and nothing after: no
    transport, no staleness timer. A frame of it does not depend on when it is taken."""

    def __init__(self, config: ClusterConfig, lines: list[str], received: float) -> None:
        super().__init__(config, transport_factory=lambda node, ssh: None)
        for nm in self.nodes.values():
            for line in lines:
                nm.handle_line(line, received)
            nm.since = received

    async def start(self) -> None:
        return None


class HeldServing:
    """A serving monitor that never polls: the endpoint panels wait, as they do before a first answer."""
    endpoints: dict = {}

    def subscribe(self, cb):
        return lambda: None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def follow(self, wanted):
        return [], [], []


@pytest.fixture
def held_app(monkeypatch, tmp_path):
    lines = read_recording(RECORDING)
    hello, ticks = lines[0], [x for x in lines[1:] if json.loads(x).get("type") == "tick"][:TICKS]
    now = json.loads(ticks[-1])["time"] + 0.5
    monkeypatch.setattr(time, "time", lambda: now)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))      # the bundled recipes only
    monkeypatch.chdir(tmp_path)                                           # no past bench runs
    nodes = tuple(NodeConfig(name=f"spark{i}", address=f"10.0.0.{i}", role="head" if i == 1 else "worker")
                  for i in (1, 2))
    cfg = ClusterConfig(nodes=nodes, endpoints=(EndpointConfig("router", "http://10.0.0.1:4000", kind="router"),),
                        source="sparkconsole.yaml")
    app = SparkConsoleApp(cfg, monitor=HeldMonitor(cfg, [hello, *ticks], now), serving=HeldServing())
    notify = app.notify
    # A toast lasts its seconds of real time: on a loaded machine it could be gone before the frame is taken.
    app.notify = lambda *a, **k: notify(*a, **{**k, "timeout": 3600})
    yield app
    time.tzset()


def drawn(app) -> bool:
    return all(p._lines.get("temp-line") is not None and "°C" in p._lines["temp-line"].plain
               for p in app.dashboard.panels.values())


async def until(pilot, cond, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "the screen did not reach the state to snapshot"
        await pilot.pause(0.05)


async def dashboard_drawn(pilot) -> None:
    await until(pilot, lambda: drawn(pilot.app))
    await pilot.pause(0.3)


# (name, keys pressed once the dashboard is drawn): every screen and every modal
VIEWS = {
    "dashboard": (),
    "events": ("e",),                    # the Events pane over the dashboard, at every size
    "help": ("question_mark",),
    "confirm-restart": ("r",),
    "recipes": ("2",),
    "bench-reference": ("3", "f"),
    "bench-setup": ("3", "b"),
    "logs": ("4",),
    "palette": ("colon", *"bench"),      # typed: the full list arrives from its providers in any order
}


# plotext places the reference charts' axis ticks differently from one run to the next at 80×24 (16 or 32 on a
# chart some twenty cells wide): that frame is walked (docs/UX.md), not pinned.
UNPINNED = {("bench-reference", (80, 24))}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("view", list(VIEWS))
def test_screen(snap_compare, held_app, view, size):
    if (view, size) in UNPINNED:
        pytest.skip("its axis ticks move between runs at this size")
    async def before(pilot) -> None:
        await dashboard_drawn(pilot)
        for key in VIEWS[view]:
            await pilot.press(key)
            await pilot.pause(0.2)
        if view == "palette":      # its providers answer in a worker: until every match is listed
            await until(pilot, lambda: pilot.app.screen.query_one(CommandList).option_count >= 3)
        for box in pilot.app.screen.query(Input):
            box.cursor_blink = False          # the frame must not depend on the blink's phase
        await pilot.pause(0.3)
    assert snap_compare(held_app, terminal_size=size, run_before=before)
