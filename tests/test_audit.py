"""audit: JSON lines under the state dir, redacted, private, tolerant of damage."""

import json
import os
import stat
import threading

import pytest

from sparkconsole import audit, paths, secrets


@pytest.fixture
def state(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(d))
    secrets.forget_all()
    yield d
    secrets.forget_all()


def test_state_dir_is_created_private(state):
    p = paths.state_dir()
    assert p == state and p.is_dir()
    assert stat.S_IMODE(p.stat().st_mode) == 0o700


def test_state_dir_default_under_home(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARKCONSOLE_STATE_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.state_dir() == tmp_path / ".local" / "state" / "sparkconsole"


def test_record_and_read_back(state):
    audit.record("launch", "spark1", "docker run -e HF_TOKEN=hf_abcdefghijklmnopqrst vllm-node")
    audit.record("stop", "spark2", ["docker", "stop", "vllm_node"])
    entries = audit.read()
    assert [(e.action, e.node) for e in entries] == [("launch", "spark1"), ("stop", "spark2")]
    assert entries[1].command == "docker stop vllm_node"
    assert "hf_abcdefghijklmnopqrst" not in (state / "audit.log").read_text()
    assert entries[0].who and entries[0].time > 0
    assert stat.S_IMODE((state / "audit.log").stat().st_mode) == 0o600
    assert [e.node for e in audit.read(node="spark2")] == ["spark2"]
    assert [e.node for e in audit.read(limit=1)] == ["spark2"]


def test_argv_secret_flag_is_masked(state):
    audit.record("launch", "spark1", ["vllm", "serve", "m", "--api-key", "plainvalue"])
    line = json.loads((state / "audit.log").read_text())
    assert "plainvalue" not in line["command"] and "--api-key" in line["command"]


def test_damaged_lines_are_skipped(state):
    audit.record("a", "n1", "true")
    with open(state / "audit.log", "a") as fh:
        fh.write("{not json\n" + json.dumps({"time": 1}) + "\n")
    audit.record("b", "n1", "false")
    assert [e.action for e in audit.read()] == ["a", "b"]


def test_concurrent_writers_do_not_interleave(state):
    def writer(i):
        for j in range(50):
            audit.record(f"w{i}", "n", "x" * 2000 + str(j))
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    lines = (state / "audit.log").read_text().splitlines()
    assert len(lines) == 200
    assert all(json.loads(ln)["command"].startswith("x") for ln in lines)


def test_rotation(state, monkeypatch):
    monkeypatch.setattr(audit, "MAX_BYTES", 600)
    for i in range(10):
        audit.record("a", "n", f"cmd {i} " + "y" * 50)
    assert (state / "audit.log.1").exists()
    assert os.path.getsize(state / "audit.log") <= 600
    assert audit.read()[-1].command.startswith("cmd 9")
