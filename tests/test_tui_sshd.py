"""The console on real agents over real OpenSSH nodes on loopback (tests/testbed/sshd.py): the app builds its own
ClusterMonitor after the first frame, draws what this machine's agent reads, and follows a node through a silent
partition (STALE), a dropped connection (DOWN) and its return (LIVE), keeping the last values meanwhile."""

from __future__ import annotations

import pytest

from sparkconsole.nodes.samples import NodeState
from sparkconsole.tui.app import SparkConsoleApp
from tests.helpers import wait_for
from tests.screen import widget_text

pytestmark = pytest.mark.sshd


def panel_text(app, name: str) -> str:
    return widget_text(app.dashboard.panels[name])


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))


async def test_console_over_real_ssh_follows_a_node_down_and_back(sshd_nodes):
    cluster = sshd_nodes.cluster_config(interval_s=0.25)
    names = [n.name for n in cluster.nodes]
    app = SparkConsoleApp(cluster)
    node = sshd_nodes[1]
    try:
        async with app.run_test(size=(200, 60)) as pilot:
            await wait_for(pilot, lambda: app.monitor is not None and all(
                nm.state == NodeState.LIVE and len(nm.history) >= 2 for nm in app.monitor.nodes.values()),
                30, "both nodes LIVE over SSH")
            await pilot.pause(1.2)
            for name in names:
                nm = app.monitor.nodes[name]
                text = panel_text(app, name)
                mem = nm.last.mem
                total = f"of {mem.total_kb / 1048576:.1f} GiB free"
                assert total in text, f"{name}: the real MemTotal is not shown"
                assert "Swap off" in text and "vm.overcommit_memory" in text   # the guards from the real /proc
                assert "LIVE" in str(app.dashboard.panels[name].border_subtitle)
            # A silent partition: sshd stopped, nothing closed.
            node.freeze()
            second = names[1]
            await wait_for(pilot, lambda: app.monitor.nodes[second].state == NodeState.STALE, 15, "STALE")
            await pilot.pause(1.2)
            panel = app.dashboard.panels[second]
            assert panel.has_class("-stale") and "STALE" in str(panel.border_subtitle)
            assert "GiB free" in panel_text(app, second), "a STALE node must keep its last values"
            # The connection drops: DOWN, values still there.
            node.kill()
            await wait_for(pilot, lambda: app.monitor.nodes[second].state == NodeState.DOWN, 30, "DOWN")
            await pilot.pause(1.2)
            assert panel.has_class("-down") and "DOWN" in str(panel.border_subtitle)
            assert "GiB free" in panel_text(app, second)
            # It comes back on its own.
            node.restart()
            await wait_for(pilot, lambda: app.monitor.nodes[second].state == NodeState.LIVE, 60, "LIVE again")
            await pilot.pause(1.2)
            assert not panel.has_class("-stale") and not panel.has_class("-down")
            await pilot.press("q")
        # q ended the agents and closed the connections.
        assert all(nm._task is None for nm in app.monitor.nodes.values())
        assert all(not nm.transport.connected for nm in app.monitor.nodes.values())
    finally:
        if node.proc is None or node.proc.poll() is not None or node.frozen:
            node.restart()
