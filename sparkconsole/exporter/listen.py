"""Where a server may listen and what it then needs: loopback is open to this machine's users only; any other
address is reachable from the network and must ask every request for a bearer token.

Shared by `sparkconsole exporter` and `sparkconsole serve`. Tokens come from a file or an environment variable
(never the command line for the exporter: argv is visible to every user in `ps`), and are never printed except a
generated one, once.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import os
import secrets as _rand
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web, web_protocol

from ..errors import UserError
from ..secrets import register

MIN_TOKEN_LEN = 16


@dataclass(frozen=True)
class Listen:
    host: str
    port: int
    scheme: str = "http"          # "https" once a web config gives TLS: every URL printed says so

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def url(self, path: str = "") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{path}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False      # a name: it may resolve to anything, so it is treated as reachable


def parse_listen(text: str, field: str = "--listen") -> Listen:
    """'127.0.0.1:9835', '[::1]:9835', '0.0.0.0:9835' → Listen; a one-line UserError otherwise."""
    fix = "give HOST:PORT, e.g. 127.0.0.1:9835 or [::1]:9835"
    text = (text or "").strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise UserError(f"{text!r} is not an address and port", field=field, fix=fix)
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise UserError(f"{host!r} is not an IP address", field=field,
                            fix="listen on an IP address (a name could resolve to a public address)") from None
    return Listen(host, int(port))


def read_token(token_file: str | None, env_var: str, field: str = "--token-file") -> str | None:
    """The token from --token-file (first line) or the environment variable, registered for redaction."""
    token = None
    if token_file:
        p = Path(token_file).expanduser()
        try:
            token = p.read_text().splitlines()[0].strip() if p.is_file() else None
        except (OSError, IndexError, UnicodeDecodeError):
            token = None
        if not token:
            raise UserError("token file missing, unreadable or empty", file=str(p), field=field,
                            fix="write the token on the file's first line")
    elif os.environ.get(env_var):
        token = os.environ[env_var].strip()
    if token is not None:
        check_token(token, field)
        register(token)
    return token


def check_token(token: str, field: str) -> None:
    if len(token) < MIN_TOKEN_LEN or any(c.isspace() for c in token):
        raise UserError(f"token too short or has spaces (at least {MIN_TOKEN_LEN} characters)", field=field,
                        fix="use a long random token, e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe())'`")


def generate_token() -> str:
    token = _rand.token_urlsafe(24)
    register(token)
    return token


def bearer_ok(header: str | None, token: str) -> bool:
    """`Authorization: Bearer <token>`, compared in constant time."""
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and token_ok(value.strip(), token)


def token_ok(given: str | None, token: str) -> bool:
    # aiohttp hands header bytes that are not UTF-8 over as surrogates: encoded back as they came, never an error.
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode())


class _QuietHandler(web_protocol.RequestHandler):
    """A request aiohttp's parser refuses (a NUL or CR in a header, a line too long, a bad method) is answered
    with its status and a fixed body, and logged as one line without the request's bytes: aiohttp's own answer
    and log repeat the offending header (a token with a stray byte after it) and log a traceback."""

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("response already sent")
        what = type(exc).__name__ if exc is not None else "error"
        self.logger.warning("refused a request from %s: %d %s", request.remote, status, what)
        resp = web.Response(status=status, text=f"{status}: {'bad request' if status < 500 else 'server error'}\n")
        resp.force_close()
        return resp


class QuietRunner(web.AppRunner):
    """web.AppRunner whose connections use _QuietHandler (TCPSite takes `runner.server` as its protocol factory)."""

    @property
    def server(self) -> Any:
        # Any, not aiohttp's `Server | None`: a protocol factory stands in for the Server (all TCPSite does is call it).
        srv = super().server
        if srv is None:
            return None
        return functools.partial(_QuietHandler, srv, loop=srv._loop, **srv._kwargs)
