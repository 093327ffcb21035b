"""The `sparkconsole` command. Each subcommand lives in sparkconsole/commands/<name>.py and exposes
`register(subparsers)`, which adds its parser and sets `func=run(args) -> int` (async functions are awaited).

`sparkconsole` with no subcommand opens the console on the cluster file (or this machine as one node).
A `UserError` anywhere is printed as one line and exits 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import sys

from . import __version__
from .errors import UserError

# Order is the order shown in --help. A module that does not exist yet is skipped.
COMMANDS = ("console", "demo", "status", "recipe", "bench", "record", "postmortem")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkconsole", description="Operations console for DGX Spark vLLM clusters.")
    parser.add_argument("--version", action="version", version=f"sparkconsole {__version__}")
    parser.add_argument("--cluster", metavar="PATH", help="cluster file (default: ./sparkconsole.yaml, "
                        "then ~/.config/sparkconsole/sparkconsole.yaml)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"sparkconsole.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"sparkconsole.commands.{name}":
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        if "console" not in parser._subparsers._group_actions[0].choices:  # type: ignore[union-attr]
            parser.print_help()
            return 0
        args = parser.parse_args(["console"] if argv is None else [*argv, "console"])
        func = args.func
    try:
        result = func(args)
        if inspect.iscoroutine(result):
            result = asyncio.run(result)
        return int(result or 0)
    except UserError as err:
        print(f"sparkconsole: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
