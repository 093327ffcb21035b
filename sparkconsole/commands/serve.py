"""`sparkconsole serve`: the console in a browser tab, for watching a run from another room.

    sparkconsole serve [--listen 127.0.0.1:8099] [--token-file FILE | --token T] [--web-config-file FILE]
                       [--read-only] [--demo]

Loopback needs no token. Any other address needs one: given (--token-file, SPARKCONSOLE_SERVE_TOKEN, or --token),
or generated and printed once, in the URL to open; requests without it are refused (401), the websocket too.
Basic auth users of a --web-config-file (node_exporter's web config) do instead of a token; its
tls_server_config serves the page and the websocket over TLS (https://, wss://).
Off loopback the console is read-only unless --no-read-only: no restart, stop, launch or guard fix.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:          # the imports themselves wait for run(): registering must stay cheap
    from ..exporter.listen import Listen
    from ..exporter.listener import Listener

TOKEN_ENV = "SPARKCONSOLE_SERVE_TOKEN"
DEFAULT_LISTEN = "127.0.0.1:8099"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("serve", help="serve the console in a browser tab (textual-serve)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    from ..exporter.listenargs import add_listen_args
    add_listen_args(p, default=DEFAULT_LISTEN, token_env=TOKEN_ENV, what="the console")
    p.add_argument("--token", metavar="T", help="the token itself (visible in `ps`: prefer --token-file)")
    p.add_argument("--read-only", action=argparse.BooleanOptionalAction, default=None,
                   help="hide every node-changing action (default: on for addresses other than loopback)")
    p.add_argument("--demo", action="store_true", help="serve the simulated two-node cluster (sparkconsole demo)")
    p.set_defaults(func=run)


def decide(listen: Listen, token: str | None, read_only: bool | None, *,
           asked: bool = False) -> tuple[str | None, bool, bool]:
    """(token, generated, read_only) for this address: off loopback a token, generated if none was given and
    nothing else asks who comes in (`asked`: basic auth users or required client certificates); read-only off
    loopback unless asked otherwise."""
    from ..exporter.listen import generate_token
    generated = False
    if token is None and not asked and not listen.loopback:
        token, generated = generate_token(), True
    return token, generated, (not listen.loopback) if read_only is None else read_only


def listener_for(args: argparse.Namespace) -> tuple[Listener, bool, bool]:
    """(listener, generated, read_only) for the command line: the address, the web config, the token given or
    generated (off loopback without basic auth users), read-only as decided."""
    import dataclasses

    from ..exporter.access import Access
    from ..exporter.listen import check_token, read_token
    from ..exporter.listener import make_listener
    from ..secrets import register as register_secret

    token = args.token
    if token is not None:
        check_token(token, "--token")
        register_secret(token)
    else:
        token = read_token(args.token_file, TOKEN_ENV)
    os.environ.pop(TOKEN_ENV, None)          # the console children need no token
    listener = make_listener(args.listen, token=token, web_config_file=args.web_config_file)
    token, generated, read_only = decide(listener.listen, token, args.read_only,
                                         asked=listener.asks_who)
    if generated:
        listener = dataclasses.replace(listener, access=Access(token=token, users=listener.access.users))
    return listener, generated, read_only


def run(args: argparse.Namespace) -> int:
    from ..webface.server import ConsoleServer

    listener, generated, read_only = listener_for(args)
    if generated:
        # Printed once, here, and nowhere else: the operator copies this URL to the other room's browser.
        print(f"sparkconsole serve: open {listener.url('/')}?token={listener.access.token}", flush=True)
    server = ConsoleServer(listener, read_only=read_only, demo=args.demo, cluster=getattr(args, "cluster", None))
    server.serve()
    print("sparkconsole serve: stopped", file=sys.stderr)
    return 0
