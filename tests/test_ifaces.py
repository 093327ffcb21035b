"""Link interfaces discovered as spark-vllm-docker's autodiscover does (issue 18, item 5): parsers on recorded
real outputs (tests/fixtures/ifaces/README.md), `discover` over the real sshd test nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkconsole.errors import UserError
from sparkconsole.launch import ifaces
from sparkconsole.nodes.connect import make_transport
from tests.helpers import error_lines

FIX = Path(__file__).parent / "fixtures" / "ifaces"
SPARK_IBDEV = (FIX / "ibdev2netdev-spark-one-cable.txt").read_text()
# The playbook's netplan for node 1 (192.168.100.10/24 on enp1s0f1np1, .101.10 on enP2p1s0f1np1), in the format
# of the recorded `ip -o -4 addr show` below.
SPARK_ADDRS = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
               "5: enp1s0f1np1    inet 192.168.100.10/24 brd 192.168.100.255 scope global enp1s0f1np1\\       valid_lft forever preferred_lft forever\n"
               "7: enP2p1s0f1np1    inet 192.168.101.10/24 brd 192.168.101.255 scope global enP2p1s0f1np1\\       valid_lft forever preferred_lft forever\n")


def test_ibdev2netdev_up_ports():
    ports = ifaces.parse_ibdev2netdev(SPARK_IBDEV + "garbage line\n")
    assert [(p.device, p.netdev, p.up) for p in ports] == [
        ("roceP2p1s0f0", "enP2p1s0f0np0", False), ("roceP2p1s0f1", "enP2p1s0f1np1", True),
        ("rocep1s0f0", "enp1s0f0np0", False), ("rocep1s0f1", "enp1s0f1np1", True)]


def test_recorded_addresses_and_routes():
    addrs = ifaces.parse_ipv4_addrs((FIX / "ip-o-4-addr-testbed.txt").read_text())
    assert addrs["lo"] == ["127.0.0.1/8"] and len(addrs) >= 2
    assert ifaces.parse_route_get((FIX / "ip-route-get-loopback-testbed.txt").read_text()) == "lo"
    assert ifaces.parse_route_get((FIX / "ip-route-get-eth0-testbed.txt").read_text()) == "eth0"
    assert ifaces.parse_route_get("RTNETLINK answers: Network is unreachable") is None


def test_choose_as_autodiscover_does():
    ports = ifaces.parse_ibdev2netdev(SPARK_IBDEV)
    # both Up ports are RDMA devices, in ibdev2netdev's order; Ethernet: the lower-case name with an address
    assert ifaces.choose(ports, ifaces.parse_ipv4_addrs(SPARK_ADDRS)) == ("enp1s0f1np1", "roceP2p1s0f1,rocep1s0f1")
    # only the capital-P twin has an address: it is the one
    only_p = {"enP2p1s0f1np1": ["192.168.101.10/24"]}
    assert ifaces.choose(ports, only_p) == ("enP2p1s0f1np1", "roceP2p1s0f1,rocep1s0f1")
    assert ifaces.choose(ports, {}) == (None, "roceP2p1s0f1,rocep1s0f1")
    down = ifaces.parse_ibdev2netdev(SPARK_IBDEV.replace("(Up)", "(Down)"))
    assert ifaces.choose(down, ifaces.parse_ipv4_addrs(SPARK_ADDRS)) == (None, None)


def probe_output(ibdev: str, addrs: str, route: str) -> str:
    s = ifaces._SECTION
    return f"{ibdev}{s}\n{addrs}{s}\n{route}"


def test_parse_probe_sources():
    route = (FIX / "ip-route-get-eth0-testbed.txt").read_text()
    assert ifaces.parse_probe(probe_output(SPARK_IBDEV, SPARK_ADDRS, route))[:2] == ("enp1s0f1np1",
                                                                                   "roceP2p1s0f1,rocep1s0f1")
    eth, ib, how = ifaces.parse_probe(probe_output("", SPARK_ADDRS, route))
    assert (eth, ib) == ("eth0", None) and "route to the peer" in how
    eth, ib, how = ifaces.parse_probe(probe_output(SPARK_IBDEV, "", route))
    assert (eth, ib) == ("eth0", "roceP2p1s0f1,rocep1s0f1") and "no Up port has an address" in how


def transport(sshd_nodes, i):
    cfg = sshd_nodes.cluster_config()
    return make_transport(cfg.nodes[i], cfg.ssh)


@pytest.mark.sshd
async def test_discover_over_the_real_sshd_nodes(sshd_nodes):
    t = transport(sshd_nodes, 0)
    try:
        eth, ib, how = await ifaces.discover(t, sshd_nodes[1].address)
    finally:
        await t.close()
    assert (eth, ib) == ("lo", None) and "route" in how


@pytest.mark.sshd
async def test_discover_refuses_a_bad_address_and_names_a_vanished_node(sshd_live):
    t = transport(sshd_live, 1)
    try:
        with pytest.raises(UserError, match="bad peer address"):
            await ifaces.discover(t, "127.0.0.2; rm -rf /")
        await ifaces.discover(t, sshd_live[0].address)        # connected
        sshd_live[1].kill()
        with pytest.raises(UserError, match=r"node2: cannot discover the link interfaces") as ei:
            await ifaces.discover(t, sshd_live[0].address)
        assert "\n" not in str(ei.value)
    finally:
        await t.close()


@pytest.mark.sshd
def test_a_cluster_plan_without_interfaces_gets_them_from_the_nodes(sshd_nodes, tmp_path):
    """`recipe plan -T cluster-tp2` of a recipe and a cluster file that name no interface: each node's is read
    from the node over SSH and shown in the plan; `--offline` reads nothing and says what is missing."""
    import subprocess
    import sys

    import yaml

    from sparkconsole.recipes import find_recipe
    doc = yaml.safe_load(open(find_recipe("gpt-oss-120b").source).read())
    doc["sparkconsole"]["cluster"].pop("eth_if", None)
    doc["sparkconsole"]["cluster"].pop("ib_if", None)
    recipe = tmp_path / "no-ifaces.yaml"
    recipe.write_text(yaml.safe_dump(doc, sort_keys=False))
    cluster = tmp_path / "sparkconsole.yaml"
    cluster.write_text("nodes:\n" + "".join(
        f"  - {{name: {n.name}, address: {n.address}, ssh: {{user: {n.user}, port: {n.port}, identity: {n.identity}}}}}\n"
        for n in sshd_nodes) + f"ssh: {{known_hosts: {sshd_nodes.known_hosts}}}\n")

    def plan(*extra):
        return subprocess.run([sys.executable, "-m", "sparkconsole", "recipe", "plan", str(recipe), "-T", "cluster-tp2",
                               "--cluster", str(cluster), *extra], capture_output=True, text=True, timeout=120)
    r = plan()
    assert r.returncode == 0, r.stderr
    assert "note: node1: eth_if lo discovered (route to the peer" in r.stdout
    assert "note: node2: eth_if lo discovered (route to the peer" in r.stdout
    assert r.stdout.count("NCCL_SOCKET_IFNAME=lo") == 2
    off = plan("--offline")
    err = error_lines(off.stderr)
    assert off.returncode == 2 and "needs the network interface" in off.stderr and len(err) == 1
