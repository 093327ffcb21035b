"""nodes/thermal.py on ticks an agent recorded on a real H100 under load (tests/fixtures/agent-h100-load.jsonl):
the note a benchmark level carries, and how long each clock-event reason has been active."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from sparkconsole.bench.results import ThermalNote
from sparkconsole.nodes.samples import Tick
from sparkconsole.nodes.thermal import cluster_reading, reading_from_ticks, reason_durations
from sparkconsole.tui.screens.bench import throttled

FIXTURE = Path(__file__).parent / "fixtures" / "agent-h100-load.jsonl"


def _raw() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if '"type":"tick"' in line]


def test_thermal_note_from_recorded_h100_ticks():
    """The bench probe (CLI --cluster and console alike), fed the recorded ticks."""
    raw = _raw()
    now = 5000.0
    ticks = [Tick.from_json(d, received=now - 1) for d in raw]
    hottest = max(g["temp_c"] for d in raw for g in d["gpus"])
    capped = [t for t in ticks if "sw_power_cap" in t.gpus[0].reasons]
    idle = [t for t in ticks if t.gpus[0].reasons == ("idle",)]
    assert capped and idle
    note = reading_from_ticks([("spark1", max(ticks, key=lambda t: t.gpus[0].temp_c)), ("spark2", capped[0])],
                              now=now)
    assert note.max_temp_c == hottest
    assert "spark2:sw_power_cap" in note.throttle_reasons
    assert not any(r.endswith(":idle") for r in note.throttle_reasons)       # idle is not a throttle
    assert reading_from_ticks([("spark1", idle[0])], now=idle[0].received + 60) is None   # stale: says nothing
    # From NodeMonitor-shaped objects (what the console and `bench matrix` hold): the same reading.
    nodes = [SimpleNamespace(name="spark1", last=max(ticks, key=lambda t: t.gpus[0].temp_c)),
             SimpleNamespace(name="spark2", last=capped[0]), SimpleNamespace(name="spark3", last=None)]
    assert cluster_reading(nodes, now=now) == note


def test_power_cap_is_noted_but_does_not_mark_a_level_throttled():
    """The console's bench screen marks levels by real throttles only, with node-named reasons."""
    assert not throttled(SimpleNamespace(thermal=ThermalNote(60.0, ("spark2:sw_power_cap",))))
    assert throttled(SimpleNamespace(thermal=ThermalNote(90.0, ("spark2:sw_power_cap", "spark1:hw_slowdown"))))
    assert throttled(SimpleNamespace(thermal=ThermalNote(90.0, ("hw_thermal",))))


def _run_start(ticks: list[Tick], i: int, reason: str) -> float:
    """Forward scan: the time of the first tick of the unbroken run of `reason` that ends at tick i."""
    start = i
    while start > 0 and reason in ticks[start - 1].gpus[0].reasons:
        start -= 1
    return ticks[start].time


def test_reason_durations_on_recorded_ticks():
    ticks = [Tick.from_json(d, received=0.0) for d in _raw()]
    checked = set()
    for i, last in enumerate(ticks):
        history = ticks[: i + 1]                     # the monitor's ring holds the last tick too
        spans = reason_durations(history, last)
        assert set(spans) == set(last.gpus[0].reasons)
        for r, s in spans.items():
            assert s == last.time - _run_start(ticks, i, r)
            checked.add(r)
    assert {"idle", "sw_power_cap"} <= checked
    # The power cap began after a break (a tick with no reason): its span restarts there, not at the first tick.
    first_cap = next(i for i, t in enumerate(ticks) if "sw_power_cap" in t.gpus[0].reasons)
    assert reason_durations(ticks[: first_cap + 1], ticks[first_cap]) == {"sw_power_cap": 0.0}
    later = first_cap + 10
    assert reason_durations(ticks[: later + 1], ticks[later])["sw_power_cap"] == ticks[later].time - ticks[first_cap].time
    # A short ring counts back only as far as it reaches.
    assert reason_durations(ticks[later - 3: later + 1], ticks[later])["sw_power_cap"] == (
        ticks[later].time - ticks[later - 3].time)
