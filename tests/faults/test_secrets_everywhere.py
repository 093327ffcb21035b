"""Known secrets in the environment never appear in anything the console produced.

HF_TOKEN, the bench API key and a router master key are set to fresh random values. Then, with them in the
environment: `recipe plan` (CLI), a launch over the real sshd nodes whose secret is read from a file ON the node
(the docker shim checks it arrived, by hash, and a failing launch whose docker prints the token in its error), a
bench sweep against a loopback server (the key must reach the server, and the SQLite results are dumped), the
audit log, a TUI screenshot (SVG) of the console. Every file under the test's directory and every captured
stdout/stderr/exception text is then searched for the secrets.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from sparkconsole import audit, secrets
from sparkconsole.errors import UserError
from sparkconsole.launch.plan import make_plan
from sparkconsole.launch.runner import Runner
from sparkconsole.nodes.connect import make_transport
from sparkconsole.recipes import find_recipe

pytestmark = pytest.mark.sshd

SHIM = """\
#!{python}
import hashlib, json, os, sys
tok = os.environ.get("HF_TOKEN", "")
with open({log!r}, "a") as fh:
    fh.write(json.dumps({{"argv": sys.argv[1:], "hf_sha": hashlib.sha256(tok.encode()).hexdigest()}}) + "\\n")
if os.environ.get("SHIM_FAIL") and sys.argv[1:2] == ["run"]:
    sys.stderr.write("docker: Error response from daemon: invalid token " + tok + " for registry\\n")
    sys.exit(125)
"""


@pytest.fixture
def keys(monkeypatch, tmp_path):
    vals = {"HF_TOKEN": "hf_" + uuid.uuid4().hex + uuid.uuid4().hex[:6],
            "SPARKCONSOLE_API_KEY": "sk-" + uuid.uuid4().hex,
            "LITELLM_MASTER_KEY": "sk-master-" + uuid.uuid4().hex}
    for k, v in vals.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    secrets.register_env()        # what a fresh console process does on its first redaction
    return vals


def grep_everything(root: Path, texts: list[str], vals: dict[str, str]) -> list[str]:
    found = []
    for p in root.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            for k, v in vals.items():
                if v.encode() in data:
                    found.append(f"{k} in {p}")
    for i, t in enumerate(texts):
        for k, v in vals.items():
            if v in t:
                found.append(f"{k} in captured text #{i}: {t[:120]!r}")
    return found


def cli(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkconsole", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


@pytest.mark.fault("secrets in the environment and on the node: plans, launch, failed launch, bench, audit, TUI")
async def test_no_artefact_holds_a_secret(sshd_live, tmp_path, keys, ledger):
    captured: list[str] = []
    env = {**os.environ}

    # 1. plans, from the CLI
    cf = tmp_path / "cluster.yaml"
    cf.write_text("nodes:\n  - {name: spark1, address: 192.168.100.10}\n  - {name: spark2, address: 192.168.100.11}\n")
    for args in (["recipe", "plan", "gpt-oss-120b", "-T", "2x-solo", "--router", "simple-shuffle"],
                 ["recipe", "plan", "gpt-oss-120b", "-T", "cluster-tp2", "--backend", "ray"],
                 ["recipe", "lint", "gpt-oss-120b", "-T", "solo", "--offline"]):
        r = cli(["--cluster", str(cf), *args], env, tmp_path)
        captured += [r.stdout, r.stderr]
        ledger.output(r.stdout + r.stderr, "recipe " + " ".join(args))
        assert "Traceback" not in r.stderr
    assert "HF_TOKEN" in captured[0]           # passed by reference, by name

    # 2. a launch over real SSH; the token file lives on the node
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    log = tmp_path / "docker.jsonl"
    (shim_dir / "docker").write_text(SHIM.format(python=sys.executable, log=str(log)))
    (shim_dir / "docker").chmod(0o755)
    token_file = tmp_path / "node-secrets" / "hf_token"
    token_file.parent.mkdir()
    token_file.write_text(keys["HF_TOKEN"])
    recipe = find_recipe("tiny-testbed")
    recipe = replace(recipe, secrets=(_ref("HF_TOKEN", f"file:{token_file}"),))
    cfg = sshd_live.cluster_config()
    path_env = ("PATH", f"{shim_dir}:/usr/local/bin:/usr/bin:/bin")
    cluster = replace(cfg, nodes=tuple(replace(n, env=(path_env,)) for n in cfg.nodes))
    plan = make_plan(recipe, "solo", cluster, {})
    captured.append(plan.render())
    progress: list[str] = []
    transports = {n.name: make_transport(n, cluster.ssh) for n in cluster.nodes}
    try:
        runner = Runner(cluster, transports)
        await runner.launch(plan, lambda ev: progress.append(str(ev)), wait=False)
        await runner.stop(plan, lambda ev: progress.append(str(ev)))
        failing = replace(cluster, nodes=tuple(replace(n, env=(path_env, ("SHIM_FAIL", "1"))) for n in cfg.nodes))
        with pytest.raises(UserError) as ei:
            await Runner(failing, transports).launch(plan, lambda ev: progress.append(str(ev)), wait=False)
        captured.append(str(ei.value))
        assert "invalid token" in str(ei.value)        # the error itself is shown, its token masked
    finally:
        for t in transports.values():
            await t.close()
    captured += progress
    token_sha = hashlib.sha256(keys["HF_TOKEN"].encode()).hexdigest()
    runs = [x for x in log.read_text().splitlines() if '"run"' in x]
    assert runs and all(token_sha in x for x in runs)   # the token reached docker on the node, by reference
    token_file.unlink()                                  # the node's own copy is not an artefact of the console

    # 3. a bench sweep with the API key: the key must reach the server, and stay out of the results
    from tests.test_bench_helpers import FakeVllm
    seen_auth: list[str] = []
    srv = FakeVllm()
    srv_start = srv.start

    async def start_with_auth_log():
        from aiohttp import web

        @web.middleware
        async def auth_log(request, handler):
            seen_auth.append(request.headers.get("Authorization", ""))
            return await handler(request)
        orig = web.Application

        def app_with_mw(*a, **kw):
            return orig(*a, middlewares=[auth_log], **kw)
        web.Application = app_with_mw
        try:
            return await srv_start()
        finally:
            web.Application = orig
    await start_with_auth_log()
    try:
        results = tmp_path / "bench.sqlite"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sparkconsole", "bench", "run", "--url", srv.url, "--pp", "20", "--tg", "8",
            "-c", "1,2", "--runs", "1", "--latency-mode", "none", "--results", str(results),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=tmp_path)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        captured += [out.decode(), err.decode()]
        ledger.output(out + err, "bench run")
        assert proc.returncode == 0, err.decode()
    finally:
        await srv.stop()
    assert f"Bearer {keys['SPARKCONSOLE_API_KEY']}" in seen_auth
    db = sqlite3.connect(results)
    (tmp_path / "bench-dump.sql").write_text("\n".join(db.iterdump()))
    db.close()
    for fmt in ("md", "csv", "json"):
        r = cli(["bench", "report", str(results), "--format", fmt], env, tmp_path)
        captured += [r.stdout, r.stderr]

    # 4. the audit log of the launch
    entries = audit.read()
    assert entries and any("docker run" in e.command for e in entries)
    assert audit.log_path().is_file()

    # 5. the console's screen, as an SVG screenshot, with the secrets in its environment
    from sparkconsole.config import ClusterConfig, NodeConfig
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.nodes.replay import read_recording, replay_factory
    from sparkconsole.tui.app import SparkConsoleApp
    rec = read_recording(Path(__file__).parents[1] / "fixtures" / "agent-h100-load.jsonl")
    tcfg = ClusterConfig(nodes=(NodeConfig(name="spark1", address="127.0.0.1"),), endpoints=(), source="t.yaml")
    app = SparkConsoleApp(tcfg, monitor=ClusterMonitor(tcfg, transport_factory=replay_factory(
        lambda node: rec, interval=0.05)))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(1.0)
        app.save_screenshot(filename="console.svg", path=str(tmp_path))
        await pilot.press("3")
        await pilot.pause(0.5)
        app.save_screenshot(filename="console-3.svg", path=str(tmp_path))
    assert (tmp_path / "console.svg").stat().st_size > 1000

    canary = tmp_path / "canary"           # the search can fail: a planted copy is found
    canary.write_text("x" + keys["LITELLM_MASTER_KEY"] + "x")
    assert grep_everything(tmp_path, [], keys) == [f"LITELLM_MASTER_KEY in {canary}"]
    canary.unlink()
    leaks = grep_everything(tmp_path, captured, keys)
    assert leaks == [], leaks


def _ref(name, source):
    from sparkconsole.recipes import SecretRef
    return SecretRef(name, source)
