"""Commands that change a node need a confirmation (headless: --yes) and each one lands in the audit log; routers
with known compromised releases are refused at plan time and at launch, before anything runs.

Headless runs of `sparkconsole recipe stop|restart|launch` against a real sshd node (stdin not a terminal): without
--yes nothing is sent (no audit entry, exit 2, one line saying to add --yes); with --yes each command is written
to the audit log (who, when, node, exact command) before it is sent. The node's docker has no engine here, so
the command fails: the failure is one line naming the node, never a traceback.
(The console's own confirmation modal and its audit record: tests/test_tui_app.py, restart/stop and guard fixes.)
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sparkconsole.recipes import bundled_dir
from tests.helpers import error_lines

pytestmark = pytest.mark.sshd


@pytest.fixture
def headless(sshd_live, tmp_path):
    n = sshd_live[0]
    cf = tmp_path / "sparkconsole.yaml"
    cf.write_text(yaml.safe_dump({
        "nodes": [{"name": "spark1", "address": n.address, "container": "vllm_fault",
                   "ssh": {"user": n.user, "port": n.port, "identity": n.identity}}],
        "ssh": {"known_hosts": sshd_live.known_hosts, "connect_timeout_s": 5}}))
    state = tmp_path / "state"
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(state), "DOCKER_HOST": "unix:///nonexistent/docker.sock"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sparkconsole", "--cluster", str(cf), *args],
                              capture_output=True, text=True, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                              timeout=120)
    return run, state / "audit.log", tmp_path


def audit_lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.fault("headless stop/restart/launch without --yes: refused, nothing sent, nothing audited")
@pytest.mark.parametrize("action", ["stop", "restart", "launch"])
def test_headless_change_without_yes_is_refused(headless, action, ledger):
    run, log, _ = headless
    r = run("recipe", action, "tiny-testbed", "-T", "solo", "--offline")
    ledger.output(r.stdout + r.stderr, f"recipe {action}")
    assert r.returncode == 2, r
    (line,) = error_lines(r.stderr)
    assert "--yes" in line and "no terminal to confirm" in line
    assert audit_lines(log) == []


@pytest.mark.fault("headless stop with --yes on a node whose docker engine is gone: audited, one-line failure")
def test_headless_stop_with_yes_is_audited_before_it_runs(headless, ledger):
    run, log, _ = headless
    t0 = time.time()
    r = run("recipe", "stop", "tiny-testbed", "-T", "solo", "--yes")
    ledger.output(r.stdout + r.stderr, "recipe stop --yes")
    assert "Traceback" not in r.stderr
    assert r.returncode == 2 and len(error_lines(r.stderr)) == 1, r
    assert "spark1" in r.stderr and "docker" in r.stderr.lower()
    entries = audit_lines(log)
    assert entries, "nothing audited"
    e = entries[0]
    assert e["who"] == getpass.getuser() and e["node"] == "spark1" and t0 - 1 <= e["time"] <= time.time()
    assert e["command"].endswith("docker stop -t 30 vllm_fault") and e["action"].startswith("stop")
    assert oct(log.stat().st_mode & 0o777) == "0o600"


@pytest.mark.fault("compromised LiteLLM pin (1.82.7/1.82.8) refused at plan time and at launch, --force or not")
@pytest.mark.parametrize("pin", [{"version": "1.82.7"}, {"version": "1.82.8"},
                                 {"version": None, "image": "ghcr.io/berriai/litellm:main-v1.82.8"},
                                 {"version": "1.106.2", "image": "ghcr.io/berriai/litellm:v1.82.7-stable"}])
def test_compromised_router_is_refused_before_anything_runs(headless, pin, ledger):
    run, log, tmp = headless
    doc = yaml.safe_load((bundled_dir() / "tiny-testbed.yaml").read_text())
    doc["sparkconsole"]["router"]["litellm"] = {"image": "ghcr.io/berriai/litellm:v1.106.2", "version": "1.106.2",
                                                **{k: v for k, v in pin.items()}}
    path = tmp / "pinned.yaml"
    path.write_text(yaml.safe_dump(doc))
    ledger.bad_inputs()
    # a plan that would use LiteLLM is refused outright
    r = run("recipe", "plan", str(path), "-T", "2x-solo", "--router", "simple-shuffle")
    assert r.returncode == 2 and "compromised" in r.stderr and "Traceback" not in r.stderr, r
    # a launch with vllm-router still refuses the file that pins it, even with --force
    r = run("recipe", "launch", str(path), "-T", "solo", "--yes", "--force", "--offline")
    ledger.output(r.stdout + r.stderr, "recipe launch (compromised pin)")
    assert r.returncode == 2 and "compromised" in (r.stdout + r.stderr), r
    assert audit_lines(log) == []          # nothing was sent to the node
