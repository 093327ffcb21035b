"""A node's network link cut (veth set down inside a namespace this test creates) for 5 s and for 60 s.

The cut node must go STALE, then DOWN, then come back LIVE by itself; the other node (a real sshd on loopback)
must keep ticking at its rate the whole time; nothing may escape as an exception or a logged traceback; the
console's memory must stay bounded; and no agent may be left behind on either node.
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

import psutil
import pytest

from sparkconsole.config import ClusterConfig, NodeConfig, SshPolicy, SshSettings
from sparkconsole.nodes.connect import make_transport
from sparkconsole.nodes.monitor import STALE_TICKS, ClusterMonitor, NodeMonitor
from sparkconsole.nodes.samples import NodeState
from sparkconsole.nodes.ssh import SshTransport
from sparkconsole.nodes.transport import KEEPALIVE_INTERVAL_S
from tests.faults.netns import netns_node, netns_unavailable
from tests.helpers import until

INTERVAL = 0.2
pytestmark = pytest.mark.sshd


@pytest.fixture
def cut_node(sshd_live, tmp_path):
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    with netns_node(Path(sshd_live.identity).with_suffix(".pub"), tmp_path) as node:
        yield node


def cluster(sshd_live, node, tmp_path) -> ClusterConfig:
    other = sshd_live[1]
    kh = tmp_path / "known_hosts"
    kh.write_text(sshd_live.known_hosts_lines() + node.known_hosts_line)
    import getpass
    nodes = (NodeConfig(name="cut", address=node.address, role="head", agent_args=("--containers", "none"),
                        ssh=SshSettings(user=getpass.getuser(), port=node.port, identity=sshd_live.identity)),
             NodeConfig(name="steady", address=other.address, role="worker", agent_args=("--containers", "none"),
                        ssh=SshSettings(user=other.user, port=other.port, identity=sshd_live.identity)))
    return ClusterConfig(nodes=nodes, endpoints=(), ssh=SshPolicy(known_hosts=str(kh), connect_timeout_s=5),
                         agent_interval_s=INTERVAL, source="<netns test bed>")



async def cut_and_heal(sshd_live, node, tmp_path, cut_s: float, transport_factory, *, down_within: float,
                       back_within: float) -> dict:
    loop_errors: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))
    mon = ClusterMonitor(cluster(sshd_live, node, tmp_path), transport_factory=transport_factory, history=300)
    states: list[NodeState] = []
    steady_rx: list[float] = []
    steady_states: set[NodeState] = set()
    last_seq: dict[str, int] = {}

    def on_change(nm: NodeMonitor) -> None:
        if nm.name == "cut" and (not states or states[-1] != nm.state):
            states.append(nm.state)
        if nm.name == "steady":
            steady_states.add(nm.state)
            if nm.last is not None and last_seq.get("steady") != nm.last.seq:
                last_seq["steady"] = nm.last.seq
                steady_rx.append(time.monotonic())
    mon.subscribe(on_change)
    proc = psutil.Process()
    await mon.start()
    cut, steady = mon.nodes["cut"], mon.nodes["steady"]
    try:
        await until(lambda: cut.state == steady.state == NodeState.LIVE and len(cut.history) >= 10, 30,
                    "both nodes LIVE")
        gc.collect()
        rss_before = proc.memory_info().rss
        steady_states.clear()

        node.link(False)
        t_cut = time.monotonic()
        try:
            t_stale = await until(lambda: cut.state == NodeState.STALE, 30, "STALE after the cut")
            t_down = await until(lambda: cut.state == NodeState.DOWN, down_within, "DOWN after the cut")
            await asyncio.sleep(max(0.0, cut_s - (time.monotonic() - t_cut)))
        finally:
            node.link(True)
        t_up = time.monotonic()
        t_back = await until(lambda: cut.state == NodeState.LIVE, back_within, "LIVE again after the link returned")
        await asyncio.sleep(1.0)
        gc.collect()
        rss_after = proc.memory_info().rss

        # The other node never stalled: its connection stayed up and its ticks kept arriving at rate through the cut.
        during = [t for t in steady_rx if t_cut <= t <= t_up]
        gaps = [b - a for a, b in zip(steady_rx, steady_rx[1:], strict=False)]
        assert NodeState.DOWN not in steady_states, steady_states
        # A loop blocked by the cut node would wait on the dead link, a keepalive interval (5 s) or more: one gap
        # that long. A busy 2-core machine delays ticks too (0.601 s once, 1.23 s while vLLM servers started
        # beside it, 2.64 s once at a clean-clone run's peak), and past 3 ticks (0.6 s here) the monitor rightly
        # calls that STALE, so a STALE alone is not the cut's doing: the bound is most of a keepalive interval.
        assert max(gaps) < max(2 * STALE_TICKS * INTERVAL, 0.8 * KEEPALIVE_INTERVAL_S), max(gaps)
        assert len(during) >= 0.7 * (t_up - t_cut) / INTERVAL, (len(during), t_up - t_cut)

        assert states[states.index(NodeState.LIVE):][:4] == [NodeState.LIVE, NodeState.STALE, NodeState.DOWN, NodeState.LIVE], states
        assert cut.connects >= 2 and cut.reboots == 0 and cut.last_error is None
        assert cut.bad_lines == 0 and steady.bad_lines == 0
        assert len(cut.history) <= 300 and len(steady.history) <= 300
        assert rss_after - rss_before < 32 * 2**20, (rss_before, rss_after)
        assert not loop_errors, loop_errors
        return {"stale_s": t_stale, "down_s": t_down, "back_s": t_back, "rss_growth": rss_after - rss_before}
    finally:
        await mon.stop()
        loop.set_exception_handler(None)
        # No agent left on the cut node: only the sshd listener remains in its namespace.
        await until(lambda: len(node.processes()) == 1, 10, "the cut node's agent to end")


@pytest.mark.fault("link cut for 5 s (keepalives 1 s × 2): STALE → DOWN → LIVE, other node unaffected")
async def test_link_cut_5s(sshd_live, cut_node, tmp_path):
    fast = lambda n, p: SshTransport(n, p, keepalive_interval=1.0, keepalive_count_max=2)  # noqa: E731
    r = await cut_and_heal(sshd_live, cut_node, tmp_path, 5, fast, down_within=5, back_within=45)
    assert r["stale_s"] < STALE_TICKS * INTERVAL + 1.0


@pytest.mark.slow
@pytest.mark.fault("link cut for 60 s (default keepalives): STALE → DOWN → LIVE, other node unaffected")
async def test_link_cut_60s(sshd_live, cut_node, tmp_path):
    from sparkconsole.nodes.transport import KEEPALIVE_COUNT_MAX, KEEPALIVE_INTERVAL_S
    budget = KEEPALIVE_INTERVAL_S * (KEEPALIVE_COUNT_MAX + 1) + 5
    r = await cut_and_heal(sshd_live, cut_node, tmp_path, 60, make_transport, down_within=budget, back_within=60)
    assert r["down_s"] < budget


@pytest.mark.fault("link blip of 5 s with default keepalives: STALE → LIVE, no tick lost")
async def test_link_blip_loses_no_tick(sshd_live, cut_node, tmp_path, ledger):
    """Shorter than the keepalive budget: the connection survives, the agent's ticks wait in the node's socket
    buffer and arrive when the link returns — the node is STALE meanwhile, never DOWN, and no tick is missing."""
    mon = ClusterMonitor(cluster(sshd_live, cut_node, tmp_path), history=1000)
    cut = mon.nodes["cut"]
    states: list[NodeState] = []
    mon.subscribe(lambda nm: nm is cut and (not states or states[-1] != nm.state) and states.append(nm.state))
    await mon.start()
    try:
        await until(lambda: cut.state == NodeState.LIVE and len(cut.history) >= 5, 30, "LIVE")
        cut_node.link(False)
        try:
            await until(lambda: cut.state == NodeState.STALE, 30, "STALE")
            await asyncio.sleep(5)
        finally:
            cut_node.link(True)
        t_up = time.monotonic()
        await until(lambda: cut.state == NodeState.LIVE, 30, "LIVE again on the same connection")
        await asyncio.sleep(1.0)
        seqs = [t.seq for t in cut.history]
        missing = (seqs[-1] - seqs[0] + 1) - len(set(seqs))
        ledger.lost(missing, "ticks across a 5 s link blip")
        assert NodeState.DOWN not in states and cut.connects == 1, states
        assert missing == 0 and seqs == sorted(seqs), seqs
        assert time.monotonic() - t_up < 30
    finally:
        await mon.stop()
