"""`sparkconsole model list|pull|rm`: the model in every node's Hugging Face cache.

    sparkconsole model list [--node NAME …] [--json]
    sparkconsole model pull openai/gpt-oss-120b [--node NAME …] [--from NODE] [--revision REV] [--no-download] --yes
    sparkconsole model rm openai/gpt-oss-120b --node NAME [--node NAME …] --yes

`pull` takes the model from a node that has it (or downloads it with `hf download` on the first node when none
has it) and copies it to every other node over SSH, resumable, with progress and ETA. A copy goes into
<hub>/.sparkconsole-partial and is renamed into the hub only once whole: a launch never sees half a model.
Default nodes: every node of the cluster file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from ..config import ClusterConfig, NodeConfig
from ..errors import UserError
from ..nodes.connect import make_transport
from ..nodes.transport import Transport


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("model", help="models in each node's Hugging Face cache: list, pull to every node, rm",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="model_command", metavar="ACTION")
    sub.required = True
    ls = sub.add_parser("list", help="which models each node has, with sizes")
    add_nodes(ls)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    pl = sub.add_parser("pull", help="download on one node if needed, then copy to the nodes that lack it")
    pl.add_argument("model", help="Hugging Face model id, e.g. openai/gpt-oss-120b")
    add_nodes(pl)
    pl.add_argument("--from", dest="source", metavar="NODE", help="copy from this node (default: the first that has it)")
    pl.add_argument("--revision", help="download this revision (hf download --revision)")
    pl.add_argument("--no-download", action="store_true", help="never download; only copy between nodes")
    pl.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    rm = sub.add_parser("rm", help="remove a model (and any partial copy) from nodes' caches")
    rm.add_argument("model")
    add_nodes(rm)
    rm.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    for sp in (ls, pl, rm):
        sp.set_defaults(func=run)


def add_nodes(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", "-n", action="append", dest="nodes", metavar="NAME",
                   help="a node to act on (repeat, or comma-separated); default: every node of the cluster file")


def cluster_of(args: argparse.Namespace) -> ClusterConfig:
    from ..clusterfile import cluster_for
    return cluster_for(args)


def picked(cluster: ClusterConfig, wanted: Sequence[str] | None, source: str | None = None) -> list[NodeConfig]:
    """The --node list (default: every node), plus the --from node when it is not in it: a source is read, not
    changed, so `pull M --node spark2 --from spark1` copies from spark1 to spark2 only."""
    names = [n for w in (wanted or []) for n in w.split(",") if n]
    if not names:
        return list(cluster.nodes)
    if source and source not in names:
        names.append(source)
    known = {n.name: n for n in cluster.nodes}
    for n in names:
        if n not in known:
            raise UserError(f"unknown node {n!r}", field="--node", fix=f"use one of: {', '.join(known)}")
    return [known[n] for n in dict.fromkeys(names)]


def confirm(args: argparse.Namespace, question: str) -> None:
    if getattr(args, "yes", False):
        return
    if not sys.stdin.isatty():
        raise UserError("this changes the nodes and there is no terminal to confirm on", field="--yes",
                        fix="add --yes to run it headless")
    if input(f"{question} [y/N] ").strip().lower() not in ("y", "yes"):
        raise UserError("not confirmed", fix="answer y, or pass --yes")


async def open_transports(cluster: ClusterConfig, nodes: Sequence[NodeConfig]) -> list[Transport]:
    return [make_transport(n, cluster.ssh) for n in nodes]


async def close_all(ts: Sequence[Transport]) -> None:
    await asyncio.gather(*(t.close() for t in ts), return_exceptions=True)


async def run(args: argparse.Namespace) -> int:
    from ..distribute import models
    from ..distribute.progress import Printer, human

    cluster = cluster_of(args)
    nodes = picked(cluster, args.nodes, getattr(args, "source", None))
    action = args.model_command
    if action == "rm" and not args.nodes:
        raise UserError("model rm needs the nodes to remove it from", field="--node",
                        fix="name them: --node NAME (repeat)")
    if action != "list":
        from ..distribute.nodescript import cache_dir_name
        cache_dir_name(args.model)                          # a bad id is refused before anything connects
    ts = await open_transports(cluster, nodes)
    try:
        if action == "list":
            rows = await models.list_models(ts)
            if args.json:
                print(json.dumps([{"node": r.node, "hub": r.hub, "free": r.free, "error": r.error,
                                   "models": [m.__dict__ for m in r.models],
                                   "partial": [m.__dict__ for m in r.partial]} for r in rows], indent=1))
                return 1 if any(r.error for r in rows) else 0
            for r in rows:
                if r.error:
                    print(f"{r.node}: ERROR {r.error}")
                    continue
                print(f"{r.node}  {r.hub}  ({human(r.free or 0)} free)")
                for m in r.models:
                    print(f"  {m.model:<48} {human(m.size):>10}  {'complete' if m.complete else 'INCOMPLETE'}")
                for m in r.partial:
                    print(f"  {m.model:<48} {human(m.size):>10}  partial copy (resumes on the next pull)")
                if not r.models and not r.partial:
                    print("  (no models)")
            return 1 if any(r.error for r in rows) else 0
        if action == "pull":
            confirm(args, f"put {args.model} on {', '.join(n.name for n in nodes)}?")
            printer = Printer()
            report = await models.pull(args.model, ts, source=args.source, revision=args.revision,
                                       download_missing=not args.no_download, on_progress=printer)
            if report.downloaded:
                print(f"downloaded {args.model} on {report.source}")
            for node, n in report.copied.items():
                print(f"{node}: copied {human(n)} from {report.source}")
            for node in report.already:
                print(f"{node}: already complete")
            return 0
        confirm(args, f"remove {args.model} from {', '.join(n.name for n in nodes)}?")
        for node, freed in (await models.remove(args.model, ts)).items():
            print(f"{node}: removed {args.model} ({human(freed)} freed)" if freed else f"{node}: {args.model} not there")
        return 0
    finally:
        await close_all(ts)
