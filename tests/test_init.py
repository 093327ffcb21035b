"""`sparkconsole init` against real OpenSSH nodes on loopback (tests/testbed/sshd.py): the file it writes comes
from a spark-vllm-docker `.env` or from ~/.ssh/config, each node asked before it is written, and every command
then reads it (issue 23 item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import free_port

pytestmark = pytest.mark.sshd


def ssh_config(nodes, aliases: bool = True) -> str:
    """Host blocks for the test nodes: by alias (node1 → 127.0.0.2) or by address, as a runner user keeps them."""
    return "".join(f"Host {n.name if aliases else n.address}\n  HostName {n.address}\n  Port {n.port}\n"
                   f"  User {n.user}\n  IdentityFile {n.identity}\n  UserKnownHostsFile {n.known_hosts}\n"
                   for n in nodes)


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    return h


def sc(cwd: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1",
           "SPARKCONSOLE_STATE_DIR": str(home / "state")}
    return subprocess.run([sys.executable, "-m", "sparkconsole", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)


def live_nodes(r: subprocess.CompletedProcess) -> dict[str, str]:
    assert r.returncode == 0, r.stderr
    return {n["name"]: n["state"] for n in json.loads(r.stdout)["nodes"]}


def test_init_from_the_ssh_config_asks_each_node_and_writes_a_file_every_command_reads(sshd_nodes, tmp_path, home):
    (home / ".ssh" / "config").write_text(ssh_config(sshd_nodes))
    work = tmp_path / "work"
    work.mkdir()
    r = sc(work, home, "init", "--from-ssh-config", "node1", "node2")
    assert r.returncode == 0, r.stderr
    written = work / "sparkconsole.yaml"
    data = yaml.safe_load(written.read_text())
    assert [(n["name"], n["address"], n["ssh"]["port"], n["role"]) for n in data["nodes"]] == [
        ("node1", "127.0.0.2", sshd_nodes[0].port, "head"), ("node2", "127.0.0.3", sshd_nodes[1].port, "worker")]
    # the link interface each node reaches its peer by, found on the node itself (loopback here)
    assert [n["eth_if"] for n in data["nodes"]] == ["lo", "lo"]
    assert data["ssh"]["known_hosts"] == sshd_nodes.known_hosts
    assert "node1 (127.0.0.2): reachable" in r.stderr and "node2 (127.0.0.3): reachable" in r.stderr
    assert r.stdout.startswith(f"wrote {written}") and "- name: node1" in r.stdout
    # every command now finds it first, and says so
    r = sc(work, home, "status", "--json", "--timeout", "60")
    assert live_nodes(r) == {"node1": "LIVE", "node2": "LIVE"}
    assert r.stderr.splitlines()[0] == f"cluster: {written}"
    # a second init keeps the file
    before = written.read_text()
    r = sc(work, home, "init", "--from-ssh-config", "node1", "node2")
    assert r.returncode == 2 and "the file exists; it is kept as it is — fix: add --force" in r.stderr
    assert written.read_text() == before
    r = sc(work, home, "init", "--from-ssh-config", "node2", "node1", "--force")
    assert r.returncode == 0 and yaml.safe_load(written.read_text())["nodes"][0]["name"] == "node2"


def test_in_a_checkout_the_env_is_the_cluster_and_init_writes_its_equivalent(sshd_nodes, tmp_path, home):
    # The runner's user: a checkout with .env, and ~/.ssh/config saying how `ssh ADDRESS` logs in.
    (home / ".ssh" / "config").write_text(ssh_config(sshd_nodes, aliases=False))
    d = tmp_path / "spark-vllm-docker"
    d.mkdir()
    (d / "launch-cluster.sh").write_text("#!/bin/bash\n")
    (d / ".env").write_text('CLUSTER_NODES="127.0.0.2,127.0.0.3"\nMASTER_PORT=29533\nCONTAINER_NAME=vllm_test\n'
                            'CONTAINER_NCCL_DEBUG=INFO\nCOPY_HOSTS=127.0.0.3\n')
    # before init: status watches the .env's two nodes over SSH, and says where they came from
    r = sc(d, home, "status", "--json", "--timeout", "60")
    assert live_nodes(r) == {"spark1": "LIVE", "spark2": "LIVE"}
    assert r.stderr.splitlines()[0] == f"cluster: .env of the spark-vllm-docker checkout at {d.resolve()} (2 nodes)"
    r = sc(d, home, "init")
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load((d / "sparkconsole.yaml").read_text())
    assert data["master_port"] == 29533
    for n, sshd in zip(data["nodes"], sshd_nodes, strict=False):
        assert (n["address"], n["ssh"]["port"], n["container"], n["vllm_env"], n["eth_if"]) == (
            sshd.address, sshd.port, "vllm_test", {"NCCL_DEBUG": "INFO"}, "lo")
    # after: the file of sparkconsole's own is found first
    r = sc(d, home, "status", "--json", "--timeout", "60")
    assert live_nodes(r) == {"spark1": "LIVE", "spark2": "LIVE"}
    assert r.stderr.splitlines()[0] == f"cluster: {(d / 'sparkconsole.yaml').resolve()}"


def test_a_node_that_does_not_answer_is_said_and_nothing_is_written(sshd_nodes, tmp_path, home):
    dead = free_port("127.0.0.3")
    n = sshd_nodes[0]
    (home / ".ssh" / "config").write_text(
        ssh_config(sshd_nodes[:1]) + f"Host gone\n  HostName 127.0.0.3\n  Port {dead}\n  User {n.user}\n"
                                     f"  IdentityFile {n.identity}\n  UserKnownHostsFile {n.known_hosts}\n")
    r = sc(tmp_path, home, "init", "--from-ssh-config", "node1", "gone")
    assert r.returncode == 2 and r.stdout == ""
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("sparkconsole: nodes.gone: gone (127.0.0.3) does not answer over SSH") and "--no-probe" in line
    assert not (tmp_path / "sparkconsole.yaml").exists()
    r = sc(tmp_path, home, "init", "--from-ssh-config", "node1", "gone", "--no-probe")
    assert r.returncode == 0 and (tmp_path / "sparkconsole.yaml").is_file()


def test_init_with_nothing_to_read_says_what_to_give(tmp_path, home):
    r = sc(tmp_path, home, "init")
    assert r.returncode == 2 and "no spark-vllm-docker checkout (.env beside launch-cluster.sh) here" in r.stderr
    assert "--from-ssh-config" in r.stderr
    # half a checkout: what is missing is named (issue 39: "no … checkout with a .env here" beside a .env)
    (tmp_path / ".env").write_text("CLUSTER_NODES=192.0.2.1,192.0.2.2\n")
    r = sc(tmp_path, home, "init")
    assert r.returncode == 2 and "./.env is not read: none of launch-cluster.sh" in r.stderr
    (tmp_path / ".env").unlink()
    (tmp_path / "launch-cluster.sh").write_text("#!/bin/bash\n")
    r = sc(tmp_path, home, "init")
    assert r.returncode == 2 and "./launch-cluster.sh is here but no .env beside it" in r.stderr
    r = sc(tmp_path, home, "init", "--from-ssh-config", "nosuch")
    assert r.returncode == 2 and "no SSH client config" in r.stderr


def test_a_node_without_docker_is_refused_before_anything_is_written(tmp_path, home):
    # A node of its own whose sessions find only `env` and `sh` on their PATH: no docker there.
    from tests.testbed.sshd import _ensure_sshd, start_sshd_nodes
    if _ensure_sshd():
        pytest.skip("no sshd")
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    for tool in ("env", "sh"):
        (bare / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                                                text=True).stdout.strip())
    nodes = start_sshd_nodes(tmp_path / "sshd", ("127.0.0.4",), extra_config=f"SetEnv PATH={bare}\n")
    try:
        (home / ".ssh" / "config").write_text(ssh_config(nodes))
        r = sc(tmp_path, home, "init", "--from-ssh-config", "node1")
        assert r.returncode == 2 and not (tmp_path / "sparkconsole.yaml").exists()
        assert "node1: docker is not on the PATH of its SSH sessions" in r.stderr and "--no-probe" in r.stderr
    finally:
        nodes.stop()
