"""The two listeners (the exporter's /metrics and `serve`'s console page) against hostile HTTP, as raw bytes over a
real socket: request lines, header names and values of any bytes (non-UTF-8, NUL, CR/LF, over-long), bodies,
methods and paths, with and without the right token or basic auth password. The answer is never a 5xx; nothing
they log carries a traceback; no response and no log line holds the token or the password (the one exception: the
cookie `serve` sets in answer to a request that itself carried the right `?token=`).

Every route is reached: the routes are read from each app's own router (a route added later is fuzzed without a
change here), and half the requests go to one of them with the right credentials, so they get past the login to
the handler (a plain GET of `serve`'s `/ws` was two tracebacks and no answer, found only this way). `serve`'s
websocket is also fed hostile messages after a real handshake. The figures (requests sent, routes covered, 5xx,
tracebacks, secrets found) go to the fault suite's ledger (benchmarks/faults.py prints them).

Both servers run in this process on a loopback port each, in a thread with its own event loop, with the same
runner as `sparkconsole exporter` / `serve` (exporter/listen.py's QuietRunner). `serve`'s console child is
replaced by `true`: a request that reaches the websocket must not start consoles.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import shlex
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from sparkconsole.exporter.access import Access, BasicUsers
from sparkconsole.exporter.listen import Listen, QuietRunner
from sparkconsole.exporter.listener import Listener
from sparkconsole.exporter.server import make_app
from sparkconsole.webface.server import COOKIE, ConsoleServer
from tests.faults.conftest import LEDGER
from tests.faults.fuzz import fuzz
from tests.tlsca import bcrypt_hash

TOKEN = "tok-" + "Zq7" * 8                    # what both servers ask for (or the basic auth user's password)
TOKEN_B = TOKEN.encode()
PASSWORD_B = b"pw-" + b"Kx9" * 6
NAMES = ("exporter", "serve")
# What the ledger reports per listener: requests sent, routes reached past the login, 5xx, tracebacks, secrets.
FIGURES = {name: {"requests": 0, "5xx": 0, "tracebacks": 0, "secrets": 0} for name in NAMES}
COVERED: dict[str, set[str]] = {name: set() for name in NAMES}
# A command that stays until the console service tells it to quit (textual-serve waits for it to end).
STAND_IN = "exec python3 -c " + shlex.quote("import sys\nfor b in iter(lambda: sys.stdin.buffer.read1(65536), b''):\n"
                                            "    if b'quit' in b: break")


@dataclass(frozen=True)
class Route:
    """One resource of an app's router: its canonical path, its methods, a path that reaches its handler."""
    canonical: str
    methods: tuple[str, ...]
    sample: bytes
    websocket: bool = False


def app_routes(app) -> list[Route]:
    """Every resource the app's router has, read from the router itself (a new route is covered without a change
    here): a static directory by one of its files, a `{name}` in a path by a value."""
    out = []
    for resource in app.router.resources():
        info = resource.get_info()
        methods = tuple(sorted({r.method for r in resource}))
        if "directory" in info:
            first = next(p for p in sorted(Path(info["directory"]).rglob("*")) if p.is_file())
            sample = f"{info['prefix']}/{first.relative_to(info['directory']).as_posix()}"
        elif "formatter" in info:
            sample = re.sub(r"\{[^}]*\}", "x", info["formatter"])
        else:
            sample = info["path"]
        handler = next(iter(resource)).handler
        ws = getattr(handler, "__name__", "") == "handle_websocket"
        out.append(Route(resource.canonical, methods, sample.encode(), ws))
    return out


class Servers:
    """Both listeners on a loop in a thread; every log record of the process kept as formatted text."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ports: dict[str, int] = {}
        self.log: list[str] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._runners: list = []
        self.routes: dict[str, list[Route]] = {}

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> None:
        from aiohttp import web
        reg = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=reg)
        access = Access(token=TOKEN, users=BasicUsers({"fuzz": bcrypt_hash(PASSWORD_B.decode()).encode()}))
        runner = QuietRunner(make_app(reg, access), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.ports["exporter"] = site._server.sockets[0].getsockname()[1]
        console = ConsoleServer(Listener(Listen("127.0.0.1", 0), access), read_only=True, demo=True)
        console.command = STAND_IN
        self._runners = [runner, await console.start_runner()]
        self.ports["serve"] = console.port
        self.routes = {"exporter": app_routes(runner.app), "serve": app_routes(self._runners[1].app)}

    def stop(self) -> None:
        async def down():
            for r in self._runners:
                await r.cleanup()
        asyncio.run_coroutine_threadsafe(down(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


class _Keep(logging.Handler):
    def __init__(self, out: list[str]) -> None:
        super().__init__(level=logging.DEBUG)
        self.out = out
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.out.append(self.format(record))        # the formatted text includes any traceback


@pytest.fixture(scope="module")
def servers():
    s = Servers()
    handler = _Keep(s.log)
    root = logging.getLogger()
    root.addHandler(handler)
    old = root.level
    root.setLevel(logging.DEBUG)
    s.start()
    try:
        yield s
    finally:
        s.stop()
        for name in NAMES:
            LEDGER.listeners[name] = {**FIGURES[name], "routes covered": len(COVERED[name]),
                                      "routes": len(s.routes.get(name, ()))}
            print(f"\nlistener fuzz, {name}: {LEDGER.listeners[name]}")
        root.removeHandler(handler)
        root.setLevel(old)


def exchange(port: int, raw: bytes, wait_s: float = 1.0) -> bytes:
    """Send raw bytes, read one answer: the status line, headers and a Content-Length body (or to EOF). A request the
    server is still waiting the rest of gets no answer within wait_s: then b""."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(raw)
        except OSError:
            pass                                      # refused part-way: whatever it answered is still readable
        s.settimeout(wait_s)
        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    return buf
                buf += chunk
            head, _, body = buf.partition(b"\r\n\r\n")
            m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            s.settimeout(10)
            while m and len(body) < int(m.group(1)):
                chunk = s.recv(65536)
                if not chunk:
                    break
                body += chunk
            return head + b"\r\n\r\n" + body
        except TimeoutError:
            return buf
        except ConnectionResetError:
            return buf


def status(answer: bytes) -> int | None:
    """The answer's status code; aiohttp answers in the request's own version (HTTP/2.0, HTTP/1.9 …), so any
    version counts: a 5xx or a cookie swap behind an odd version must not read as no answer."""
    m = re.match(rb"HTTP/\d\.\d (\d{3})", answer)
    return int(m.group(1)) if m else None


# ---- what a hostile client sends
any_bytes = st.binary(max_size=80)
TOKEN_FORMS = [b"Bearer " + TOKEN_B, b"Bearer " + TOKEN_B + b"\x00", b"Bearer " + TOKEN_B + b"\r\nX: y",
               b"bearer  " + TOKEN_B + b" ", b"Bearer \xff\xfe" + TOKEN_B, b"Bearer " + TOKEN_B[:-1] + b"\xc3",
               COOKIE.encode() + b"=" + TOKEN_B, COOKIE.encode() + b"=" + TOKEN_B + b"\x00; a=\xff",
               *(b"Basic " + base64.b64encode(creds) + tail for creds in (b"fuzz:" + PASSWORD_B, b"fuzz:" + PASSWORD_B
                                                                           + b"\xff", b"\xfe:" + PASSWORD_B)
                 for tail in (b"", b"\x00", b"=", b" x")), b"Basic \xff\xfe", b"basic  ==="]
header_name = st.sampled_from([b"Authorization", b"Cookie", b"Host", b"Origin", b"Content-Length", b"Accept",
                               b"Transfer-Encoding", b"Upgrade", b"Connection", b"Sec-WebSocket-Key",
                               b"Sec-WebSocket-Version", b"Content-Type", b"X-Forwarded-For"]) | any_bytes
header_value = (st.sampled_from(TOKEN_FORMS) | any_bytes
                | st.integers(1, 40_000).map(lambda n: b"A" * n)                       # past aiohttp's line limit
                | st.sampled_from([b"chunked", b"websocket", b"Upgrade", b"close", b"-1", b"99999999999999999999",
                                   b"http://evil.example", b"application/openmetrics-text; version=1.0.0"]))
method = st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT",
                          b"TRACE", b"PRI"]) | st.binary(max_size=12)
path = (st.sampled_from([b"/", b"/metrics", b"/ws", b"/static/", b"/static/../../etc/passwd", b"/download/x",
                         b"/?token=" + TOKEN_B, b"/?token=" + TOKEN_B + b"&x=%0d%0aSet-Cookie:%20a=b",
                         b"/?token=wrong-token-value-000", b"/?fontsize=%C2%B2", b"/?fontsize=99999",
                         b"*", b"http://127.0.0.1/metrics", b"/%ff%fe", b"/metrics?%00"])
        | any_bytes.map(lambda b: b"/" + b))
version = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 extra", b""]) | st.binary(max_size=10)


@st.composite
def requests(draw) -> bytes:
    headers = draw(st.lists(st.tuples(header_name, header_value), max_size=8))
    body = draw(st.binary(max_size=300))
    sep = draw(st.sampled_from([b"\r\n", b"\r\n", b"\n", b"\r", b"\r\n\x00"]))
    lines = [draw(method) + b" " + draw(path) + b" " + draw(version)]
    lines += [n + b": " + v for n, v in headers]
    if draw(st.booleans()) and not any(n.lower() in (b"content-length", b"transfer-encoding") for n, _ in headers):
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return sep.join(lines) + sep + sep + body


def check(servers: Servers, name: str, raw: bytes, answer: bytes, log_from: int) -> None:
    """Counts, then asserts: no 5xx, no traceback logged, the token and the password in no answer and no log line."""
    FIGURES[name]["requests"] += 1
    code = status(answer)
    lines = servers.log[log_from:]
    head, _, body = answer.partition(b"\r\n\r\n")
    # serve swaps a right ?token= for a cookie: the only answer allowed to carry the token
    cookie_swap = (name == "serve" and code == 302 and b"?token=" + TOKEN_B in raw
                   and TOKEN_B not in head.replace(b"Set-Cookie: " + COOKIE.encode() + b"=" + TOKEN_B, b"")
                   and TOKEN_B not in body)
    leaks = ((TOKEN_B in answer and not cookie_swap) + (PASSWORD_B in answer)
             + sum(TOKEN in line or PASSWORD_B.decode() in line for line in lines))
    FIGURES[name]["5xx"] += code is not None and code >= 500
    FIGURES[name]["tracebacks"] += sum("Traceback" in line for line in lines)
    FIGURES[name]["secrets"] += leaks
    assert code is None or code < 500, f"{name} answered {code} to {raw[:300]!r}: {answer[:300]!r}"
    assert TOKEN_B not in answer or cookie_swap, f"the token in {name}'s answer: {answer[:400]!r}"
    for line in lines:
        assert "Traceback" not in line, f"{name} logged a traceback for {raw[:200]!r}: {line[:600]}"
        assert TOKEN not in line and TOKEN_B.decode() not in line, f"{name} logged the token: {line[:300]}"
        assert PASSWORD_B.decode() not in line, f"{name} logged the password: {line[:300]}"
    assert PASSWORD_B not in answer, f"the password in {name}'s answer: {answer[:400]!r}"


def reached(name: str, route: Route, answer: bytes) -> None:
    """A request with the right credentials that the login let through counts its route as covered."""
    code = status(answer)
    if code is not None and code not in (401, 403):
        COVERED[name].add(route.canonical)


GOOD_AUTH = [b"Authorization: Bearer " + TOKEN_B, b"Authorization: Basic " + base64.b64encode(b"fuzz:" + PASSWORD_B),
             b"Cookie: " + COOKIE.encode() + b"=" + TOKEN_B]
HANDSHAKE = [b"Upgrade: websocket", b"Connection: Upgrade", b"Sec-WebSocket-Version: 13",
             b"Sec-WebSocket-Key: " + base64.b64encode(b"0123456789abcdef")]
query = (st.sampled_from([b"", b"?width=100&height=30", b"?width=-1&height=%C2%B2", b"?width=99999999999999999999",
                          b"?token=" + TOKEN_B, b"?fontsize=12", b"?%ff=%00"])
         | any_bytes.map(lambda b: b"?" + b))


@st.composite
def routed_requests(draw, routes: list[Route]) -> tuple[Route, bytes]:
    """A request to one of the app's own routes, with the right credentials (so it reaches the handler): the
    route's methods or any, a query, a websocket handshake (whole, or with one header spoiled), hostile headers."""
    route = draw(st.sampled_from(routes))
    verb = draw(st.sampled_from([m.encode() for m in route.methods if m != "*"] or [b"GET"]) | method)
    lines = [verb + b" " + route.sample + draw(query) + b" HTTP/1.1", b"Host: 127.0.0.1",
             draw(st.sampled_from(GOOD_AUTH))]
    handshake = draw(st.sampled_from(["none", "whole", "spoiled"]))
    if handshake != "none":
        hs = list(HANDSHAKE)
        if handshake == "spoiled":
            hs[draw(st.integers(0, len(hs) - 1))] = draw(st.sampled_from(HANDSHAKE)).split(b":")[0] + b": " \
                + draw(any_bytes.filter(lambda b: b"\r" not in b and b"\n" not in b))
        lines += hs
    lines += [n + b": " + v for n, v in draw(st.lists(st.tuples(header_name, header_value), max_size=4))]
    lines.append(b"Connection: close")
    body = draw(st.binary(max_size=200))
    return route, b"\r\n".join(lines) + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body


@pytest.mark.fault("hostile HTTP (raw bytes) against the exporter and serve")
@pytest.mark.parametrize("name", NAMES)
@fuzz(2000)
@given(raw=requests())
@example(raw=b"GET /?token=" + TOKEN_B + b" HTTP/2.0\r\n\r\n")      # CI: its swap answered as "HTTP/2.0 302"
def test_listeners_answer_hostile_requests_with_4xx_no_traceback_no_secret(servers, name, raw):
    log_from = len(servers.log)
    answer = exchange(servers.ports[name], raw)
    check(servers, name, raw, answer, log_from)


@pytest.mark.fault("hostile HTTP with the right credentials on every route of the exporter and serve")
@pytest.mark.parametrize("name", NAMES)
@fuzz(1000)
@given(data=st.data())
def test_every_route_answers_hostile_requests_past_the_login(servers, name, data):
    route, raw = data.draw(routed_requests(servers.routes[name]))
    log_from = len(servers.log)
    answer = exchange(servers.ports[name], raw)
    check(servers, name, raw, answer, log_from)
    reached(name, route, answer)


@pytest.mark.parametrize("name", NAMES)
def test_each_route_of_the_router_answers_plain_requests_cleanly(servers, name):
    """Every route the app's router has, with the right credentials: a plain GET, HEAD and POST and (for a
    websocket) a plain GET with no handshake each get one answer below 500 and log no traceback. `serve`'s /ws was
    two tracebacks and no answer at all to a plain GET."""
    routes = servers.routes[name]
    assert {r.canonical for r in routes} >= ({"/", "/metrics"} if name == "exporter" else {"/", "/ws", "/static"})
    for route in routes:
        for verb in (b"GET", b"HEAD", b"POST"):
            raw = (verb + b" " + route.sample + b" HTTP/1.1\r\nHost: x\r\n" + GOOD_AUTH[0]
                   + b"\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            log_from = len(servers.log)
            answer = exchange(servers.ports[name], raw)
            assert status(answer) is not None, f"{name} gave no answer to {verb.decode()} {route.canonical}"
            check(servers, name, raw, answer, log_from)
            reached(name, route, answer)
            if route.websocket and verb == b"GET":
                assert status(answer) == 400 and b"websocket" in answer, answer[:300]
    assert COVERED[name] == {r.canonical for r in routes}


@pytest.mark.parametrize("bad", [b"Upgrade: \x80", b"Sec-WebSocket-Key: \x80"])
def test_a_handshake_header_aiohttp_cannot_read_is_a_400(servers, bad):
    """Found by the fuzz above: `Upgrade: \\x80` made aiohttp's own refusal (which quotes the header) raise
    UnicodeEncodeError, and `Sec-WebSocket-Key: \\x80` a ValueError, each a 500. Neither is a handshake: one 400."""
    headers = {b"Upgrade": b"Upgrade: websocket", b"Sec-WebSocket-Key": b"Sec-WebSocket-Key: MDEyMzQ1Njc4OWFiY2RlZg=="}
    headers[bad.split(b":")[0]] = bad
    raw = (b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\n" + GOOD_AUTH[0] + b"\r\n" + headers[b"Upgrade"]
           + b"\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n" + headers[b"Sec-WebSocket-Key"]
           + b"\r\nContent-Length: 0\r\n\r\n")
    log_from = len(servers.log)
    answer = exchange(servers.ports["serve"], raw)
    check(servers, "serve", raw, answer, log_from)
    assert status(answer) == 400 and b"websocket" in answer, answer[:300]


WS_MESSAGES = (st.text(max_size=60)
               | st.sampled_from(['["stdin"]', '["stdin", 5]', '["resize", {"width": "x"}]', '["resize", 7]',
                                  '["resize", {"width": 1e308, "height": -1}]', '["resize", {"width": true, '
                                  '"height": 2}]', '["stdin", "\\ud800"]', "[]", "{}", "null", '["ping", null]',
                                  '["blur"]', '["focus"]', '["nope"]', "[1, 2]", '["stdin", "q"]',
                                  '["resize", {"width": 80, "height": 24}]'])
               | st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                              lambda inner: st.lists(inner, max_size=3)
                              | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
               .map(json.dumps))


@pytest.mark.fault("hostile websocket messages to serve's console")
@fuzz(200)
@given(messages=st.lists(WS_MESSAGES, min_size=1, max_size=5))
def test_serve_websocket_takes_hostile_messages_without_a_traceback(servers, messages):
    """After a real handshake, anything the page would never send: the websocket is closed (1003) or the
    message is used; one log line at most, no traceback, no 5xx (textual-serve's loop raised on a malformed one)."""
    import aiohttp

    async def talk() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(
                f"http://127.0.0.1:{servers.ports['serve']}/ws?width=80&height=24",
                headers={"Authorization": "Bearer " + TOKEN}) as ws:
            for m in messages:
                if ws.closed:
                    break
                await ws.send_str(m)
            await ws.close()

    log_from = len(servers.log)
    asyncio.run(talk())
    FIGURES["serve"]["requests"] += len(messages)
    COVERED["serve"].add("/ws")
    lines = servers.log[log_from:]
    FIGURES["serve"]["tracebacks"] += sum("Traceback" in line for line in lines)
    assert not [ln for ln in lines if "Traceback" in ln], lines[:3]
    assert len([ln for ln in lines if "sparkconsole.webface" in ln]) <= 1, lines


@pytest.mark.parametrize("name", NAMES)
def test_known_bugs_non_utf8_authorization_and_token_then_nul(servers, name):
    """Both found by hand before the fuzzer: a non-UTF-8 Authorization header was a 500 with a traceback in the log
    (exporter/listen.py encoded it as UTF-8); the right token followed by a NUL was a 400 whose body and log
    repeated the token (aiohttp's own parser error)."""
    port = servers.ports[name]
    log_from = len(servers.log)
    bad = b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xfd\r\n\r\n"
    answer = exchange(port, bad)
    assert status(answer) == 401, answer[:200]
    nul = b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN_B + b"\x00\r\n\r\n"
    answer = exchange(port, nul)
    assert status(answer) == 400 and TOKEN_B not in answer, answer[:300]
    check(servers, name, nul, answer, log_from)
    # and the right token, or the user's password, still opens the door
    for auth in (b"Bearer " + TOKEN_B, b"Basic " + base64.b64encode(b"fuzz:" + PASSWORD_B)):
        assert status(exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth
                               + b"\r\nConnection: close\r\n\r\n")) == 200

