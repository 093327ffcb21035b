"""`sparkconsole status` end to end: the real command, a real cluster file, real sshd nodes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


def cluster_yaml(path: Path, sshd_nodes, *, extra_nodes: str = "", interval: float = 0.2) -> Path:
    nodes = "".join(
        f"  - name: {n.name}\n    address: {n.address}\n"
        f"    ssh: {{user: {n.user}, port: {n.port}, identity: {n.identity}}}\n" for n in sshd_nodes)
    path.write_text(f"nodes:\n{nodes}{extra_nodes}ssh: {{known_hosts: {sshd_nodes.known_hosts}, connect_timeout_s: 3}}\n"
                    f"agent: {{interval_s: {interval}}}\n")
    return path


def status(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 60):
    return subprocess.run([sys.executable, "-m", "sparkconsole", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=timeout)


def meminfo_kb(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


@pytest.mark.sshd
def test_status_json_over_ssh(sshd_live, tmp_path):
    cfg = cluster_yaml(tmp_path / "cluster.yaml", sshd_live)
    r = status("--cluster", str(cfg), "status", "--json", "--timeout", "20")
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    assert [n["name"] for n in snap["nodes"]] == ["node1", "node2"]
    for n in snap["nodes"]:
        assert n["state"] == "LIVE" and n["error"] is None
        assert n["tick"]["mem"]["total_kb"] == meminfo_kb("MemTotal")
        assert {g["key"] for g in n["guards"]} == {"swap", "overcommit", "min_free", "container_cap", "page_cache",
                                                   "earlyoom"}
        assert n["info"]["interval_s"] == 0.2


@pytest.mark.sshd
def test_status_table_names_the_down_node_and_fails(sshd_live, tmp_path):
    with socket.socket() as s:           # bound, not listening: refused at once
        s.bind(("127.0.0.4", 0))
        port = s.getsockname()[1]
        extra = f"  - name: gone\n    address: 127.0.0.4\n    ssh: {{port: {port}}}\n"
        cfg = cluster_yaml(tmp_path / "cluster.yaml", sshd_live, extra_nodes=extra)
        r = status("--cluster", str(cfg), "status", "--timeout", "20")
    assert r.returncode == 1, r.stderr
    rows = {line.split()[0]: line.split()[1] for line in r.stdout.splitlines()[2:5]}
    assert rows == {"node1": "LIVE", "node2": "LIVE", "gone": "DOWN"}
    assert any(line.startswith("gone:") and "unreachable" in line for line in r.stdout.splitlines())
    assert "Traceback" not in r.stderr


def test_status_without_a_cluster_file_reads_this_machine(tmp_path):
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    r = status("status", "--json", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    (n,) = json.loads(r.stdout)["nodes"]
    assert n["local"] and n["state"] == "LIVE" and n["tick"]["mem"]["total_kb"] == meminfo_kb("MemTotal")
    assert n["info"]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_bad_cluster_file_is_one_line(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("nodes:\n  - name: a\n    address: spark.local\n")
    r = status("--cluster", str(bad), "status")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "c.yaml:3" in r.stderr and "address" in r.stderr


def _agents_with_interval(interval: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cl = p.info["cmdline"] or []
        if "--interval" in cl and cl[cl.index("--interval") + 1] == interval and any("sys.stdin.buffer" in c for c in cl):
            out.append(p.pid)
    return out


def _agents_left(interval: str, within: float) -> list[int]:
    """The agents of that interval still running after waiting up to `within` seconds for them to end."""
    deadline = time.monotonic() + within
    while _agents_with_interval(interval) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _agents_with_interval(interval)


def test_watch_refreshes_until_ctrl_c_and_leaves_no_agent(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nodes:\n  - {name: here, address: 127.0.0.1, local: true}\nagent: {interval_s: 0.27}\n")
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "sparkconsole", "--cluster", str(cfg),
                             "status", "--watch"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        snaps = 0
        deadline = time.monotonic() + 30
        while snaps < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            snaps += line.startswith("NODE")
        assert snaps == 2
        assert _agents_with_interval("0.27")
        proc.send_signal(signal.SIGINT)
        # communicate, not wait: both pipes drained while it shuts down (a loaded machine can fill one with
        # snapshots or log lines, and a writer blocked on a full pipe never exits)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)          # faulthandler: every thread's stack, to say where it hung
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"status --watch did not end after Ctrl-C; its stacks:\n{err[-6000:]}") from None
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _agents_left("0.27", within=5) == []


def test_a_reader_that_leaves_early_gets_sigpipes_status_and_no_agent_left(tmp_path):
    """`sparkconsole status | head`: the same quiet end as every other command (cli.main: exit 141, as cat does),
    and the node monitors still stop."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nodes:\n  - {name: here, address: 127.0.0.1, local: true}\nagent: {interval_s: 0.31}\n")
    p = subprocess.Popen([sys.executable, "-m", "sparkconsole", "--cluster", str(cfg), "status", "--json"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(120) == 141 and "Traceback" not in err, err
    assert _agents_left("0.31", within=10) == []


TGKILL = {"x86_64": 234, "aarch64": 131}      # the syscall number: a signal to one thread of another process


@pytest.mark.skipif(os.uname().machine not in TGKILL, reason="tgkill's number is known for x86_64 and aarch64 only")
def test_ctrl_c_delivered_to_a_helper_thread_still_ends_the_command(tmp_path):
    """The kernel gives a process's SIGINT to any of its threads. Delivered to asyncio's child-watcher thread (the
    one waiting on the agent) it must still end `status --watch`: the loop takes SIGINT through its wake-up fd
    (cli._ctrl_c_cancels), which does not depend on the main thread noticing a pending signal."""
    import ctypes
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nodes:\n  - {name: here, address: 127.0.0.1, local: true}\nagent: {interval_s: 0.29}\n")
    proc = subprocess.Popen([sys.executable, "-m", "sparkconsole", "--cluster", str(cfg), "status", "--watch"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        snaps, deadline = 0, time.monotonic() + 30
        while snaps < 2 and time.monotonic() < deadline:
            snaps += proc.stdout.readline().startswith("NODE")
        assert snaps == 2
        helpers = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert helpers, "no helper thread to deliver the signal to"
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(TGKILL[os.uname().machine], proc.pid, helpers[0], signal.SIGINT) == 0
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _agents_left("0.29", within=5) == []


def test_status_shows_each_workload_from_the_recorded_h200():
    """`status --json` carries what each container holds (the H200 recording's last tick, as the real agent sent
    it), and the table says it per workload; a part not measured says why."""
    from sparkconsole.commands.status import node_record, render_table
    from sparkconsole.config import NodeConfig
    from sparkconsole.nodes.monitor import NodeMonitor
    from sparkconsole.nodes.samples import Tick
    rec = json.loads((ROOT / "tests" / "fixtures" / "nvidia-h200-gpu-procs.json").read_text())
    nm = NodeMonitor(NodeConfig(name="h200", address="127.0.0.1"), None, interval=0.5, history=4)
    nm.last = Tick.from_json(rec["agent"]["lines"][-1], time.time())
    r = json.loads(json.dumps(node_record(nm)))
    w = r["workloads"]["alloc-3g"]
    assert (w["gpu_b"], w["cgroup_b"], w["cap_b"], w["measured"]) == (3764387840, 34078720, 1 << 30, True)
    assert [p["pid"] for p in w["procs"]] == [rec["cgroups"][1]["pid"]]
    assert r["tick"]["gpu_procs"]["procs"][1]["container"] == "alloc-3g"
    table = render_table([r])
    assert "h200: workload alloc-3g: GPU 3.5 GiB (PID 499) + cgroup 0.0 GiB of a 1.0 GiB cap = 3.5 GiB" in table
    nm.last = Tick.from_json({**rec["agent"]["lines"][-1], "gpu_procs": {"reason": "NVML gives no per-process "
                                                                          "memory on GPU 0 (NOT_SUPPORTED)"}}, 0)
    assert "GPU not measured + cgroup 0.0 GiB of a 1.0 GiB cap (GPU: NVML gives no per-process" in \
        render_table([node_record(nm)])
