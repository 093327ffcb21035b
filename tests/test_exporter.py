"""`sparkconsole exporter`: the console's readings as Prometheus metrics, checked by Prometheus's own tools.

Real parts: the real sshd test nodes, the real command in a subprocess, Debian's `prometheus` (2.42) scraping it
on loopback and queried over its HTTP API, `promtool check metrics` / `check rules`. GPU figures come from a
recorded H100 session replayed through the monitor (this machine has no GPU).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.errors import UserError
from sparkconsole.exporter.listen import Listen, parse_listen
from sparkconsole.exporter.readings import Readings
from sparkconsole.exporter.server import ExporterServer
from tests.helpers import error_lines, free_port, until
from tests.test_status import cluster_yaml, meminfo_kb

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
TOKEN = "exporter-test-token-0123456789"


def need_prometheus() -> None:
    """promtool and prometheus come with Debian's `prometheus` (scripts/test installs it); install it if missing."""
    if shutil.which("promtool") and shutil.which("prometheus"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-qq", "--no-install-recommends", "prometheus"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if not (shutil.which("promtool") and shutil.which("prometheus")):
        pytest.skip("Debian's prometheus package could not be installed: "
                    + ((r.stderr.strip().splitlines() or ["?"])[-1]))


def get(url: str, token: str | None = None, accept: str | None = None, timeout: float = 5) -> tuple[int, str, str]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if accept:
        req.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def promtool_metrics(text: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)


def replayed_readings(path: Path, names=("spark1",)) -> Readings:
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.nodes.replay import replay_factory
    cluster = ClusterConfig(nodes=tuple(NodeConfig(name=n, address="127.0.0.1") for n in names), endpoints=(),
                            source="<replay>")
    return Readings(cluster, monitor=ClusterMonitor(cluster, transport_factory=replay_factory(str(path), interval=0.05)))


# ---------------------------------------------------------------------------------------------------------------------
def test_listen_parsing_and_policy():
    assert parse_listen("127.0.0.1:9835") == Listen("127.0.0.1", 9835)
    assert parse_listen("[::1]:9835").loopback and parse_listen("localhost:1").loopback
    assert not parse_listen("0.0.0.0:9835").loopback and not parse_listen("192.168.1.5:80").loopback
    for bad in ("9835", "127.0.0.1:", "127.0.0.1:99999", "spark.example:80", ":80"):
        with pytest.raises(UserError) as e:
            parse_listen(bad)
        assert "--listen" in str(e.value) and "fix:" in str(e.value)
    # Off loopback without a token: refused before anything listens.
    with pytest.raises(UserError, match="no token"):
        ExporterServer(replayed_readings(FIXTURES / "agent-h100-idle.jsonl"), Listen("0.0.0.0", 9835), None)


def test_cli_refuses_a_network_address_without_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SPARKCONSOLE_EXPORTER_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "sparkconsole", "exporter", "--listen", "0.0.0.0:9835"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert r.returncode == 2
    err = "".join(ln + "\n" for ln in error_lines(r.stderr))
    assert err.count("\n") == 1 and "no token was given" in err and "Traceback" not in err
    short = tmp_path / "short"
    short.write_text("abc\n")
    r = subprocess.run([sys.executable, "-m", "sparkconsole", "exporter", "--token-file", str(short)],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert r.returncode == 2 and "token too short" in r.stderr and "abc" not in r.stderr


async def test_recorded_h100_as_metrics_with_token():
    """A recorded H100 under load, replayed: every GPU family with node/gpu labels, the guard the recording breaks
    (vm.overcommit_memory=1) as state 2 and as a raised alert; text and OpenMetrics both pass promtool; the token
    is checked on every request."""
    need_prometheus()
    readings = replayed_readings(FIXTURES / "agent-h100-load.jsonl", names=("spark1", "spark2"))
    server = ExporterServer(readings, Listen("127.0.0.1", 0), TOKEN)
    await server.start()
    try:
        await until(lambda: all(nm.last is not None for nm in readings.monitor.nodes.values())
                    and readings.alerts.active, 20, "replayed ticks and an alert")
        url = f"http://127.0.0.1:{server.port}/metrics"
        import asyncio
        status, _, body = await asyncio.to_thread(get, url)
        assert status == 401 and "token" in body
        assert (await asyncio.to_thread(get, url, "wrong-token-wrong-token"))[0] == 401
        status, ctype, text = await asyncio.to_thread(get, url, TOKEN)
        assert status == 200 and ctype.startswith("text/plain")
        s = samples(text)
        gpu = (("gpu", "0"), ("node", "spark1"))
        assert s[("sparkconsole_gpu_slowdown_temperature_celsius", gpu)] == 89
        assert 20 < s[("sparkconsole_gpu_temperature_celsius", gpu)] < 89
        assert s[("sparkconsole_gpu_power_limit_watts", gpu)] == 700
        assert s[("sparkconsole_gpu_sm_clock_max_hertz", gpu)] == 1980e6
        assert 0 <= s[("sparkconsole_gpu_utilization_ratio", gpu)] <= 1
        assert {k[1] for k in s if k[0] == "sparkconsole_gpu_clock_event_active"} >= {
            (("gpu", "0"), ("node", "spark1"), ("reason", r)) for r in ("idle", "sw_power_cap", "hw_thermal")}
        assert ("sparkconsole_gpu_clock_event_seconds_total", (*gpu, ("reason", "sw_power_cap"))) in s
        node = (("node", "spark1"),)
        assert s[("sparkconsole_memory_total_bytes", node)] == 131981020 * 1024
        assert s[("sparkconsole_oom_guard_state", (("guard", "overcommit"), ("node", "spark1")))] == 2
        assert s[("sparkconsole_oom_guard_state", (("guard", "swap"), ("node", "spark1")))] == 0
        assert s[("sparkconsole_node_state", (("node", "spark1"), ("state", "LIVE")))] == 1
        assert 0 <= s[("sparkconsole_node_reading_age_seconds", node)] < 30
        assert s[("sparkconsole_alert_active", (("alert", "node:spark1:guard:overcommit"), ("severity", "bad"),
                                               ("source", "spark1")))] == 2
        assert s[("sparkconsole_alerts_active", (("severity", "bad"),))] >= 2
        r = promtool_metrics(text)
        assert r.returncode == 0, r.stdout + r.stderr
        status, ctype, om = await asyncio.to_thread(get, url, TOKEN, "application/openmetrics-text; version=1.0.0")
        assert status == 200 and ctype.startswith("application/openmetrics-text") and om.endswith("# EOF\n")
    finally:
        await server.stop()


# ---------------------------------------------------------------------------------------------------------------------
def _start_prometheus(tmp_path: Path, target_port: int, token_file: Path) -> tuple[subprocess.Popen, int]:
    from tests.testbed.sshd import _die_with_parent
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"""\
global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}
rule_files: ["{ROOT / 'contrib' / 'prometheus' / 'alerts.yml'}"]
scrape_configs:
  - job_name: sparkconsole
    authorization: {{credentials_file: "{token_file}"}}
    static_configs: [{{targets: ["127.0.0.1:{target_port}"]}}]
""")
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 — closed with the process
    proc = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, cwd=tmp_path)
    return proc, port


def _query(port: int, q: str) -> list[dict]:
    try:
        status, _, body = get(f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
    except OSError:          # not listening yet
        return []
    if status != 200:
        return []
    d = json.loads(body)
    return d["data"]["result"] if d.get("status") == "success" else []


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


@pytest.mark.sshd
def test_prometheus_scrapes_the_exporter_over_sshd(sshd_live, tmp_path):
    """The real command over the real sshd nodes, scraped by Debian's Prometheus with a bearer token from a
    file; Prometheus's API has the node's real MemTotal and its guard states; promtool passes the output; a
    frozen node does not hold a scrape up and shows as STALE."""
    from tests.testbed.sshd import _die_with_parent
    need_prometheus()
    cfg = cluster_yaml(tmp_path / "cluster.yaml", sshd_live)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    exp = subprocess.Popen([sys.executable, "-m", "sparkconsole", "--cluster", str(cfg), "exporter",
                            "--listen", f"127.0.0.1:{port}", "--token-file", str(token_file)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                           preexec_fn=_die_with_parent)
    prom = None
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def scraped():
            try:
                status, _, text = get(url, TOKEN)
            except OSError:
                return None
            return text if status == 200 and 'sparkconsole_oom_guard_state{guard="swap",node="node2"}' in text else None
        text = _wait(scraped, 60, "the exporter's first readings of both nodes")
        assert get(url)[0] == 401
        r = promtool_metrics(text)
        assert r.returncode == 0, r.stdout + r.stderr

        prom, pport = _start_prometheus(tmp_path, port, token_file)
        mem = _wait(lambda: _query(pport, 'sparkconsole_memory_total_bytes{node="node1"}'), 90,
                    "Prometheus to scrape node1's MemTotal")
        assert float(mem[0]["value"][1]) == meminfo_kb("MemTotal") * 1024
        guards = _wait(lambda: _query(pport, "sparkconsole_oom_guard_state"), 30, "guard states in Prometheus")
        got = {(g["metric"]["node"], g["metric"]["guard"]): float(g["value"][1]) for g in guards}
        assert got[("node1", "swap")] in (0, 2) and got[("node2", "overcommit")] in (0, 1, 2)
        up = _query(pport, 'up{job="sparkconsole"}')
        assert up and up[0]["value"][1] == "1"
        # The alert rules load and evaluate against these series (no rule errors).
        rules = json.loads(get(f"http://127.0.0.1:{pport}/api/v1/rules")[2])["data"]["groups"]
        assert rules and all(r.get("health") in ("ok", "unknown") for g in rules for r in g["rules"])

        # A frozen node: scrapes still answer at once from the last readings; the node turns STALE.
        sshd_live[1].freeze()
        stale = 'sparkconsole_node_state{node="node2",state="STALE"} 1.0'
        _wait(lambda: stale in get(url, TOKEN)[2], 30, "node2 to show as STALE")
        assert get(url, TOKEN, timeout=2)[0] == 200
    finally:
        if prom is not None:
            _stop(prom)
        _stop(exp)
        err = exp.stderr.read() if exp.stderr else ""
        assert TOKEN not in err
        (tmp_path / "tsdb").exists() and shutil.rmtree(tmp_path / "tsdb", ignore_errors=True)


def test_alert_rules_and_dashboard_are_valid():
    need_prometheus()
    rules = ROOT / "contrib" / "prometheus" / "alerts.yml"
    r = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    dash = json.loads((ROOT / "contrib" / "grafana" / "sparkconsole.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", ())]
    assert exprs and all("sparkconsole_" in e for e in exprs)


async def test_endpoint_figures_and_the_silent_stall_alert():
    """A real HTTP server answering like vLLM (a real prometheus_client registry, tests/test_endpoint.py) polled by
    the real ServingMonitor, on a replayed node: the engine figures become endpoint families, and requests running
    with no new token while the node's GPU draws under stall_power_w raise the console's silent-stall alert."""
    import asyncio

    from sparkconsole.config import EndpointConfig, Thresholds
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.nodes.replay import replay_factory
    from sparkconsole.serving.endpoint import ServingMonitor
    from tests.test_endpoint import MODEL, Server, vllm_routes
    from tests.test_serving_metrics import VllmExporter, seeded_workload

    need_prometheus()
    exp = seeded_workload(VllmExporter("v1"))          # 8 running, 3 waiting, and then no new token at all
    async with Server(vllm_routes(exp)) as srv:
        # stall_power_w above any recorded H100 reading: the stall rule's "GPU power low" holds
        cluster = ClusterConfig(nodes=(NodeConfig(name="spark1", address="127.0.0.1"),),
                                endpoints=(EndpointConfig(name="vllm1", url=srv.url, node="spark1"),),
                                thresholds=Thresholds(stall_seconds=0.6, stall_power_w=5000), source="<test>")
        mon = ClusterMonitor(cluster, transport_factory=replay_factory(str(FIXTURES / "agent-h100-load.jsonl"),
                                                                       interval=0.05))
        readings = Readings(cluster, monitor=mon, serving=ServingMonitor(cluster, interval=0.2))
        server = ExporterServer(readings, Listen("127.0.0.1", 0), None)
        await server.start()
        try:
            await until(lambda: "endpoint:vllm1:stall" in readings.alerts.active, 20, "the silent-stall alert")
            status, _, text = await asyncio.to_thread(get, f"http://127.0.0.1:{server.port}/metrics")
        finally:
            await server.stop()
    assert status == 200
    s = samples(text)
    e = (("endpoint", "vllm1"),)
    assert s[("sparkconsole_endpoint_up", e)] == 1
    assert (s[("sparkconsole_endpoint_requests_running", e)], s[("sparkconsole_endpoint_requests_waiting", e)]) == (8, 3)
    assert s[("sparkconsole_endpoint_kv_cache_usage_ratio", e)] == pytest.approx(0.41)
    assert s[("sparkconsole_endpoint_generation_tokens_total", e)] == 40 * 128
    assert s[("sparkconsole_endpoint_max_model_len_tokens", e)] == 4096
    info = next(k for k in s if k[0] == "sparkconsole_endpoint_info")
    assert dict(info[1]) == {"endpoint": "vllm1", "kind": "vllm", "model": MODEL, "version": "0.32.0",
                             "node": "spark1", "url": srv.url}
    assert s[("sparkconsole_alert_active", (("alert", "endpoint:vllm1:stall"), ("severity", "bad"),
                                           ("source", "vllm1")))] == 2
    r = promtool_metrics(text)
    assert r.returncode == 0, r.stdout + r.stderr


def test_endpoint_latency_percentiles_pass_promtool(monkeypatch):
    """A served endpoint's TTFT / ITL / router duration windows, from a real vLLM's recorded /metrics: the output
    passes `promtool check metrics` (a `quantile` label on a gauge does not: Prometheus keeps it for summaries)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from sparkconsole.exporter.collector import ConsoleCollector
    from sparkconsole.serving import metrics as vm
    from sparkconsole.serving import prom
    from sparkconsole.serving.endpoint import EndpointSnapshot

    need_prometheus()
    em = vm.engine_metrics(prom.parse(next(FIXTURES.glob("metrics-vllm-0.32.0-cpu*-recorded.txt")).read_text()))
    ttft, itl = (em.pct("ttft", 0.5), em.pct("ttft", 0.95)), (em.pct("itl", 0.5), em.pct("itl", 0.95))
    assert None not in (*ttft, *itl)
    snap = EndpointSnapshot("spark1", "http://127.0.0.1:8000", "vllm", time.time(), True, "tiny-llama", "0.32.0",
                            em.running, em.waiting, em.kv_usage, None, None, None, *ttft, *itl, None,
                            latency_p50_s=ttft[0], latency_p95_s=ttft[1])
    readings = replayed_readings(FIXTURES / "agent-h100-idle.jsonl")
    monkeypatch.setattr(readings, "endpoint_snapshots", lambda: [snap])
    registry = CollectorRegistry()
    registry.register(ConsoleCollector(readings))
    text = generate_latest(registry).decode()
    assert 'sparkconsole_endpoint_time_to_first_token_seconds{endpoint="spark1",percentile="95"}' in text
    r = promtool_metrics(text)
    assert r.returncode == 0, r.stdout + r.stderr


async def scraped(path: Path) -> str:
    """/metrics text of one replayed node (the collector alone, no server), once its first tick is in."""
    from prometheus_client import CollectorRegistry, generate_latest

    from sparkconsole.exporter.collector import ConsoleCollector
    readings = replayed_readings(path)
    await readings.start()
    try:
        await until(lambda: readings.monitor.nodes["spark1"].last is not None, 20, "a replayed tick")
        reg = CollectorRegistry()
        reg.register(ConsoleCollector(readings))
        return generate_latest(reg).decode()
    finally:
        await readings.stop()


async def test_recorded_h200_workloads_one_series_per_container(tmp_path):
    """The real agent's ticks from an H200 (tests/fixtures/nvidia-h200-gpu-procs.json: two containers' processes
    holding 1 GiB and 3 GiB allocations), replayed: each container is one series of GPU memory, cgroup usage and
    their sum, to the byte; promtool passes it. Before the node's processes are mapped there is no series (never a
    guess)."""
    need_prometheus()
    rec = json.loads((FIXTURES / "nvidia-h200-gpu-procs.json").read_text())
    lines = rec["agent"]["lines"]
    path = tmp_path / "h200.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [lines[0], *lines[2:]]) + "\n")   # from the first mapped tick
    text = await scraped(path)
    s = samples(text)
    for name, w in rec["workload_memory"].items():
        lab = (("container", name), ("node", "spark1"))
        assert s[("sparkconsole_workload_gpu_memory_bytes", lab)] == w["gpu_b"]
        assert s[("sparkconsole_workload_cgroup_memory_bytes", lab)] == w["cgroup_b"]
        assert s[("sparkconsole_workload_memory_bytes", lab)] == w["gpu_b"] + w["cgroup_b"]
    r = promtool_metrics(text)
    assert r.returncode == 0, r.stdout + r.stderr
    # the first tick came before the docker poll answered: its processes were not mapped yet, so no GPU series
    path.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n")
    assert "sparkconsole_workload_" not in await scraped(path)
