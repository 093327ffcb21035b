"""A listener as `exporter` and `serve` open it (and whatever else serves HTTP, e.g. `record --exporter/--serve`):
the address, the web config's TLS context, response headers and basic auth users, the bearer token, and the one
rule: an address other than loopback is reachable from the network, so it must ask every request who it is.

    listenargs.add_listen_args(parser, default=…, token_env=…)   # --listen, --token-file, --web-config-file
    listener = make_listener(text, token=…, web_config_file=…)   # -> Listener (https URLs when TLS is on)
    port = await start_site(runner, listener)
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

from ..errors import UserError
from .access import Access, BasicUsers, Busy, as_access
from .listen import Listen, parse_listen


@dataclass(frozen=True)
class Listener:
    listen: Listen                                   # scheme "https" when ssl_context is set
    access: Access = field(default_factory=Access)
    ssl_context: ssl.SSLContext | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    option: str = "--listen"                         # the command-line option that gave the address, for errors

    @property
    def tls(self) -> bool:
        return self.ssl_context is not None

    def url(self, path: str = "", port: int | None = None) -> str:
        listen = self.listen if port is None else dataclasses.replace(self.listen, port=port)
        return listen.url(path)

    @property
    def client_certificates(self) -> bool:
        """Mutual TLS: only a client with a certificate from the web config's client CA gets through the handshake."""
        return self.ssl_context is not None and self.ssl_context.verify_mode == ssl.CERT_REQUIRED

    @property
    def asks_who(self) -> bool:
        return self.access.required or self.client_certificates

    def describe(self) -> str:
        """What a client must bring, for the line printed at start (never a secret): '' when nothing."""
        parts = ([self.access.describe()] if self.access.required else []) + (
            ["client certificate required"] if self.client_certificates else [])
        return "; ".join(parts)

    def refuse_open_network(self, fix: str) -> None:
        """An address reachable from the network with nobody asked who they are: a one-line refusal."""
        if not self.listen.loopback and not self.asks_who:
            raise UserError(f"{self.listen.host} is reachable from the network and no token was given "
                            "(nor basic auth users, nor required client certificates)", field=self.option, fix=fix)


def make_listener(listen: str | Listen, *, token: str | None = None, web_config_file: str | None = None,
                  field: str = "--listen") -> Listener:
    """The listener for an address (text as given on the command line, or parsed), a bearer token (already read:
    listen.read_token) and an optional web config file. Every mistake is a one-line UserError."""
    from .webconfig import read_web_config
    where = parse_listen(listen, field) if isinstance(listen, str) else listen
    if not web_config_file:
        return Listener(where, Access(token=token), option=field)
    cfg = read_web_config(web_config_file)
    if cfg.ssl_context is not None:
        where = dataclasses.replace(where, scheme="https")
    return Listener(where, Access(token=token, users=BasicUsers(cfg.users) if cfg.users else None),
                    cfg.ssl_context, cfg.headers, field)


def as_listener(listen: Listen | Listener, token: Access | str | None = None) -> Listener:
    """A Listener from a bare address and token (the older calling convention), or as given."""
    if isinstance(listen, Listener):
        return listen
    return Listener(listen, as_access(token))


async def allowed(access: Access, authorization: str | None) -> bool:
    """`access.allows`, with too many password checks already waiting answered 429 at once (exporter/access.py)."""
    try:
        return await access.allows(authorization)
    except Busy:
        raise web.HTTPTooManyRequests(headers={"Retry-After": "1"},
                                      text="429: too many logins are being checked: try again in a second\n") from None


def add_headers(app: web.Application, headers: Mapping[str, str]) -> None:
    """The web config's http_server_config.headers on every response, refusals included."""
    if not headers:
        return

    async def prepare(request: web.Request, response: web.StreamResponse) -> None:
        for name, value in headers.items():
            response.headers.setdefault(name, value)

    app.on_response_prepare.append(prepare)


async def start_site(runner: web.AppRunner, listener: Listener) -> int:
    """Listen (TLS when configured) on the runner, set up already; the port bound (HOST:0 picks a free one).
    A port in use is a one-line UserError, with the runner cleaned up."""
    site = web.TCPSite(runner, listener.listen.host, listener.listen.port, ssl_context=listener.ssl_context)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UserError(f"cannot listen on {listener.listen.host}:{listener.listen.port}: {exc.strerror or exc}",
                        field=listener.option, fix="pick a free port") from None
    sockets = getattr(getattr(site, "_server", None), "sockets", None) or ()
    return sockets[0].getsockname()[1] if sockets else listener.listen.port
