"""`sparkconsole serve --web-config-file`: the console's page and websocket over TLS (https, wss) with basic auth or
the token, in Debian's chromium (Playwright) trusting exactly the test server's key, and with aiohttp's client."""

from __future__ import annotations

import os
import re
import ssl
import subprocess
import sys
import time

import aiohttp
import pytest

from sparkconsole.exporter.listener import make_listener
from sparkconsole.webface.server import COOKIE, ConsoleServer
from tests.helpers import free_port, until
from tests.test_serve import CHROMIUM, CHROMIUM_ARGS, Screen, _listening, _need_browser, stop_serve
from tests.tlsca import TestCA, bcrypt_hash

TOKEN = "serve-tls-token-0123456789abcdef"
PASSWORD = "browser-password-0123"


@pytest.fixture
def pki(tmp_path):
    ca = TestCA(tmp_path / "pki")
    ca.server = ca.issue("server")
    return ca


async def test_token_over_tls_sets_a_secure_cookie_and_a_wss_page(pki):
    """The real app on a TLS listener with a token: plain http gets no answer, ?token= sets a Secure cookie, the
    page names wss://, the websocket opens over TLS with the cookie."""
    cfg = pki.dir / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                   "http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=300\n")
    listener = make_listener("127.0.0.1:0", token=TOKEN, web_config_file=str(cfg))
    server = ConsoleServer(listener, read_only=True, demo=False)
    server.command = "true"          # the console child is not what this test is about
    runner = await server.start_runner()
    base = f"https://127.0.0.1:{server.port}"
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    try:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientError):
                async with s.get(f"http://127.0.0.1:{server.port}/"):
                    pass
            async with s.get(base + "/", ssl=ctx) as r:
                assert r.status == 401 and r.headers["Strict-Transport-Security"] == "max-age=300"
            async with s.get(base + f"/?token={TOKEN}", ssl=ctx, allow_redirects=False) as r:
                assert r.status == 302
                morsel = r.cookies[COOKIE]
                assert morsel["secure"] and morsel["httponly"] and morsel["samesite"] == "Strict"
        async with aiohttp.ClientSession(cookies={COOKIE: TOKEN}) as s:
            async with s.get(base + "/", ssl=ctx) as r:
                assert r.status == 200 and f"wss://127.0.0.1:{server.port}/ws" in await r.text()
            ws = await s.ws_connect(base + "/ws?width=80&height=24", origin=base, ssl=ctx)
            await ws.close()
    finally:
        await runner.cleanup()


def test_generated_token_keeps_tls_and_users(pki, monkeypatch):
    """Off loopback with TLS and no users: a token is generated and the URL to open says https; with basic auth
    users, or required client certificates, none is generated (they ask who comes in)."""
    import argparse

    from sparkconsole.commands.serve import TOKEN_ENV, listener_for
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    cfg = pki.dir / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    args = argparse.Namespace(listen="0.0.0.0:8099", token=None, token_file=None, web_config_file=str(cfg),
                              read_only=None)
    listener, generated, read_only = listener_for(args)
    assert generated and read_only and listener.access.token and listener.access.users is None
    assert listener.tls and listener.url("/") == "https://0.0.0.0:8099/"
    cfg.write_text(cfg.read_text() + f"basic_auth_users:\n  alice: {bcrypt_hash('x')}\n")
    listener, generated, read_only = listener_for(args)
    assert not generated and read_only and listener.access.token is None and listener.access.users is not None
    cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                   "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n")
    listener, generated, read_only = listener_for(args)
    assert not generated and listener.access.token is None and listener.describe() == "client certificate required"


@pytest.mark.slow
async def test_chromium_opens_the_console_over_tls_with_basic_auth(pki, tmp_path):
    """`sparkconsole serve --demo --web-config-file` (TLS + basic_auth_users) in a subprocess. Chromium trusts
    exactly the test server's key (--ignore-certificate-errors-spki-list: without it the certificate is refused),
    asks for the user (401 without, and with a wrong password), and with the right one draws the console over wss."""
    pw_api = _need_browser()
    from tests.testbed.sshd import _die_with_parent
    cfg = pki.dir / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                   f"basic_auth_users:\n  operator: {bcrypt_hash(PASSWORD, cost=10)}\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCONSOLE_")}
    env["SPARKCONSOLE_STATE_DIR"] = str(tmp_path / "state")
    proc = subprocess.Popen([sys.executable, "-m", "sparkconsole", "serve", "--listen", f"127.0.0.1:{port}",
                             "--web-config-file", str(cfg), "--demo", "--read-only"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                            start_new_session=True)
    base = f"https://127.0.0.1:{port}"
    only_here = re.compile(r"^(?!(https|wss)://127\.0\.0\.1[:/]).*")
    try:
        await until(lambda: _listening(port), 60, "the server to listen")
        async with pw_api.async_playwright() as pw:
            untrusting = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = await untrusting.new_page()
                with pytest.raises(pw_api.Error, match="ERR_CERT_AUTHORITY_INVALID"):
                    await page.goto(base + "/")
            finally:
                await untrusting.close()
            browser = await pw.chromium.launch(
                executable_path=CHROMIUM, headless=True,
                args=CHROMIUM_ARGS + [f"--ignore-certificate-errors-spki-list={pki.server.spki_sha256_b64}"])
            try:
                # Without credentials, and with a wrong password: the server answers 401, and the browser shows it
                # or gives up on the credentials (Playwright answers its prompt with the context's, or cancels it).
                for creds in (None, {"username": "operator", "password": "wrong"}):
                    refused = await (await browser.new_context(http_credentials=creds)).new_page()
                    statuses: list[int] = []
                    refused.on("response", lambda r, statuses=statuses: statuses.append(r.status))
                    try:
                        await refused.goto(base + "/")
                    except pw_api.Error as exc:
                        assert "ERR_INVALID_AUTH_CREDENTIALS" in str(exc)
                    assert statuses and set(statuses) == {401}, (creds, statuses)
                context = await browser.new_context(http_credentials={"username": "operator", "password": PASSWORD},
                                                    viewport={"width": 1600, "height": 1000})
                page = await context.new_page()
                await page.route(only_here, lambda route: route.abort())
                screen, sockets = Screen(), []
                page.on("websocket", screen.on_ws)
                page.on("websocket", lambda ws: sockets.append(ws.url))
                t0 = time.monotonic()
                resp = await page.goto(base + "/")
                assert resp.status == 200 and page.url.startswith("https://")
                await until(lambda: "spark1" in screen.text, 120, "a simulated node's name over wss")
                print(f"\nbrowser over TLS: page open to the node's name {time.monotonic() - t0:.2f} s")
                assert sockets and all(u.startswith(f"wss://127.0.0.1:{port}/ws") for u in sockets), sockets
                assert "SIMULATED" in screen.text
            finally:
                await browser.close()
    finally:
        out = stop_serve(proc)
    assert f"the console on https://127.0.0.1:{port}/ (read-only) — basic auth required" in out, out
    assert PASSWORD not in out


def test_console_server_refuses_an_open_network_address():
    """Whoever builds the server (serve, or a collector serving the console): off loopback, someone is asked."""
    from sparkconsole.errors import UserError
    from sparkconsole.exporter.listen import Listen
    with pytest.raises(UserError, match="no token was given"):
        ConsoleServer(Listen("0.0.0.0", 8099), read_only=True, demo=True)
