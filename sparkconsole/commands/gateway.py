"""`sparkconsole gateway status|sync|stop`: the one endpoint for every model (launch/gateway.py).

    sparkconsole gateway status      # where it listens and the models it lists (read inside its container)
    sparkconsole gateway sync --yes  # list exactly the workloads that serve now (start or reload it)
    sparkconsole gateway stop --yes

`recipe launch`, `restart` and `stop` keep it current themselves; these are for a look, a repair, the end of it.
The cluster file's `gateway:` section turns it on (port, and the LiteLLM image, command and volumes)."""

from __future__ import annotations

import argparse
from collections.abc import Coroutine
from typing import Any


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("gateway", help="the one endpoint for every running model: status, sync, stop",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("status", "sync", "stop"))
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (sync, stop)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    return _main(args)


async def _main(args: argparse.Namespace) -> int:
    from ..clusterfile import cluster_for
    from ..launch.gateway import Gateway, keep_current, url
    from ..launch.runner import Runner
    from .recipe import _confirm
    from .recipe_workloads import connect_all

    cluster = cluster_for(args)
    transports = await connect_all(cluster)
    try:
        gw = Gateway(cluster, Runner(cluster, transports))
        if args.action == "status":
            up = await gw.running()
            listed = await gw.listed() if up else None
            print(f"gateway {url(cluster)} ({gw.name} on {gw.head}): " + (
                ("lists " + (", ".join(listed) or "no model")) if listed is not None
                else ("running, its list not readable" if up else "not running")))
            return 0 if up else 1
        _confirm(args, f"{args.action} the gateway on {gw.head}?")
        if args.action == "stop":
            await gw.stop()
            print(f"stopped {gw.name} on {gw.head}")
            return 0
        report = await keep_current(cluster, transports)
        if report is not None:
            print(report.line())
        return 0
    finally:
        for t in transports.values():
            await t.close()
