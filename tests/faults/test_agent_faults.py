"""The agent killed on its node, and the node "rebooted", on the real sshd test bed.

- agent killed: `pkill -KILL` over a second, separate SSH connection (as an operator or the OOM killer would):
  the node says DOWN with the reason, a new agent is started on the same connection settings, the node is LIVE
  again, and the console does not call it a reboot.
- reboot: sshd and the agent gone at once (the SSH connection drops), then the node back with a new boot id (the
  agent reads it from --proc-root DIR/sys/kernel/random/boot_id): the console counts one reboot, raises an alert
  that says so, and keeps the history it had.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from sparkconsole.alerts import AlertEngine
from sparkconsole.config import Thresholds
from sparkconsole.nodes.connect import make_transport
from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.nodes.samples import NodeState
from tests.helpers import until

pytestmark = pytest.mark.sshd



def fake_proc(root: Path, boot_id: str) -> Path:
    proc = root / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "vm").mkdir(parents=True, exist_ok=True)
    (proc / "meminfo").write_text("MemTotal: 127535104 kB\nMemAvailable: 100000000 kB\nCached: 5 kB\n")
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(boot_id + "\n")
    return proc


@pytest.mark.fault("agent killed on the node (pkill -KILL over a separate SSH session)")
async def test_agent_killed_on_the_node_is_restarted(sshd_live):
    interval = 0.17      # unique to this test, so pkill matches only this agent
    cfg = sshd_live.cluster_config(interval_s=interval, nodes=[sshd_live[0]])
    mon = ClusterMonitor(cfg)
    nm = mon.nodes["node1"]
    await mon.start()
    ops = make_transport(cfg.nodes[0], cfg.ssh)
    try:
        await until(lambda: nm.state == NodeState.LIVE and len(nm.history) >= 3, 20, "LIVE")
        boot, seen = nm.info.boot_id, len(nm.history)
        # [.] keeps the pattern from matching the shell that runs pkill itself.
        r = await ops.run("pkill -KILL -f -- '--interval 0[.]17 '; echo rc=$?")
        assert "rc=0" in r.stdout, r
        await until(lambda: nm.state == NodeState.DOWN, 30, "DOWN once the agent is gone")
        assert nm.last_error and "agent ended" in nm.last_error
        await until(lambda: nm.state == NodeState.LIVE, 30, "LIVE again with a new agent")
        assert nm.connects >= 2 and nm.reboots == 0 and nm.info.boot_id == boot
        assert len(nm.history) > seen and nm.bad_lines == 0
        r = await ops.run("pgrep -f -- '--interval 0[.]17 ' | xargs -r ps -o comm= -p | grep -c '^python'")
        assert r.stdout.strip() == "1"        # exactly one agent again, not one per attempt
    finally:
        await ops.close()
        await mon.stop()


@pytest.mark.fault("node rebooted (sshd and agent gone, back with a new boot id)")
async def test_rebooted_node_comes_back_counted_and_alerted(sshd_live, tmp_path):
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    proc = fake_proc(tmp_path, first)
    cfg = sshd_live.cluster_config(interval_s=0.2, nodes=[sshd_live[0]],
                                   agent_args=("--containers", "none", "--proc-root", str(proc)))
    mon = ClusterMonitor(cfg, history=1000)
    nm = mon.nodes["node1"]
    alerts = AlertEngine(Thresholds())
    events = []
    mon.subscribe(lambda n: events.extend(alerts.observe_node(n)))
    await mon.start()
    try:
        await until(lambda: nm.state == NodeState.LIVE and len(nm.history) >= 3, 20, "LIVE")
        assert nm.info.boot_id == first and nm.reboots == 0
        kept = len(nm.history)

        sshd_live[0].kill()                     # power gone: connection and agent drop at once
        await until(lambda: nm.state == NodeState.DOWN, 30, "DOWN")
        fake_proc(tmp_path, second)             # the node boots again: a new boot id
        sshd_live[0].start()
        await until(lambda: nm.state == NodeState.LIVE and nm.info.boot_id == second, 45, "LIVE on the new boot")
        assert nm.reboots == 1 and nm.boot_ids == [first, second]
        assert len(nm.history) > kept           # the readings from before the reboot are still there
        raised = [a for a in events if a.active and "reboot" in a.key]
        assert raised and "rebooted" in raised[0].message and raised[0].source == "node1", events
        assert any(a.key == "node:node1:state" and not a.active for a in events)   # DOWN cleared on return
    finally:
        await mon.stop()
