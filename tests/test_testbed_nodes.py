"""`python -m tests.testbed up --nodes N` by hand (issue 23 item 6): N OpenSSH nodes that outlive the command,
their cluster file, a sparkconsole command reaching them through it, and `down` stopping them by PID."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed.cache import CACHE_ENV
from tests.testbed.sshd import _ensure_sshd

pytestmark = pytest.mark.sshd
ROOT = Path(__file__).resolve().parents[1]


def answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2) as s:
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def test_up_nodes_starts_nodes_a_cluster_file_reaches_and_down_stops_them(tmp_path):
    if _ensure_sshd():
        pytest.skip("no sshd")
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache"), "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")}

    def testbed(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tests.testbed", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)

    r = testbed("up", "--nodes", "2", "--no-engine")
    try:
        assert r.returncode == 0, r.stderr
        cluster = Path(re.search(r"^cluster file: (.+)$", r.stdout, re.M).group(1))
        nodes = re.findall(r"(node\d) (127\.0\.0\.\d+):(\d+)", r.stdout)
        assert [(n, a) for n, a, _ in nodes] == [("node1", "127.0.0.2"), ("node2", "127.0.0.3")]
        # the command that started them has exited: the nodes are still there
        assert all(answers(a, int(p)) for _, a, p in nodes)
        assert f"-m sparkconsole --cluster {cluster} status" in r.stdout
        # a real command through the written cluster file, over SSH to each node
        s = subprocess.run([sys.executable, "-m", "sparkconsole", "--cluster", str(cluster), "status", "--json",
                            "--timeout", "60"], env=env, capture_output=True, text=True, timeout=120)
        assert s.returncode == 0, s.stderr
        assert {n["name"]: n["state"] for n in json.loads(s.stdout)["nodes"]} == {"node1": "LIVE", "node2": "LIVE"}
        assert "already up" in testbed("up", "--nodes", "2", "--no-engine").stderr
    finally:
        d = testbed("down")
    assert d.returncode == 0 and d.stdout.count("stopped sshd") == 2
    assert not any(answers(a, int(p)) for _, a, p in nodes)
    assert not cluster.exists() and "nothing is up" in testbed("down").stdout
