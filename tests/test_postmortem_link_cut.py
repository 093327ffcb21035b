"""The post-mortem of a real link cut: a node's sshd in a network namespace (tests/faults/netns.py), its veth set
down; the other node (a real sshd on loopback) keeps ticking. The recorder's post-mortem must say network loss,
with the agent's stream hung (STALE, then DOWN by keepalive) and the other node still ticking."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkconsole.config import SshSettings
from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.nodes.samples import NodeState
from sparkconsole.nodes.ssh import SshTransport
from sparkconsole.recorder.feed import Recorder
from tests.faults.netns import netns_node, netns_unavailable
from tests.helpers import until

pytestmark = pytest.mark.sshd


def cluster(sshd_live, node, tmp_path):
    """The sshd test bed's two-node config with node1 replaced by the namespaced node ("cut", "steady")."""
    import dataclasses
    import getpass
    base = sshd_live.cluster_config(interval_s=0.2)
    kh = tmp_path / "known_hosts"
    kh.write_text(sshd_live.known_hosts_lines() + node.known_hosts_line)
    cut = dataclasses.replace(base.nodes[0], name="cut", address=node.address,
                              ssh=SshSettings(user=getpass.getuser(), port=node.port, identity=sshd_live.identity))
    steady = dataclasses.replace(base.nodes[1], name="steady")
    return dataclasses.replace(base, nodes=(cut, steady), ssh=dataclasses.replace(base.ssh, known_hosts=str(kh)))


async def test_link_cut_post_mortem_says_network_loss(sshd_live, tmp_path):
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    fast = lambda n, p: SshTransport(n, p, keepalive_interval=1.0, keepalive_count_max=2)  # noqa: E731
    with netns_node(Path(sshd_live.identity).with_suffix(".pub"), tmp_path) as node:
        cfg = cluster(sshd_live, node, tmp_path)
        rec = Recorder.open(cfg, tmp_path / "r.sqlite")
        pms: list[dict] = []
        rec.on_postmortem = pms.append
        mon = ClusterMonitor(cfg, transport_factory=fast)
        rec.attach(mon)
        await mon.start()
        cut = mon.nodes["cut"]
        try:
            await until(lambda: cut.state == mon.nodes["steady"].state == NodeState.LIVE and len(cut.history) >= 10,
                        30, "both nodes LIVE")
            node.link(False)
            try:
                await until(lambda: pms, 30, "the post-mortem of the cut node")
            finally:
                node.link(True)
        finally:
            await mon.stop()
            await rec.wait_postmortems()
            rec.close()
    (pm,) = pms
    assert pm["node"] == "cut" and pm["verdict"] == "network-loss", pm["evidence"]
    assert pm["evidence"][0] == "other node(s) kept ticking: steady"
    assert any(e.startswith("memory was fine") for e in pm["evidence"])
    assert any("the agent's stream hung (STALE, then DOWN" in e for e in pm["evidence"])
