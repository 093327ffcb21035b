"""`sparkconsole serve`: the console in a browser tab, for watching a run from another room.

    sparkconsole serve [--listen 127.0.0.1:8099] [--token-file FILE | --token T] [--read-only] [--demo]

Loopback needs no token. Any other address needs one: given (--token-file, SPARKCONSOLE_SERVE_TOKEN, or --token),
or generated and printed once, in the URL to open; requests without it are refused (401), the websocket too.
Off loopback the console is read-only unless --no-read-only: no restart, stop, launch or guard fix.
"""

from __future__ import annotations

import argparse
import os
import sys

TOKEN_ENV = "SPARKCONSOLE_SERVE_TOKEN"
DEFAULT_LISTEN = "127.0.0.1:8099"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve the console in a browser tab (textual-serve)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"address to serve on (default {DEFAULT_LISTEN}; any other than loopback needs a token)")
    p.add_argument("--token-file", metavar="FILE", help=f"token the browser must present (or set {TOKEN_ENV})")
    p.add_argument("--token", metavar="T", help="the token itself (visible in `ps`: prefer --token-file)")
    p.add_argument("--read-only", action=argparse.BooleanOptionalAction, default=None,
                   help="hide every node-changing action (default: on for addresses other than loopback)")
    p.add_argument("--demo", action="store_true", help="serve the simulated two-node cluster (sparkconsole demo)")
    p.set_defaults(func=run)


def decide(listen, token: str | None, read_only: bool | None) -> tuple[str | None, bool, bool]:
    """(token, generated, read_only) for this address: a token off loopback (generated if none was given),
    read-only off loopback unless asked otherwise."""
    from ..exporter.listen import generate_token
    generated = False
    if token is None and not listen.loopback:
        token, generated = generate_token(), True
    return token, generated, (not listen.loopback) if read_only is None else read_only


def run(args: argparse.Namespace) -> int:
    from ..exporter.listen import check_token, parse_listen, read_token
    from ..secrets import register as register_secret
    from ..webface.server import ConsoleServer

    listen = parse_listen(args.listen)
    token = args.token
    if token is not None:
        check_token(token, "--token")
        register_secret(token)
    else:
        token = read_token(args.token_file, TOKEN_ENV)
    os.environ.pop(TOKEN_ENV, None)          # the console children need no token
    token, generated, read_only = decide(listen, token, args.read_only)
    if generated:
        # Printed once, here, and nowhere else: the operator copies this URL to the other room's browser.
        print(f"sparkconsole serve: open {listen.url('/')}?token={token}", flush=True)
    server = ConsoleServer(listen, token=token, read_only=read_only, demo=args.demo,
                           cluster=getattr(args, "cluster", None))
    try:
        server.serve()
    except OSError as exc:
        from ..errors import UserError
        raise UserError(f"cannot listen on {listen.host}:{listen.port}: {exc.strerror or exc}", field="--listen",
                        fix="pick a free port") from None
    print("sparkconsole serve: stopped", file=sys.stderr)
    return 0
