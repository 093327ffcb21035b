"""`sparkconsole serve`: the console in a browser tab. The token on every request (page, static files, websocket),
the read-only console, and — in a real browser (Debian's chromium driven by Playwright) — the demo's simulated
nodes' temperatures, the bench screen on `3`, and a refused request without the token."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from sparkconsole.commands.serve import decide
from sparkconsole.exporter.listen import Listen
from sparkconsole.nodes.monitor import ClusterMonitor
from sparkconsole.nodes.replay import read_recording, replay_factory
from sparkconsole.nodes.samples import NodeState
from sparkconsole.tui.app import SparkConsoleApp
from sparkconsole.tui.screens.confirm import ConfirmScreen
from sparkconsole.webface.server import COOKIE, ConsoleServer
from tests.helpers import free_port, until, wait_for
from tests.screen import screen_lines
from tests.test_tui_app import cluster

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "serve-test-token-0123456789abc"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def test_policy_token_and_read_only_off_loopback():
    tok, generated, ro = decide(Listen("127.0.0.1", 8099), None, None)
    assert (tok, generated, ro) == (None, False, False)
    tok, generated, ro = decide(Listen("0.0.0.0", 8099), None, None)
    assert generated and len(tok) >= 16 and ro is True
    assert decide(Listen("0.0.0.0", 8099), TOKEN, False) == (TOKEN, False, False)
    assert decide(Listen("127.0.0.1", 8099), None, True)[2] is True


async def test_every_request_needs_the_token():
    """The real aiohttp app of the server on loopback: page, static files and websocket refused without the
    token; ?token= sets the cookie and redirects to a URL without it; the cookie opens the websocket."""
    server = ConsoleServer(Listen("127.0.0.1", free_port()), token=TOKEN, read_only=True, demo=False)
    assert server.command.startswith("exec env SPARKCONSOLE_READ_ONLY=1 ") and "console" in server.command
    assert "SPARKCONSOLE_READ_ONLY" not in os.environ
    # The console child is not what this test is about: one that exits at once stands in for it.
    server.command = "true"
    runner = web.AppRunner(await server._make_app(), shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", server.port)
    await site.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as s:
            for path in ("/", "/static/js/textual.js", "/ws"):
                async with s.get(base + path) as r:
                    assert r.status == 401, path
            with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                await s.ws_connect(base + "/ws")
            assert e.value.status == 401
            async with s.get(base + "/?token=wrong-wrong-wrong-wrong", allow_redirects=False) as r:
                assert r.status == 401
            async with s.get(base + f"/?token={TOKEN}&fontsize=14", allow_redirects=False) as r:
                assert r.status == 302 and TOKEN not in r.headers["Location"] and "fontsize=14" in r.headers["Location"]
                morsel = r.cookies[COOKIE]
                assert morsel.value == TOKEN and morsel["httponly"] and morsel["samesite"] == "Strict"
        async with aiohttp.ClientSession(cookies={COOKIE: TOKEN}) as s:
            async with s.get(base + "/") as r:
                page = await r.text()
                assert r.status == 200 and "googleapis" not in page and f"ws://127.0.0.1:{server.port}/ws" in page
            ws = await s.ws_connect(base + "/ws?width=80&height=24", origin=base)
            await ws.close()
            # A page of another site opening the websocket in the operator's browser carries that site's Origin.
            with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                await s.ws_connect(base + "/ws", origin="http://evil.example")
            assert e.value.status == 403
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
            async with s.get(base + "/static/js/textual.js") as r:
                assert r.status == 200
    finally:
        await runner.cleanup()


def _app(read_only: bool):
    cfg = cluster(2)
    mon = ClusterMonitor(cfg, transport_factory=replay_factory(
        lambda n: read_recording(ROOT / "tests/fixtures/agent-h100-load.jsonl"), interval=0.05))
    return SparkConsoleApp(cfg, monitor=mon, read_only=read_only), mon


@pytest.mark.parametrize("read_only", [True, False])
async def test_read_only_console_has_no_node_changing_action(read_only, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    app, mon = _app(read_only)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: mon.nodes["spark1"].state == NodeState.LIVE, what="LIVE")
        titles = [c.title for c in app.palette_commands()]
        changing = [c.title for c in app.palette_commands()
                    if c.action in ("node.restart", "node.stop", "node.fix", "recipes.launch", "recipes.restart",
                                    "recipes.stop", "recipes.copy_model", "recipes.copy_image")]
        assert bool(changing) is not read_only
        assert "spark1: Logs of vLLM" in titles
        panel = app.dashboard.panels["spark1"]
        panel.focus()

        def footer() -> str:
            return "\n".join(screen_lines(app)[-2:])
        # the panel's own keys reach the footer on a later frame (slower under load): wait for one that both
        # modes show, then read the rest
        await wait_for(pilot, lambda: "Logs" in footer(), timeout=30, what="the node panel's keys in the footer")
        assert ("Restart vLLM" in footer()) is not read_only
        await pilot.press("r")
        if read_only:
            await pilot.pause(0.2)
            assert not isinstance(app.screen, ConfirmScreen)
        else:      # the confirmation is pushed on a later frame (slower under load)
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=30, what="the confirmation")
        if read_only:
            # Reached another way (a guard's Enter, the recipes screen): still refused, nothing pushed or run.
            app.confirm_guard_fix("spark1", next(r for r in app.guards_for(mon.nodes["spark1"]) if r.fix))
            await pilot.pause(0.1)
            assert not isinstance(app.screen, ConfirmScreen)
            assert "READ-ONLY" in app.sub_title
        await pilot.press("q")


# --- the real browser ------------------------------------------------------------------------------------------------
def _need_browser():
    if not os.path.exists(CHROMIUM):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-qq",
                        "--no-install-recommends", "chromium"], capture_output=True, env=env)
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium package could not be installed")
    return pytest.importorskip("playwright.async_api")


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-Za-z]|\x1b[=>78]")


class Screen:
    """What the console wrote to the browser's terminal (the websocket's frames), as text without escapes: the
    page draws on a canvas, so the DOM has no text to read."""

    def __init__(self) -> None:
        self.raw = ""

    def on_ws(self, ws) -> None:
        ws.on("framereceived", self._frame)

    def _frame(self, payload) -> None:
        self.raw += payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload

    @property
    def text(self) -> str:
        return _ANSI.sub("", self.raw)


@pytest.mark.slow
async def test_browser_shows_the_demo_console(tmp_path):
    """`sparkconsole serve --demo --read-only` in a subprocess, Debian's chromium through Playwright."""
    pw_api = _need_browser()
    from tests.testbed.sshd import _die_with_parent
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "sparkconsole", "serve", "--listen", f"127.0.0.1:{port}",
                             "--token-file", str(token_file), "--demo", "--read-only"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                            start_new_session=True)
    shots = ROOT / "screenshots"
    base = f"http://127.0.0.1:{port}"
    try:
        async with pw_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = await browser.new_page(viewport={"width": 1600, "height": 1000})
                # Only this machine: anything the page asks of another host is refused here, not sent.
                await page.route(re.compile(r"^(?!https?://127\.0\.0\.1[:/]|ws://127\.0\.0\.1[:/]).*"),
                                 lambda route: route.abort())
                await until(lambda: _listening(port), 60, "the server to listen")
                resp = await page.goto(base + "/")
                assert resp.status == 401                                   # no token: refused
                screen = Screen()
                page.on("websocket", screen.on_ws)
                t0 = time.monotonic()
                resp = await page.goto(base + f"/?token={TOKEN}")
                assert resp.status == 200 and TOKEN not in page.url
                temp = re.compile(r"\b\d{2,3}(\.\d)? ?°C")
                await until(lambda: temp.search(screen.text), 120, "a simulated node's temperature")
                first_temp_s = time.monotonic() - t0
                print(f"\nbrowser: page open to first temperature {first_temp_s:.2f} s")
                # The first frames can pass before the frame listener is attached: a resize repaints everything.
                await page.set_viewport_size({"width": 1680, "height": 1050})
                await until(lambda: "read-only console" in screen.text, 30, "the read-only notice")
                assert "SIMULATED" in screen.text
                await until(lambda: "spark2" in screen.text, 30, "both nodes")
                await asyncio.sleep(2)                 # a few ticks: the graphs have something to draw
                await page.screenshot(path=str(shots / "browser-dashboard.png"))
                assert "Restart vLLM" not in screen.text
                mark = len(screen.raw)
                await page.keyboard.press("Tab")       # focus a node panel: its keys show in the footer
                await until(lambda: re.search(r"l\s*Logs", _ANSI.sub("", screen.raw[mark:])), 30,
                             "a node panel's keys in the footer")
                await page.keyboard.press("r")
                await asyncio.sleep(1)
                after = _ANSI.sub("", screen.raw[mark:])
                assert "Restart vLLM" not in after and "docker restart" not in after
                mark = len(screen.raw)
                await page.keyboard.press("3")
                await until(lambda: "Start sweep" in _ANSI.sub("", screen.raw[mark:]), 30, "the bench screen")
                await asyncio.sleep(1)
                await page.screenshot(path=str(shots / "browser-bench.png"))
            finally:
                await browser.close()
    finally:
        out = stop_serve(proc)
        assert TOKEN not in out


def stop_serve(proc: subprocess.Popen) -> str:
    """SIGTERM to the serve process's group (its console children too), SIGKILL if it lingers; its output."""
    os.killpg(proc.pid, 15)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(10)
    return proc.stdout.read().decode() if proc.stdout else ""


def _listening(port: int) -> bool:
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
