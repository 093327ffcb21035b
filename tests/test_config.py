"""The cluster file: what an operator writes, what they get wrong, and the one-line errors they see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.config import find_config, load_cluster, parse_cluster
from sparkconsole.errors import UserError
from sparkconsole.yamlsrc import load_text

GOOD = """\
nodes:
  - name: spark1
    address: 192.168.100.10
    ssh: {user: ops, port: 2222, identity: ~/.ssh/id_ed25519}
    container: vllm_node
  - name: spark2
    address: 192.168.100.11
endpoints:
  - {name: router, url: "http://192.168.100.10:4000", kind: router, node: spark1}
thresholds: {temp_margin_c: 4, headroom_floor_gib: 10}
agent: {interval_s: 0.25}
"""


def parse(text: str, file: str = "c.yaml"):
    return parse_cluster(load_text(text, file))


def test_good_file_parses_every_field():
    c = parse(GOOD)
    assert [n.name for n in c.nodes] == ["spark1", "spark2"]
    assert c.nodes[0].ssh.port == 2222 and c.nodes[0].ssh.user == "ops"
    assert c.head.name == "spark1" and c.nodes[1].role == "worker"
    assert c.endpoints[0].kind == "router" and c.endpoints[0].url == "http://192.168.100.10:4000"
    assert c.thresholds.temp_margin_c == 4 and c.thresholds.headroom_floor_gib == 10
    assert c.thresholds.stall_seconds == 30  # default kept
    assert c.agent_interval_s == 0.25


def test_default_endpoints_one_per_node():
    c = parse("nodes:\n  - {name: a, address: 10.0.0.1, vllm_port: 8001}\n  - {name: b, address: 'fd00::2'}\n")
    assert [e.url for e in c.endpoints] == ["http://10.0.0.1:8001", "http://[fd00::2]:8000"]


@pytest.mark.parametrize("text, line, field, words", [
    ("nodes:\n  - name: a\n    address: spark1.local\n", 3, "nodes[0].address", "mDNS"),
    ("nodes:\n  - name: a\n    address: 10.0.0.1\n    ssh: {port: 0}\n", 4, "nodes[0].ssh.port", "out of range"),
    ("nodes:\n  - name: a\n    address: 10.0.0.1\n    gpu: 1\n", 4, "nodes[0].gpu", "unknown key"),
    ("nodes:\n  - name: a\n    address: 10.0.0.1\n  - name: a\n    address: 10.0.0.2\n", 4, "nodes[1].name", "duplicate"),
    ("nodes:\n  - name: a\n", 2, "nodes[0]", "no address"),
    ("nodes: []\n", 1, "nodes", "at least one node"),
    ("nodes:\n  - {name: a, address: 10.0.0.1, role: boss}\n", 2, "nodes[0].role", "unknown role"),
    ("nodes:\n  - {name: a, address: 10.0.0.1}\nendpoints:\n  - {name: r, url: 'http://x.local:4000'}\n",
     4, "endpoints[0].url", "mDNS"),
    ("nodes:\n  - {name: a, address: 10.0.0.1}\nthresholds: {temp_margin_c: hot}\n", 3,
     "thresholds.temp_margin_c", "expected"),
    ("nodes:\n  - {name: a, address: 10.0.0.1}\n  - {name: b, address: 10.0.0.2}\n    bad: [\n", None, None, "not valid YAML"),
])
def test_errors_name_file_line_field_and_fix(text, line, field, words):
    with pytest.raises(UserError) as ei:
        parse(text, "cluster.yaml")
    err = ei.value
    msg = str(err)
    assert "\n" not in msg
    assert msg.startswith("cluster.yaml")
    assert words in msg
    assert "fix:" in msg
    if line is not None:
        assert err.line == line, msg
    if field is not None:
        assert err.field == field, msg


def test_alias_bomb_refused_quickly():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8))
    with pytest.raises(UserError, match="aliases"):
        parse(bomb)


def test_find_config_order(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert find_config() is None
    xdg = tmp_path / "xdg" / "sparkconsole" / "sparkconsole.yaml"
    xdg.parent.mkdir(parents=True)
    xdg.write_text(GOOD)
    assert find_config() == xdg
    (tmp_path / "sparkconsole.yaml").write_text(GOOD)
    assert find_config() == tmp_path / "sparkconsole.yaml"
    assert find_config("other.yaml") == Path("other.yaml")


def test_missing_file_is_one_line(tmp_path: Path):
    with pytest.raises(UserError, match="file not found"):
        load_cluster(tmp_path / "nope.yaml")


def test_cli_prints_one_line_and_exits_2(tmp_path: Path):
    bad = tmp_path / "c.yaml"
    bad.write_text("nodes:\n  - name: a\n    address: spark1.local\n")
    p = subprocess.run([sys.executable, "-m", "sparkconsole", "--cluster", str(bad), "status"],
                       capture_output=True, text=True, timeout=60)
    if "invalid choice" in p.stderr:
        pytest.skip("status command not built yet")
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr
    assert f"{bad}:3" in lines[0] and "address" in lines[0] and "fix:" in lines[0]
