"""textual-serve with the checks a console reachable from another room needs.

Each browser connection runs the console in a child process (`python -m sparkconsole … console|demo`, argv
shlex-joined for textual-serve's shell). With a token, every request — the page, its static files and the
websocket that drives the console — must carry it: `Authorization: Bearer …`, or `?token=…` once, which sets an
HttpOnly, SameSite=Strict cookie and redirects to the bare URL (the websocket then sends the cookie). Anything
else gets 401; a request whose Origin is another site's is refused (403) even on loopback. Basic auth users of a web
config do instead of (or beside) the token; with its tls_server_config the page and websocket are https/wss.
Read-only is passed to the child as SPARKCONSOLE_READ_ONLY=1 (tui/app.py hides and refuses every
node-changing action). The page is textual-serve's own, minus its web-font link: nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import shlex
import signal
import sys
from asyncio.subprocess import Process
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp_jinja2
import jinja2
from aiohttp import WSCloseCode, WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.server import Server

from ..exporter.listen import Listen, QuietRunner, token_ok
from ..exporter.listener import Listener, add_headers, allowed, as_listener, start_site
from ..tui.app import READ_ONLY_ENV
from .spare import SpareConsole

log = logging.getLogger(__name__)

COOKIE = "sparkconsole_token"
TEMPLATE = "app_index.html"
MAX_MESSAGE = 1 << 20           # the page sends keys, resizes and pings: nothing near aiohttp's 4 MiB default
MAX_SIZE = 10_000               # columns or rows a tab may ask for


def _size(text: str | None, default: int) -> int:
    """A terminal dimension from the page (query or resize message): a positive int within MAX_SIZE, else default."""
    if isinstance(text, bool):
        return default
    if isinstance(text, int):
        return text if 0 < text <= MAX_SIZE else default
    if isinstance(text, str) and text.isascii() and text.isdigit() and 0 < int(text) <= MAX_SIZE:
        return int(text)
    return default


def page_message(text: str) -> tuple[str, Any] | None:
    """One message of textual-serve's page (`["stdin", str]`, `["resize", {width, height}]`, `["ping", x]`,
    `["blur"]`, `["focus"]`) as (kind, data); None for anything else."""
    try:
        envelope = json.loads(text)
    except ValueError:
        return None
    if not isinstance(envelope, list) or not envelope or not isinstance(envelope[0], str):
        return None
    kind, data = envelope[0], envelope[1] if len(envelope) > 1 else None
    if kind == "stdin":
        return (kind, data) if isinstance(data, str) else None
    if kind == "resize":
        if not isinstance(data, dict):
            return None
        width, height = _size(data.get("width"), 0), _size(data.get("height"), 0)
        return (kind, {"width": width, "height": height}) if width and height else None
    if kind in ("ping", "blur", "focus"):
        return kind, data
    return None


def console_argv(*, demo: bool, cluster: str | None, module: str = "sparkconsole") -> list[str]:
    """The tab's console; module="sparkconsole.webface.warm": the same console, started ahead of its tab."""
    argv = [sys.executable, "-m", module]
    if cluster:
        argv += ["--cluster", str(Path(cluster).expanduser().resolve())]
    return argv + (["demo"] if demo else ["console"])


def _page_template() -> str:
    import textual_serve
    text = (Path(textual_serve.__file__).parent / "templates" / TEMPLATE).read_text()
    # The stock page loads a web font from a public CDN; the console must not reach past this machine's browser.
    return re.sub(r"<link[^>]*fonts\.googleapis\.com[^>]*>", "", text)


def _same_origin(request: web.Request) -> bool:
    """True without an Origin header (not a browser page's request) or when it names this server's own host."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    scheme, _, host = origin.partition("://")
    return scheme in ("http", "https") and host == request.host


class ConsoleServer(Server):
    def __init__(self, listen: Listen | Listener, *, token: str | None = None, read_only: bool, demo: bool,
                 cluster: str | None = None, spare: bool = True) -> None:
        """`listen`: a Listener (exporter/listener.make_listener: TLS, basic auth, token), or a bare Listen
        with `token`. spare: keep the next tab's console started ahead of it (webface/spare.py)."""
        listener = as_listener(listen, token)
        listener.refuse_open_network("give --token-file FILE (or let `sparkconsole serve` generate a token), "
                                     "basic_auth_users in --web-config-file, or listen on 127.0.0.1")
        # Read-only is said in the child's environment, whatever this process's environment says.
        env = ["env", f"{READ_ONLY_ENV}=1"] if read_only else ["env", "-u", READ_ONLY_ENV]
        # exec: the console is this server's own child (not a shell's), so it can tell when this server is gone
        # (tui/app.py watch_parent) instead of running on, with its agents, after a SIGKILL.
        super().__init__("exec " + shlex.join(env + console_argv(demo=demo, cluster=cluster)),
                         host=listener.listen.host,
                         port=listener.listen.port, title="sparkconsole" + (" (read-only)" if read_only else ""))
        self.tab_command = self.command       # a command set from outside (a test's stand-in) gets no spare
        self.spare = SpareConsole(
            "exec " + shlex.join(env + console_argv(demo=demo, cluster=cluster, module=f"{__package__}.warm")),
            self.tab_environment) if spare else None
        self.listener = listener
        self.listen = listener.listen
        self.access = listener.access
        self.token = listener.access.token
        self.read_only = read_only

    async def _authorised(self, request: web.Request) -> bool:
        if self.token is not None and token_ok(request.cookies.get(COOKIE), self.token):
            return True
        return await allowed(self.access, request.headers.get("Authorization"))

    async def _make_app(self) -> web.Application:
        @web.middleware
        async def auth(request: web.Request, handler):
            if not _same_origin(request):
                # A page from another site opening this websocket in the operator's browser (cross-site
                # WebSocket hijacking) would drive the console; on loopback without a token nothing else stops it.
                raise web.HTTPForbidden(text="403: cross-origin request refused\n")
            if self.token is not None and "token" in request.query:
                if not token_ok(request.query.get("token"), self.token):
                    raise web.HTTPUnauthorized(text="401: wrong token\n")
                # Swap the token in the URL for a cookie the websocket request will carry too.
                # The URL stays percent-encoded: a decoded %0d%0a in the Location header would be a 500.
                resp = web.HTTPFound(location=str(request.rel_url.with_query(
                    {k: v for k, v in request.query.items() if k != "token"})))
                resp.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict", path="/",
                                secure=self.listener.tls)
                raise resp
            if not await self._authorised(request):
                why = ("its token (open the URL printed at start)" if self.access.users is None
                       else "a user and password" + (" or its token" if self.token is not None else ""))
                raise web.HTTPUnauthorized(headers=self.access.challenge(), text=f"401: this console needs {why}\n")
            return await handler(request)

        app = web.Application(middlewares=[auth])
        aiohttp_jinja2.setup(app, loader=jinja2.DictLoader({TEMPLATE: _page_template()}))
        app.add_routes([
            web.get("/", self.handle_index, name="index"),
            web.get("/ws", self.handle_websocket, name="websocket"),
            web.static("/static", self.statics_path, name="static"),
        ])
        add_headers(app, self.listener.headers)
        app.on_startup.append(self._fill_spare)
        app.on_cleanup.append(self._close_spare)
        return app

    # --- each tab's console ----------------------------------------------------------------------------------
    def tab_environment(self, width: int, height: int) -> dict[str, str]:
        """What textual-serve gives a tab's console: this process's environment, its web driver and size."""
        # textual-serve's own, borrowed: it reads .debug alone, which this server has as an AppService does
        return AppService._build_environment(self, width, height)  # type: ignore[arg-type]

    async def _fill_spare(self, app: web.Application) -> None:
        if self.spare is not None and self.command == self.tab_command:
            await self.spare.fill()

    async def _close_spare(self, app: web.Application) -> None:
        if self.spare is not None:
            await self.spare.close()

    async def _take_spare(self, width: int, height: int) -> Process | None:
        if self.spare is None or self.command != self.tab_command:
            return None
        return await self.spare.take(self.tab_environment(width, height))

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """textual-serve's handler, with a console that may have been started ahead of the tab. A request that is
        not a websocket handshake (a plain GET) gets one 400 and nothing in the log; a tab that ends in an error
        is one log line, never a traceback (any local user can open this URL on the default loopback `serve`)."""
        websocket = web.WebSocketResponse(heartbeat=15, max_msg_size=MAX_MESSAGE)
        try:
            ready = websocket.can_prepare(request).ok
        except ValueError:
            # A handshake header aiohttp's check cannot read raised out of it, a 500: a byte it cannot quote back in
            # its refusal (the fuzzer's `Upgrade: \x80`, UnicodeEncodeError) or a key that is not base64
            # (`Sec-WebSocket-Key: \x80`). Not a handshake either way.
            ready = False
        if not ready:
            raise web.HTTPBadRequest(text="400: /ws is the console's websocket: open / in a browser\n")
        width = _size(request.query.get("width"), 80)
        height = _size(request.query.get("height"), 24)
        service: _TabService | None = None
        try:
            await websocket.prepare(request)
            service = _TabService(self.command, write_bytes=websocket.send_bytes, write_str=websocket.send_str,
                                  close=websocket.close, download_manager=self.download_manager, debug=self.debug,
                                  take_spare=self._take_spare)
            await service.start(width, height)
            try:
                await self._process_messages(websocket, service)
            finally:
                await service.stop()
        except asyncio.CancelledError:
            await websocket.close()
        except Exception as error:
            log.warning("a console tab ended: %s", type(error).__name__)
        finally:
            if service is not None:
                await service.stop()
        if not websocket.prepared:       # prepare() itself failed (the client went): nothing to answer
            raise web.HTTPBadRequest(text="400: the websocket handshake did not complete\n")
        return websocket

    async def _process_messages(self, websocket: web.WebSocketResponse, app_service: AppService) -> None:
        """textual-serve's message loop, reading what the page sends as untrusted: a message that is not one of
        the page's own closes the websocket (1003) with one log line, where textual-serve raised (a traceback)."""
        async for message in websocket:
            if message.type != WSMsgType.TEXT:
                continue
            packet = page_message(message.data)
            if packet is None:
                log.warning("a console tab sent a message that is not the page's: closing it")
                await websocket.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"not a console page message")
                return
            kind, data = packet
            if kind == "stdin":
                await app_service.send_bytes(data.encode("utf-8", "replace"))
            elif kind == "resize":
                await app_service.set_terminal_size(data["width"], data["height"])
            elif kind == "ping":
                await websocket.send_json(["pong", data])
            elif kind == "blur":
                await app_service.blur()
            elif kind == "focus":
                await app_service.focus()

    @aiohttp_jinja2.template(TEMPLATE)
    async def handle_index(self, request: web.Request) -> dict:
        # URLs from the request's own host: the page works whatever name or address the browser used.
        base = f"{request.scheme}://{request.host}"
        font_size = request.query.get("fontsize", "16")
        return {"font_size": int(font_size) if font_size.isascii() and font_size.isdigit() else 16,
                "app_websocket_url": ("wss" if request.scheme == "https" else "ws") + f"://{request.host}/ws",
                "config": {"static": {"url": f"{base}/static/"}},
                "application": {"name": self.title}}

    def say_listening(self) -> None:
        print(f"sparkconsole serve: the console on {self.listener.url('/', port=self.port)}"
              + (" (read-only)" if self.read_only else "")
              + (f" — {self.listener.describe()}" if self.listener.asks_who else "")
              + "; Ctrl+C stops", file=sys.stderr, flush=True)

    def serve(self, debug: bool = False) -> None:
        """textual-serve's serve(), on a runner whose refusals of malformed requests repeat none of their bytes."""
        self.debug = debug
        self.initialize_logging()
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runner = await self.start_runner()
        self.say_listening()
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    async def start_runner(self) -> QuietRunner:
        """The app listening on self.host:self.port (0: a free port, then in self.port); cleanup() stops it."""
        runner = QuietRunner(await self._make_app(), access_log=None)
        await runner.setup()
        self.port = await start_site(runner, dataclasses.replace(
            self.listener, listen=dataclasses.replace(self.listen, host=self.host, port=self.port)))
        return runner

    def initialize_logging(self) -> None:
        logging.basicConfig(level="WARNING", format="%(message)s")


class _TabService(AppService):
    """textual-serve's AppService (one tab's console process), which takes the console started ahead of the tab
    when one waits, and otherwise starts it as textual-serve does."""

    def __init__(self, command: str, *, take_spare: Callable[[int, int], Awaitable[Process | None]],
                 **kw: Any) -> None:
        super().__init__(command, **kw)
        self._take_spare = take_spare

    async def _open_app_process(self, width: int = 80, height: int = 24) -> Process:
        process = await self._take_spare(width, height)
        if process is None:
            return await super()._open_app_process(width, height)
        assert process.stdin is not None
        self._process, self._stdin = process, process.stdin
        return process
