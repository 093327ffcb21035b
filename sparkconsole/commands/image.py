"""`sparkconsole image list|pull|rm`: the container image on every node.

    sparkconsole image list [IMAGE] [--node NAME …]
    sparkconsole image pull vllm-node [--node NAME …] [--from NODE] --yes
    sparkconsole image rm vllm-node --node NAME --yes

`pull` streams `docker save IMAGE` from a node that has it into `docker load` on every node that lacks it (or
holds a different image under that name), over SSH, with progress; docker tags the image only once the archive
is whole. Each node's docker is the one its environment names (DOCKER_HOST).
"""

from __future__ import annotations

import argparse
import asyncio

from ..errors import UserError
from .model import add_nodes, close_all, cluster_of, confirm, open_transports, picked


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("image", help="container images on each node: list, copy to every node, rm",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="image_command", metavar="ACTION")
    sub.required = True
    ls = sub.add_parser("list", help="the image on each node (or every image, without IMAGE)")
    ls.add_argument("image", nargs="?")
    pl = sub.add_parser("pull", help="copy the image from a node that has it to the nodes that lack it")
    pl.add_argument("image")
    pl.add_argument("--from", dest="source", metavar="NODE", help="copy from this node (default: the first that has it)")
    rm = sub.add_parser("rm", help="docker image rm on nodes")
    rm.add_argument("image")
    for sp in (ls, pl, rm):
        add_nodes(sp)
        if sp is not ls:
            sp.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
        sp.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    from ..distribute import images
    from ..distribute.progress import Printer, human

    cluster = cluster_of(args)
    nodes = picked(cluster, args.nodes, getattr(args, "source", None))
    action = args.image_command
    if args.image:
        images.check_image(args.image)
    if action == "rm" and not args.nodes:
        raise UserError("image rm needs the nodes to remove it from", field="--node", fix="name them: --node NAME")
    ts = await open_transports(cluster, nodes)
    try:
        if action == "list":
            if args.image:
                bad = 0
                for s in await asyncio.gather(*(images.state(t, args.image) for t in ts)):
                    bad += bool(s.error or not s.id)
                    print(f"{s.node}: " + (f"ERROR {s.error}" if s.error else
                                           f"{s.id[:19]}  {images.size_text(s.size)}" if s.id else "missing"))
                return 1 if bad else 0
            bad = 0
            for node, rows in (await images.list_images(ts)).items():
                if isinstance(rows, str):
                    # a node whose docker cannot be reached: its row says why, and the exit status says so too,
                    # as with an IMAGE (and `model list`)
                    bad += 1
                    print(f"{node}: ERROR {rows}")
                    continue
                print(node)
                for ref, ident, size in rows:
                    print(f"  {ref:<56} {ident:<14} {size}")
            return 1 if bad else 0
        if action == "pull":
            confirm(args, f"copy image {args.image} to {', '.join(n.name for n in nodes)}?")
            report = await images.pull(args.image, ts, source=args.source, on_progress=Printer())
            for node, n in report.copied.items():
                print(f"{node}: loaded {args.image} ({human(n)}) from {report.source}")
            for node in report.already:
                print(f"{node}: already has it")
            return 0
        confirm(args, f"remove image {args.image} from {', '.join(n.name for n in nodes)}?")
        failed = 0
        for node, what in (await images.remove(args.image, ts)).items():
            failed += what not in ("removed", "absent")
            print(f"{node}: {what}")
        return 1 if failed else 0
    finally:
        await close_all(ts)
