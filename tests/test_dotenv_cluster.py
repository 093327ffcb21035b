"""A spark-vllm-docker checkout's `.env` as the cluster (issue 23 item 4), and the one line every command says
about where its cluster came from (issue 24 item 8, first half).

The `.env` here is the forks' own `.env.example` text (CLUSTER_NODES head first, ETH_IF, IB_IF, MASTER_PORT,
CONTAINER_NAME, CONTAINER_*), read as launch-cluster.sh reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole import secrets
from sparkconsole.clusterfile import resolve
from sparkconsole.config import load_cluster
from sparkconsole.dotenv_cluster import checkout_env, cluster_from_dotenv
from sparkconsole.errors import UserError

# The runner's .env.example (forks with a .env: forwis, wentbackward), values as published.
EXAMPLE = """\
# Example .env configuration file for spark-vllm-docker
CLUSTER_NODES="192.168.177.11,192.168.177.12"
ETH_IF="enp1s0f1np1"
IB_IF="rocep1s0f1,roceP2p1s0f1"
LOCAL_IP="192.168.177.11"
MASTER_PORT="29501"
CONTAINER_NAME="vllm_node"
CONTAINER_NCCL_DEBUG="INFO"
CONTAINER_HF_TOKEN="hf_examplesecretvalue"
CONTAINER_NCCL_IGNORE_CPU_AFFINITY="1"
COPY_HOSTS="192.168.177.12"
# CONTAINER_MAX_JOBS="16"
"""


def checkout(tmp_path: Path, env: str, marker: str = "launch-cluster.sh") -> Path:
    d = tmp_path / "spark-vllm-docker"
    d.mkdir(exist_ok=True)
    (d / marker).write_text("#!/bin/bash\n")
    (d / ".env").write_text(env)
    return d


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """No cluster file of the operator's own, and an SSH config of the test's."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(h / ".config"))
    return h


def test_the_example_env_is_the_runner_s_cluster(tmp_path):
    c = cluster_from_dotenv(checkout(tmp_path, EXAMPLE) / ".env").cluster
    assert [(n.name, n.address, n.role) for n in c.nodes] == [("spark1", "192.168.177.11", "head"),
                                                               ("spark2", "192.168.177.12", "worker")]
    for n in c.nodes:
        assert (n.eth_if, n.ib_if, n.container) == ("enp1s0f1np1", "rocep1s0f1,roceP2p1s0f1", "vllm_node")
        # CONTAINER_ removed as the runner removes it; CONTAINER_NAME is the name, not a variable
        assert dict(n.vllm_env) == {"NCCL_DEBUG": "INFO", "NCCL_IGNORE_CPU_AFFINITY": "1"}
    assert c.master_port == 29501 and c.head.name == "spark1"
    assert [e.url for e in c.endpoints] == ["http://192.168.177.11:8000", "http://192.168.177.12:8000"]


def test_a_secret_is_not_passed_by_value_and_never_shown(tmp_path):
    got = cluster_from_dotenv(checkout(tmp_path, EXAMPLE) / ".env")
    assert all("HF_TOKEN" not in dict(n.vllm_env) for n in got.cluster.nodes)
    assert any("CONTAINER_HF_TOKEN" in note and "hf_examplesecretvalue" not in note for note in got.notes)
    assert "hf_examplesecretvalue" not in secrets.redact("token hf_examplesecretvalue here")


def test_ssh_settings_come_from_the_ssh_config_as_plain_ssh_finds_them(tmp_path, home):
    (home / ".ssh" / "config").write_text("Host 192.168.177.12\n  User ops\n  Port 2222\n  IdentityFile ~/.ssh/k\n"
                                          "  UserKnownHostsFile ~/.ssh/spark_hosts\n")
    c = cluster_from_dotenv(checkout(tmp_path, EXAMPLE) / ".env").cluster
    assert c.nodes[0].ssh.port == 22 and c.nodes[0].ssh.user is None
    assert (c.nodes[1].ssh.user, c.nodes[1].ssh.port, c.nodes[1].ssh.identity) == ("ops", 2222, "~/.ssh/k")
    assert c.ssh.known_hosts == "~/.ssh/spark_hosts"


def test_no_cluster_nodes_is_this_machine_with_the_file_s_settings(tmp_path):
    got = cluster_from_dotenv(checkout(tmp_path, 'CONTAINER_NAME=mine\nCONTAINER_VLLM_LOGGING_LEVEL=DEBUG\n') / ".env")
    [n] = got.cluster.nodes
    assert n.local and n.container == "mine" and dict(n.vllm_env) == {"VLLM_LOGGING_LEVEL": "DEBUG"}
    assert any("this machine" in note for note in got.notes)


@pytest.mark.parametrize("text, line, field, words", [
    ('CLUSTER_NODES=10.0.0.1\nnot a setting\n', 2, None, "not a NAME=value line"),
    ('CLUSTER_NODES=10.0.0.1\nETH_IF=eth0\nETH_IF=eth1\n', 3, "ETH_IF", "set twice (lines 2 and 3)"),
    ('MASTER_PORT=abc\n', 1, "MASTER_PORT", "is not a port"),
    ('MASTER_PORT=70000\n', 1, "MASTER_PORT", "is not a port"),
    ('\n\nCLUSTER_NODES=spark-a.local,10.0.0.2\n', 3, "CLUSTER_NODES", "mDNS name 'spark-a.local' refused"),
    ('CLUSTER_NODES=10.0.0.1,10.0.0.1\n', 1, "CLUSTER_NODES", "listed twice"),
    ('ETH_IF="eth0; rm -rf /"\n', 1, "ETH_IF", "bad interface name"),
    ('CONTAINER_NAME=-x\n', 1, "CONTAINER_NAME", "bad container name"),
    ('CLUSTER_NODES=10.0.0.1\nHF_HOME=~/hf\n', 2, "HF_HOME", "is not an absolute path"),
])
def test_a_bad_env_is_one_line_naming_file_line_variable_and_fix(tmp_path, text, line, field, words):
    env = checkout(tmp_path, text) / ".env"
    with pytest.raises(UserError) as e:
        cluster_from_dotenv(env)
    msg = str(e.value)
    assert "\n" not in msg and words in msg and "fix:" in msg
    assert msg.startswith(f"{env}:{line}: " + (f"{field}: " if field else ""))


def test_a_dotenv_without_the_runner_beside_it_is_not_a_checkout(tmp_path):
    d = tmp_path / "elsewhere"
    d.mkdir()
    (d / ".env").write_text(EXAMPLE)
    assert checkout_env(d) is None
    assert resolve(cwd=d).cluster.nodes[0].local


@pytest.mark.parametrize("marker", ["launch-cluster.sh", "run-recipe.py", "run-recipe.sh"])
def test_a_checkout_is_known_by_its_runner(tmp_path, marker):
    assert checkout_env(checkout(tmp_path, EXAMPLE, marker)) is not None


def test_origin_lines(tmp_path, home, monkeypatch):
    d = checkout(tmp_path, EXAMPLE)
    got = resolve(cwd=d)
    assert got.origin.startswith(f"cluster: .env of the spark-vllm-docker checkout at {d.resolve()} (2 nodes")
    assert "hf_examplesecretvalue" not in got.origin
    # a cluster file of sparkconsole's own wins over the .env, found from the same directory
    (d / "sparkconsole.yaml").write_text("nodes:\n  - {name: a, address: 10.0.0.5}\n")
    monkeypatch.chdir(d)
    got = resolve()
    assert got.origin == f"cluster: {(d / 'sparkconsole.yaml').resolve()}" and got.cluster.nodes[0].name == "a"
    # neither: this machine, and how to do better
    empty = tmp_path / "empty"
    empty.mkdir()
    got = resolve(cwd=empty)
    assert got.cluster.nodes[0].local
    assert got.origin == ("cluster: no sparkconsole.yaml found (looked in ./ and ~/.config/sparkconsole/): watching "
                          "this machine — write one with `sparkconsole init`")
    with pytest.raises(UserError, match="cluster file not found"):
        resolve(str(tmp_path / "missing.yaml"))


def test_half_a_checkout_is_named(tmp_path):
    # Issue 39: a .env with no runner beside it was ignored with only "no sparkconsole.yaml found"; the line now
    # names what is missing, and so does a runner with no .env.
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / ".env").write_text(EXAMPLE)
    got = resolve(cwd=lone)
    assert got.cluster.nodes[0].local
    assert "./.env is not read: none of launch-cluster.sh, run-recipe.py, run-recipe.sh is beside it" in got.origin
    assert got.origin.endswith("watching this machine — write one with `sparkconsole init`")
    runner = tmp_path / "runner"
    runner.mkdir()
    (runner / "run-recipe.py").write_text("")
    assert "./run-recipe.py is here but no .env beside it" in resolve(cwd=runner).origin


def test_master_port_in_the_cluster_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("nodes:\n  - {name: a, address: 10.0.0.5}\nmaster_port: 29600\n")
    assert load_cluster(p).master_port == 29600
    p.write_text("nodes:\n  - {name: a, address: 10.0.0.5}\n")
    assert load_cluster(p).master_port is None
    p.write_text("nodes:\n  - {name: a, address: 10.0.0.5}\nmaster_port: 0\n")
    with pytest.raises(UserError, match="c.yaml:3: master_port: port 0 out of range"):
        load_cluster(p)


def sc(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkconsole", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NO_COLOR": "1",
                                            "SPARKCONSOLE_STATE_DIR": str(cwd.parent / "state")})


def test_status_json_says_where_on_stderr_and_stdout_stays_json(tmp_path):
    # In a checkout whose .env names no nodes, status watches this machine with the .env's settings.
    d = checkout(tmp_path, "CONTAINER_NAME=mine\n")
    r = sc(d, "status", "--json", "--timeout", "30")
    data = json.loads(r.stdout)
    assert data["cluster"] == str(d.resolve() / ".env") and data["nodes"][0]["local"]
    assert r.stderr.splitlines()[0].startswith("cluster: .env of the spark-vllm-docker checkout at")


def test_recipe_plan_in_a_checkout_plans_the_env_s_two_nodes(tmp_path):
    # The complaint: in a checkout, a two-node recipe was planned on this machine alone.
    d = checkout(tmp_path, EXAMPLE)
    r = sc(d, "recipe", "plan", "gpt-oss-120b", "-T", "cluster-tp2", "--offline")  # reaches no node
    assert r.returncode == 0, r.stderr
    assert "192.168.177.11" in r.stdout and "192.168.177.12" in r.stdout and "hf_examplesecretvalue" not in r.stdout
    assert r.stderr.count("cluster: .env of the spark-vllm-docker checkout at") == 1


def test_a_bad_env_stops_a_command_with_its_one_line(tmp_path):
    d = checkout(tmp_path, "CLUSTER_NODES=10.0.0.1\nbroken\n")
    r = sc(d, "status", "--json")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"sparkconsole: {d.resolve() / '.env'}:2: broken: not a NAME=value line "
                                             "('broken') — fix: write NAME=value (quotes around a value with blanks), "
                                             "or start the line with #"]


async def test_the_console_shows_where_its_cluster_came_from(tmp_path, monkeypatch):
    # The console in a checkout, playing a recorded session on its node: the origin line is its first notice.
    import argparse

    from sparkconsole.commands.console import build_app
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    d = checkout(tmp_path, "CONTAINER_NAME=mine\n")
    monkeypatch.chdir(d)
    fixture = Path(__file__).parent / "fixtures" / "agent-h100-idle.jsonl"
    app = build_app(argparse.Namespace(cluster=None, replay=str(fixture), replay_interval=0.5, at=None))
    async with app.run_test() as pilot:
        await pilot.pause()
        said = [n.message for n in app._notifications]
        assert any(m.startswith(f"cluster: .env of the spark-vllm-docker checkout at {d.resolve()}") for m in said)
        await app.stop_monitors()


def test_the_env_s_hf_home_is_where_every_node_command_finds_the_models(tmp_path, monkeypatch):
    # Issue 39: forks' runners mount the HF_HOME their .env names. sparkconsole passes it to every command it runs
    # on the node (the plan's cache mount, `model pull`, preflight's model probe), and `init` keeps it.
    from sparkconsole.commands.init import render
    from sparkconsole.launch.runner import Runner
    hub = tmp_path / "hf"
    d = checkout(tmp_path, EXAMPLE + f"HF_HOME={hub}\n")
    got = cluster_from_dotenv(d / ".env")
    assert all(n.hf_home == str(hub) and dict(n.env) == {"HF_HOME": str(hub)} for n in got.cluster.nodes)
    assert Runner(got.cluster, {}).node_prefix("spark2") == f"HF_HOME={hub} "
    (tmp_path / "again.yaml").write_text(render(got.cluster, "a test"))
    again = load_cluster(tmp_path / "again.yaml")
    assert [n.hf_home for n in again.nodes] == [str(hub)] * 2 and dict(again.nodes[1].env) == {"HF_HOME": str(hub)}
    # on this machine as the one node: `model list` reads that cache
    (hub / "hub" / "models--org--m" / "snapshots" / "a").mkdir(parents=True)
    (tmp_path / "local").mkdir()
    local = checkout(tmp_path / "local", f"HF_HOME={hub}\n")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    r = sc(local, "model", "list", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["hub"] == str(hub / "hub")
