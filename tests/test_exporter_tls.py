"""`sparkconsole exporter --web-config-file`: TLS, basic auth and mutual TLS, scraped by Debian's Prometheus (2.42).

Real parts: a CA and certificates made at test time (tests/tlsca.py), the real command in a subprocess watching
this machine (its agent over the local transport), and Prometheus's own scrape loop with `scheme: https`,
`tls_config` and `basic_auth` — the targets' health and errors read back from its HTTP API.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.test_exporter import _query, _stop, _wait, get, need_prometheus
from tests.tlsca import TestCA, bcrypt_hash

PASSWORD = "scrape-password-0123"


def exporter(tmp_path: Path, web_config: Path, port: int, name: str) -> subprocess.Popen:
    from tests.testbed.sshd import _die_with_parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCONSOLE_")}
    env["SPARKCONSOLE_STATE_DIR"] = str(tmp_path / "state")
    d = tmp_path / name
    d.mkdir()
    # No cluster file in its directory: the exporter watches this machine (one local node, a real agent).
    return subprocess.Popen([sys.executable, "-m", "sparkconsole", "exporter", "--listen", f"127.0.0.1:{port}",
                             "--web-config-file", str(web_config)], cwd=d, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)


def fetch(url: str, ctx: ssl.SSLContext | None, auth: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def targets(pport: int) -> dict[str, dict]:
    try:
        status, _, body = get(f"http://127.0.0.1:{pport}/api/v1/targets")
    except OSError:
        return {}
    if status != 200:
        return {}
    return {t["labels"]["job"]: t for t in json.loads(body)["data"]["activeTargets"]}


def start_prometheus(tmp_path: Path, jobs: str) -> tuple[subprocess.Popen, int]:
    from tests.testbed.sshd import _die_with_parent
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
                   "scrape_configs:\n" + jobs)
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 — closed with the process
    proc = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, cwd=tmp_path)
    return proc, port


def job(name: str, port: int, *, scheme: str = "https", tls: str = "", auth: str = "") -> str:
    return (f"  - job_name: {name}\n    scheme: {scheme}\n" + (f"    tls_config: {{{tls}}}\n" if tls else "")
            + (f"    basic_auth: {{{auth}}}\n" if auth else "")
            + f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")


@pytest.mark.timeout(400)
def test_prometheus_scrapes_over_tls_with_basic_auth_and_client_certificates(tmp_path):
    """Two exporters: one with TLS + basic auth, one with mutual TLS (RequireAndVerifyClientCert). Prometheus
    scrapes both with the test CA: the right password and the client certificate make the targets up with
    sparkconsole's metrics; a wrong password is a 401, plain http to the TLS port fails, and a scraper without
    a client certificate is refused in the handshake."""
    need_prometheus()
    ca = TestCA(tmp_path / "pki")
    ca.issue("server")
    client = ca.issue("prometheus", server=False)
    (tmp_path / "password").write_text(PASSWORD + "\n")
    (tmp_path / "wrong").write_text("not-the-password\n")
    basic_cfg = tmp_path / "pki" / "web-basic.yml"
    basic_cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                         f"basic_auth_users:\n  prometheus: {bcrypt_hash(PASSWORD, cost=10)}\n")
    mtls_cfg = tmp_path / "pki" / "web-mtls.yml"
    mtls_cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
                        "  min_version: TLS13\n")
    p_basic, p_mtls = free_port(), free_port()
    exps = [exporter(tmp_path, basic_cfg, p_basic, "basic"), exporter(tmp_path, mtls_cfg, p_mtls, "mtls")]
    prom = None
    try:
        ctx = ssl.create_default_context(cafile=str(ca.ca_file))
        url = f"https://127.0.0.1:{p_basic}/metrics"

        def scraped():
            try:
                status, text = fetch(url, ctx, f"prometheus:{PASSWORD}")
            except OSError:
                return None
            return text if status == 200 and "sparkconsole_memory_total_bytes" in text else None
        _wait(scraped, 60, "the TLS exporter's first readings")
        assert fetch(url, ctx)[0] == 401
        assert fetch(url, ctx, "prometheus:wrong-password")[0] == 401
        with pytest.raises((OSError, ValueError)):          # plain HTTP to the TLS port: no HTTP answer
            fetch(f"http://127.0.0.1:{p_basic}/metrics", None, f"prometheus:{PASSWORD}")
        with pytest.raises(OSError):                        # mTLS without a client certificate: handshake refused
            fetch(f"https://127.0.0.1:{p_mtls}/metrics", ctx)

        ca_tls = f"ca_file: '{ca.ca_file}'"
        prom, pport = start_prometheus(tmp_path, "".join([
            job("tls_basic", p_basic, tls=ca_tls,
                auth=f"username: prometheus, password_file: '{tmp_path / 'password'}'"),
            job("wrong_password", p_basic, tls=ca_tls, auth=f"username: prometheus, password_file: '{tmp_path / 'wrong'}'"),
            job("plain_http", p_basic, scheme="http", auth=f"username: prometheus, password_file: '{tmp_path / 'password'}'"),
            job("mtls", p_mtls, tls=f"{ca_tls}, cert_file: '{client.cert}', key_file: '{client.key}'"),
            job("mtls_no_cert", p_mtls, tls=ca_tls),
        ]))
        want = {"tls_basic": "up", "mtls": "up", "wrong_password": "down", "plain_http": "down", "mtls_no_cert": "down"}
        # (a wrong password's scrape can also run past its 1 s timeout on a loaded machine: bcrypt is slow on
        # purpose; wait for a scrape of it that was answered)
        got = _wait(lambda: (t := targets(pport)) and all(t.get(j, {}).get("health") == h for j, h in want.items())
                    and "401" in t["wrong_password"].get("lastError", "") and t, 90,
                    f"Prometheus's targets to be {want}, the wrong password's answered with a 401")
        assert "401" in got["wrong_password"]["lastError"], got["wrong_password"]["lastError"]
        assert got["plain_http"]["lastError"], got["plain_http"]
        assert got["mtls_no_cert"]["lastError"], got["mtls_no_cert"]
        for j in ("tls_basic", "mtls"):
            mem = _wait(lambda j=j: _query(pport, f'sparkconsole_memory_total_bytes{{job="{j}"}}'), 60,
                        f"a sparkconsole metric scraped by job {j}")
            assert float(mem[0]["value"][1]) > 0
    finally:
        if prom is not None:
            _stop(prom)
        for e in exps:
            _stop(e)
    err = exps[0].stderr.read()
    # The line the operator reads says https, and what a client must send.
    assert f"metrics at https://127.0.0.1:{p_basic}/metrics (basic auth required)" in err, err
    assert PASSWORD not in err and "Traceback" not in err
    err = exps[1].stderr.read()
    assert f"metrics at https://127.0.0.1:{p_mtls}/metrics (client certificate required)" in err, err
