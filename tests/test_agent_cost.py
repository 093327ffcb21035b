"""What the agent does per tick, and what it leaves out: the reason counters (one nvmlDeviceGetFieldValues, ~0.68 ms
of CPU on an H100, see docs/PERFORMANCE.md) when the reasons mask changes or every REASON_COUNTERS_REFRESH_S, the
power limit every POWER_LIMIT_REFRESH_S, the guard inputs every GUARDS_REFRESH_S, and none of the standard
library a tick does not use. NVML is the recorded H100 of tests/test_agent.py (RecordedNvml), here with the
reason counters that the agent recorded on the same machine under load (tests/fixtures/agent-h100-load.jsonl)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from sparkconsole import agent
from sparkconsole.agent import host as agent_host
from sparkconsole.agent import nvml as agent_nvml
from tests.test_agent import AGENT, PROBE, RecordedNvml

FIX = Path(__file__).parent / "fixtures"
# reason_us of the recorded H100 ticks, in µs: the field values NVML gave (ns) were these x 1000.
RECORDED_US = [g["reason_us"] for line in (FIX / "agent-h100-load.jsonl").read_text().splitlines()
               if '"tick"' in line for g in json.loads(line).get("gpus", []) if g.get("reason_us")]


class CountingNvml(RecordedNvml):
    """The recorded H100 plus its recorded reason counters and enforced power limit; counts the calls a tick makes."""

    def __init__(self, frames: list[dict]) -> None:
        super().__init__(frames)
        self.counter_frame = 0

    def nvmlDeviceGetFieldValues(self, h, ids):
        self._count("fields")
        us = RECORDED_US[min(self.counter_frame, len(RECORDED_US) - 1)]
        by_id = {fid: us.get(name) for name, fid in agent.REASON_COUNTER_FIELDS}
        return [types.SimpleNamespace(nvmlReturn=0 if by_id.get(i) is not None else 3,
                                      value=types.SimpleNamespace(ullVal=(by_id.get(i) or 0) * 1000)) for i in ids]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        self._count("power_limit")
        return 700000


@pytest.fixture
def nvml(monkeypatch):
    rec = CountingNvml(PROBE["under_load"])
    monkeypatch.setitem(sys.modules, "pynvml", rec)
    return rec, agent.NvmlSource()


def test_reason_counters_are_read_when_the_mask_changes_and_repeated_between(nvml, monkeypatch):
    rec, src = nvml
    assert PROBE["under_load"][0]["reasons"] == 1 and PROBE["under_load"][1]["reasons"] == 4   # idle, then power cap
    first = [src.sample([])[0] for _ in range(5)]                    # idle, the same mask: one read
    assert rec.calls["fields"] == 1
    assert all(g["reason_us"] == RECORDED_US[0] for g in first)     # repeated, identical

    rec.frame, rec.counter_frame = 1, 10                             # the power cap starts: read at this tick
    g = src.sample([])[0]
    assert rec.calls["fields"] == 2 and g["reasons"] == ["sw_power_cap"] and g["reason_us"] == RECORDED_US[10]

    rec.counter_frame = 20                                           # same mask, within the refresh: not read
    assert src.sample([])[0]["reason_us"] == RECORDED_US[10] and rec.calls["fields"] == 2
    monkeypatch.setattr(agent_nvml, "REASON_COUNTERS_REFRESH_S", 0.0)    # the refresh has passed: read again
    assert src.sample([])[0]["reason_us"] == RECORDED_US[20] and rec.calls["fields"] == 3


def test_power_limit_is_read_once_per_refresh_and_in_every_tick(nvml, monkeypatch):
    rec, src = nvml
    ticks = [src.sample([])[0] for _ in range(4)]
    assert rec.calls["power_limit"] == 1 and all(g["power_limit_w"] == 700.0 for g in ticks)
    monkeypatch.setattr(agent_nvml, "POWER_LIMIT_REFRESH_S", 0.0)
    src.sample([])
    assert rec.calls["power_limit"] == 2


def test_unsupported_counters_are_asked_once(monkeypatch):
    rec = RecordedNvml(PROBE["under_load"])           # no field values in this recording: NOT_SUPPORTED
    monkeypatch.setitem(sys.modules, "pynvml", rec)
    monkeypatch.setattr(agent_nvml, "REASON_COUNTERS_REFRESH_S", 0.0)
    src = agent.NvmlSource()
    asked = []
    real = rec._nope
    monkeypatch.setattr(rec, "_nope", lambda *a: (asked.append(a), real())[1])
    for i in range(3):
        rec.frame = i
        assert "reason_us" not in src.sample([])[0]
    assert (0, "reason_counters") in src.unsupported


def test_guard_inputs_are_reread_after_their_refresh(tmp_path, monkeypatch):
    (tmp_path / "sys" / "vm").mkdir(parents=True)
    (tmp_path / "swaps").write_text(PROBE["swaps"])
    for k, v in PROBE["vm"].items():
        (tmp_path / "sys" / "vm" / k).write_text(v + "\n")
    root = str(tmp_path)
    none = agent.NoGpu()
    before = agent.make_tick(0, none, root, [])["guards"]
    assert before["swaps"] == []
    (tmp_path / "swaps").write_text(PROBE["swaps"] + "/swapfile file 8388604 0 -2\n")
    monkeypatch.setattr(agent_host, "GUARDS_REFRESH_S", 3600.0)
    assert agent.make_tick(1, none, root, [])["guards"] == before          # within the refresh: the same reading
    monkeypatch.setattr(agent_host, "GUARDS_REFRESH_S", 0.0)
    assert agent.make_tick(2, none, root, [])["guards"]["swaps"] == ["/swapfile"]


def _imports(*argv: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    p = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, timeout=30)
    return p, {line.rsplit("|", 1)[1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}


def test_a_tick_without_gpu_or_docker_imports_no_more_than_it_needs():
    _, floor = _imports("-c", "pass")               # what this interpreter imports anyway (site, .pth files)
    p, mods = _imports(*AGENT, "--count", "2", "--interval", "0.01", "--gpu-source", "none", "--containers", "none")
    assert p.returncode == 0, p.stderr[-1000:]
    assert len(p.stdout.splitlines()) == 3
    extra = (mods - floor) & {"csv", "subprocess", "threading", "pynvml"}     # (argparse brings shutil)
    assert not extra, sorted(extra)
