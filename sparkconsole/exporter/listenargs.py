"""The command-line options of a listener (`exporter`, `serve`, and any other command that listens), stdlib only:
a command's parser is built before anything heavy is imported (`sparkconsole exporter --help` imports no aiohttp).
Their values become a Listener in exporter/listener.py's `make_listener`."""

from __future__ import annotations

import argparse

WEB_CONFIG_HELP = ("TLS and basic auth, in the Prometheus exporter-toolkit format (node_exporter's "
                   "--web.config.file): tls_server_config, basic_auth_users (bcrypt), http_server_config.headers")


def add_listen_args(p: argparse.ArgumentParser, *, default: str, token_env: str, what: str) -> None:
    p.add_argument("--listen", default=default, metavar="HOST:PORT",
                   help=f"address to serve {what} on (default {default}; any other than loopback needs a token "
                        "or basic auth users)")
    p.add_argument("--token-file", metavar="FILE",
                   help=f"bearer token every request must send (first line of FILE; or set {token_env})")
    add_web_config_arg(p)


def add_web_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--web-config-file", metavar="FILE", help=WEB_CONFIG_HELP)
