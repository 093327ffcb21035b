"""The `sparkconsole` command. Each subcommand lives in sparkconsole/commands/<name>.py and exposes
`register(subparsers)`, which adds its parser and sets `func=run(args) -> int` (async functions are awaited).

`sparkconsole` with no subcommand opens the console on the cluster file (or this machine as one node).
A `UserError` anywhere is printed as one line and exits 2 — never a traceback.

Start-up cost: `--version`, `--help` and argument errors must answer at interpreter speed, so this module
imports nothing of the product, and only the module of the command being run is imported (the others are
listed from HELP). Global options (`--cluster`, `--version`) are accepted before and after the command.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from . import __version__
from .errors import UserError

if TYPE_CHECKING:      # types only: `sparkconsole --help` imports as little as it can
    from collections.abc import Awaitable
    from types import ModuleType
    from typing import Any

# Order is the order shown in --help. A module that does not exist yet is skipped.
COMMANDS = ("console", "init", "demo", "status", "recipe", "gateway", "bench", "model", "image", "exporter", "serve",
            "record", "postmortem")

# Each command's one-line help, so `sparkconsole --help` lists them without importing their modules
# (tests/test_cli.py checks these against the modules' own). A command missing here still works: its
# module is then imported to list it.
HELP = {
    "console": "open the console on the cluster (the default command)",
    "init": "write sparkconsole.yaml from a spark-vllm-docker .env or ~/.ssh/config",
    "demo": "a simulated two-node GB10 cluster with a model served, in the console",
    "status": "one snapshot of every node (GPU, memory, OOM guards, containers)",
    "recipe": "list, plan, lint, launch, stop and restart model recipes",
    "gateway": "the one endpoint for every running model: status, sync, stop",
    "bench": "benchmark sweeps, results, reports and the topology advisor",
    "model": "models in each node's Hugging Face cache: list, pull to every node, rm",
    "image": "container images on each node: list, copy to every node, rm",
    "exporter": "serve the nodes' readings, guards, endpoints and alerts to Prometheus (/metrics)",
    "serve": "serve the console in a browser tab (textual-serve)",
    "record": "keep every node's readings on disk, headless (flight recorder)",
    "postmortem": "explain a node's last DOWN / reboot / container exit from the recorder",
}


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every level accepts. Below the top they default to SUPPRESS, so a subcommand that was not
    given `--cluster` leaves the value given before the command (or the top's default) in place."""
    have = parser._option_string_actions
    extra: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    if "--version" not in have:
        parser.add_argument("--version", action="version", version=f"sparkconsole {__version__}")
    if "--cluster" not in have:
        parser.add_argument("--cluster", metavar="PATH", **extra,
                            help="cluster file (default: ./sparkconsole.yaml, then ~/.config/sparkconsole/sparkconsole.yaml)"
                            if top else "cluster file (also accepted before the command)")


def _subparser_actions(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction[Any]]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _add_global_options_below(parser: argparse.ArgumentParser) -> None:
    for action in _subparser_actions(parser):
        for child in set(action.choices.values()):      # aliases map to the same parser
            _global_options(child, top=False)
            _add_global_options_below(child)


def _module(name: str) -> ModuleType | None:
    import importlib

    try:
        return importlib.import_module(f"sparkconsole.commands.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"sparkconsole.commands.{name}":
            return None
        raise


def build_parser(command: str | None = None, *, all_commands: bool = False) -> argparse.ArgumentParser:
    """The full parser for `command` (its module imported and registered); every other command is a stub
    that only lists it and takes any arguments. `all_commands=True` registers every module (tests, docs)."""
    parser = argparse.ArgumentParser(prog="sparkconsole", description="Operations console for DGX Spark vLLM clusters.")
    _global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if all_commands or name == command or name not in HELP:
            mod = _module(name)
            if mod is not None:
                mod.register(sub)
            continue
        stub = sub.add_parser(name, help=HELP[name], add_help=False)
        stub.add_argument("_rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    _add_global_options_below(parser)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """Which command argv names, found by argparse itself on the stub parser (abbreviations, `--cluster=F`,
    a file named like a command); exits for `--help`, `--version` and an unknown command, as argparse does."""
    ns, _ = build_parser().parse_known_args(argv)
    command: str | None = ns.command
    return command


def _relative_times(argv: list[str]) -> list[str]:
    """`--at -15m` as `--at=-15m`: argparse reads a value that starts with '-' (and is no plain number) as an
    option, and a time back from now (console --at, postmortem --at) is written that way."""
    import re

    out: list[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.fullmatch(r"-\d+(\.\d+)?[smhd]", arg):
            out[-1] += "=" + arg
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = _relative_times(sys.argv[1:] if argv is None else list(argv))
    command = _command_of(argv)
    if command is None:
        if "console" not in COMMANDS or _module("console") is None:
            build_parser().print_help()
            return 0
        command, argv = "console", [*argv, "console"]
    parser = build_parser(command)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:                     # a command with actions, given none (`sparkconsole bench`)
        _subparser_actions(parser)[0].choices[command].print_help(sys.stderr)
        return 2
    try:
        result = func(args)
        if hasattr(result, "__await__"):
            import asyncio

            result = asyncio.run(_ctrl_c_cancels(result))
        return int(result or 0)
    except UserError as err:
        print(f"sparkconsole: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `sparkconsole recipe plan … | head`: the reader left; say nothing more (as cat does), and keep Python's
        # exit-time flush of stdout from raising again into a traceback.
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


async def _ctrl_c_cancels(aw: Awaitable[int]) -> int:
    """Runs an async command; Ctrl-C cancels it (its `finally` blocks stop what it started) and it exits 130.

    The event loop takes SIGINT itself (its wake-up fd), not asyncio.run's Python-level handler: that one runs only
    once the main thread notices the signal, and a SIGINT delivered to one of asyncio's child-watcher threads
    (waiting on an agent) could stay unnoticed for good — a loaded CI machine caught `status --watch` ignoring
    Ctrl-C that way, its loop idle and the signal pending."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None              # asyncio.run runs this coroutine as a task
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        task.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (ValueError, RuntimeError, NotImplementedError):    # not the main thread: asyncio.run's own handling
        return await aw
    try:
        return await aw
    except asyncio.CancelledError:
        if not interrupted:
            raise
        return 130
    finally:
        loop.remove_signal_handler(signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())
