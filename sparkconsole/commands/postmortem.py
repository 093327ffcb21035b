"""`sparkconsole postmortem NODE [--at T] [--format md|json] [--file PATH | --demo]`: why a node went DOWN, rebooted
or lost its container, from the flight recorder (see recorder/postmortem.py for the verdicts)."""

from __future__ import annotations

import argparse
import json
import sys

from .status import load


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("postmortem", help="explain a node's last DOWN / reboot / container exit from the recorder",
                              description=__doc__)
    p.add_argument("node", metavar="NODE")
    p.add_argument("--at", metavar="T", help='the incident at or before T: "2026-11-24 03:10" or -15m (default: the latest)')
    p.add_argument("--format", choices=("md", "json"), default="md")
    p.add_argument("--file", metavar="PATH", help="recorder file (default: the cluster's in the state dir; with no "
                   "cluster file and no recording of this machine holding NODE, the latest demo recording)")
    p.add_argument("--demo", action="store_true", help="read the latest `sparkconsole demo` recording")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..recorder.postmortem import build, to_markdown
    from ..recorder.reader import RecorderReader, parse_at
    from ..recorder.replay import recording_for

    cluster = load(args)
    _, path, chosen = recording_for(cluster, file=args.file, demo=args.demo, node=args.node,
                                    cluster_given=cluster.source != "<this machine>")
    if chosen:
        print(f"sparkconsole: {chosen}", file=sys.stderr)
    at = parse_at(args.at) if args.at else None
    reader = RecorderReader(path)
    try:
        pm = build(reader, args.node, at)
    finally:
        reader.close()
    sys.stdout.write(json.dumps(pm, indent=1, default=str) + "\n" if args.format == "json" else to_markdown(pm))
    if pm["unreadable"]:
        print(f"sparkconsole: a partial post-mortem: {len(pm['unreadable'])} part(s) of {path} are unreadable "
              f"(listed in it) — fix: `sparkconsole record repair {path}` copies what is readable", file=sys.stderr)
    return 0
