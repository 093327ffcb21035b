"""Notifications against real local HTTP receivers (http.server on 127.0.0.1): one that answers, one that is down,
one that is slow, one that fails with 500."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkconsole import secrets
from sparkconsole.alerts import Alert
from sparkconsole.config import NotifySettings
from sparkconsole.notify import notifier as nmod
from sparkconsole.notify.notifier import Notifier, redact_url

TOKEN = "tk_9f8e7d6c5b4a39281706"


class Receiver:
    def __init__(self, status: int = 200, hold: threading.Event | None = None) -> None:
        self.got: list[tuple[str, dict, bytes]] = []
        rec = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if hold is not None:
                    hold.wait(30)
                rec.got.append((self.path, dict(self.headers), body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setattr(nmod, "BACKOFF_S", 0.02)
    monkeypatch.setattr(nmod, "TIMEOUT_S", 5.0)


def alert(key="node:spark1:headroom", sev="bad", active=True, msg="spark1 MemAvailable 3.1 GiB, under the floor"):
    return Alert(key, sev, "spark1", msg, 1000.0, active)


def test_webhook_and_ntfy_get_raise_and_clear_once(fast_retries):
    rx = Receiver()
    rung = []
    try:
        n = Notifier(NotifySettings(webhook=f"{rx.url}/hook", ntfy=f"{rx.url}/sparkconsole-{TOKEN}", bell=True),
                     bell=lambda: rung.append(1), cluster="lab")
        assert n.submit(alert()) is True
        assert n.submit(alert()) is False                       # de-duplicated within the rate limit
        assert n.submit(alert(key="node:spark1:temp:gpu0", sev="info")) is False   # under min_severity
        assert n.submit(alert(key="node:spark9:x", active=False)) is False          # clear of a raise never sent
        assert n.submit(alert(active=False, msg="cleared: …")) is True
        assert n.flush()
        n.close()
    finally:
        rx.close()
    hooks = [json.loads(b) for p, h, b in rx.got if p == "/hook"]
    assert [(h["state"], h["severity"], h["node"], h["cluster"]) for h in hooks] == [
        ("raised", "bad", "spark1", "lab"), ("cleared", "bad", "spark1", "lab")]
    topics = [(h["Title"], h["Priority"], b.decode()) for p, h, b in rx.got if p != "/hook"]
    assert topics[0] == ("sparkconsole spark1: bad", "high", "spark1 MemAvailable 3.1 GiB, under the floor")
    assert topics[1][0] == "sparkconsole spark1: cleared"
    assert rung == [1]                                          # the bell for the bad raise only
    assert all(TOKEN not in url for _, url in n.sent) and any(url.endswith("/***") for _, url in n.sent)


def test_rate_limit_lets_a_raise_through_again_after_the_window():
    now = [0.0]
    n = Notifier(NotifySettings(rate_limit_s=60, bell=True), bell=lambda: None, clock=lambda: now[0])
    assert n.submit(alert()) and not n.submit(alert())
    now[0] = 61
    assert n.submit(alert())


def test_an_alert_announced_by_the_previous_holder_is_not_raised_again_but_its_clear_is():
    """collector/duties.py hands notifications between a collector and a console: what the other raised counts as
    sent (no second raise within the rate limit), its clear is sent; the rest as ever."""
    now = [0.0]
    n = Notifier(NotifySettings(rate_limit_s=60, bell=True), bell=lambda: None, clock=lambda: now[0])
    n.announced(["node:spark1:headroom"])
    assert not n.submit(alert())                                  # raised (and sent) by the previous holder
    assert n.submit(alert(key="node:spark2:headroom"))            # not announced: sent
    assert n.submit(alert(active=False))                          # its clear: sent
    now[0] = 61
    assert n.submit(alert())                                      # a new raise after the window: sent


def test_a_receiver_that_is_down_is_retried_then_given_up_without_leaking_the_token(fast_retries):
    with socket.socket() as s:       # bound, not listening: refused at once
        s.bind(("127.0.0.1", 0))
        url = f"http://user:{TOKEN}@127.0.0.1:{s.getsockname()[1]}/hook?token={TOKEN}"
        n = Notifier(NotifySettings(webhook=url))
        assert n.submit(alert()) is True
        assert n.flush()
    (line,) = n.failures
    assert "gave up: ConnectionRefusedError" in line and TOKEN not in line and "***" in line
    assert TOKEN not in secrets.redact(f"posting to {url} failed")


def test_a_5xx_is_retried_and_a_4xx_is_not(fast_retries):
    bad, refused = Receiver(status=503), Receiver(status=404)
    try:
        n = Notifier(NotifySettings(webhook=f"{bad.url}/h", ntfy=f"{refused.url}/t"))
        n.submit(alert())
        assert n.flush()
    finally:
        bad.close()
        refused.close()
    assert len(bad.got) == nmod.RETRIES + 1 and len(refused.got) == 1
    assert sorted(f.split(" gave up: ")[1] for f in n.failures) == ["HTTP 404", "HTTP 503"]


def test_a_slow_receiver_never_blocks_the_caller(fast_retries):
    hold = threading.Event()
    rx = Receiver(hold=hold)
    try:
        n = Notifier(NotifySettings(webhook=f"{rx.url}/hook"))
        for i in range(5):           # all queued while the receiver still holds the first request
            assert n.submit(alert(key=f"node:spark1:k{i}"))
        assert rx.got == []          # nothing delivered yet: submit() did not wait for the receiver
        hold.set()
        assert n.flush()
    finally:
        hold.set()
        rx.close()
    assert len(rx.got) == 5


def test_redact_url_shapes():
    assert redact_url(f"https://ntfy.sh/{TOKEN}") == "https://ntfy.sh/***"
    assert redact_url("http://127.0.0.1:9000/hook") == "http://127.0.0.1:9000/hook"
    assert redact_url(f"http://u:{TOKEN}@h/x?k={TOKEN}") == "http://***@h/x?k=***"


@pytest.mark.sshd
def test_unattended_record_sends_a_down_node_to_the_webhook(sshd_live, tmp_path):
    """`sparkconsole record` (a real process, real sshd nodes) runs the alert rules and notifies: a node that
    refuses connections is DOWN, and the webhook hears it; the file keeps the alert as an event."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from sparkconsole.recorder.reader import RecorderReader
    from tests.test_status import cluster_yaml
    rx = Receiver()
    try:
        with socket.socket() as s:         # bound, not listening: refused at once
            s.bind(("127.0.0.4", 0))
            extra = f"  - name: gone\n    address: 127.0.0.4\n    ssh: {{port: {s.getsockname()[1]}}}\n"
            cfg = cluster_yaml(tmp_path / "c.yaml", sshd_live, extra_nodes=extra)
            with open(cfg, "a") as fh:
                fh.write(f"notify: {{webhook: '{rx.url}/hook/{TOKEN}'}}\n")
            env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")}
            r = subprocess.run([sys.executable, "-m", "sparkconsole", "--cluster", str(cfg), "record", "--file",
                                str(tmp_path / "r.sqlite"), "--duration", "6"], capture_output=True, text=True,
                               cwd=Path(__file__).resolve().parent.parent, env=env, timeout=120)
    finally:
        rx.close()
    assert r.returncode == 0, r.stderr
    assert "gone DOWN" in r.stdout and TOKEN not in r.stdout + r.stderr
    hooks = [json.loads(b) for _, _, b in rx.got]
    assert any(h["node"] == "gone" and h["state"] == "raised" and h["severity"] == "bad" for h in hooks), hooks
    alerts = [e["data"] for e in RecorderReader(tmp_path / "r.sqlite").events("gone", 0, 2e9, ("alert",))]
    # (its endpoint's alert may come first: the collector's core feeds endpoint polls to the rules, as the console)
    assert any(a["key"] == "node:gone:state" for a in alerts), alerts
