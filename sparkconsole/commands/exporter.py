"""`sparkconsole exporter`: the console's readings as Prometheus metrics on /metrics.

    sparkconsole exporter [--listen 127.0.0.1:9835] [--token-file FILE] [--web-config-file FILE]

The same monitors the console uses (one SSH connection per node, nothing installed on the nodes; attached to the
cluster's collector, `sparkconsole record`, when one runs) and its alert rules; a scrape answers from the last
readings with their age. Any address but loopback needs a bearer token (--token-file, or the environment variable
SPARKCONSOLE_EXPORTER_TOKEN) or basic auth users, and is refused without one. --web-config-file takes
node_exporter's web config: TLS (tls_server_config) and basic_auth_users.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

TOKEN_ENV = "SPARKCONSOLE_EXPORTER_TOKEN"
DEFAULT_LISTEN = "127.0.0.1:9835"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("exporter", help="serve the nodes' readings, guards, endpoints and alerts to "
                              "Prometheus (/metrics)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    from ..exporter.listenargs import add_listen_args
    add_listen_args(p, default=DEFAULT_LISTEN, token_env=TOKEN_ENV, what="/metrics")
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    from ..commands.status import load
    from ..exporter.listen import read_token
    from ..exporter.listener import make_listener
    from ..exporter.readings import Readings
    from ..exporter.server import ExporterServer

    listener = make_listener(args.listen, token=read_token(args.token_file, TOKEN_ENV),
                             web_config_file=args.web_config_file)
    cluster = load(args)
    from ..collector.seams import Attaching
    readings = Readings(cluster, attach=True)     # to the cluster's collector when one runs (collector/attach.py)
    if isinstance(readings.monitor, Attaching):
        readings.monitor.subscribe_status(lambda text, severity: print(f"sparkconsole exporter: {text}",
                                                                        file=sys.stderr, flush=True))
    server = ExporterServer(readings, listener)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    try:
        print(f"sparkconsole exporter: {len(cluster.nodes)} node(s), {len(cluster.endpoints)} endpoint(s) from "
              f"{cluster.source}; metrics at {server.url('/metrics')}"
              + (f" ({listener.describe()})" if listener.asks_who else ""), file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await server.stop()
    return 0
