"""A tab's console, started before its tab (webface/spare.py keeps one waiting):

    python -m sparkconsole.webface.warm [sparkconsole's arguments, as the tab's console takes them]

imports what a console imports before and just after its first frame (the interpreter, Textual, the console's
screens, the monitor's layers: most of a tab's start), then waits on stdin for one start packet, in
textual-serve's framing (b"M", a 4-byte big-endian length, JSON): {"type": "start", "env": {NAME: value or
null}}, the environment the tab's console gets that this process was not started with (its terminal size). Then
it is that console: `sparkconsole.cli.main(arguments)`, which reads the cluster file and runs the app as ever.

Nothing else happens before the start: no cluster file read, no connection, no agent, no output. End of file (the
server stopped or was killed) or any other packet ends it at once.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

# Imported while the spare waits: what a tab's console imports before its first reading, attached to a collector
# (the first line) or on its own (its SSH stack) and with endpoints to show (the HTTP stack).
PRELOAD = ("sparkconsole.cli", "sparkconsole.clusterfile", "sparkconsole.tui.app", "textual.drivers.web_driver",
           "sparkconsole.collector.attach", "sparkconsole.collector.core", "sparkconsole.protect",
           "sparkconsole.nodes.ssh", "sparkconsole.collector.attach_serving")


def preload(argv: list[str]) -> None:
    from ..tui.heap import hold
    hold()          # as the console's own start does (tui/heap.py): the modules' objects are not walked meanwhile
    for name in PRELOAD:
        importlib.import_module(name)
    from .. import cli
    command = "demo" if "demo" in argv else "console"
    cli._module(command)
    if command == "console":
        # Its monitor's layers are imported now: it attaches while Textual lays out its first frame (tui/app.py).
        # (The demo's simulated cluster starts its processes once a reading is on screen: not ahead of it.)
        from ..tui.app import SparkConsoleApp
        SparkConsoleApp.monitors_before_first_frame = True


def _read_exactly(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def wait_for_start(fd: int = 0) -> dict[str, Any] | None:
    """The start packet's payload; None at end of file or on anything else (read unbuffered, so not a byte
    meant for the console's web driver is taken)."""
    head = _read_exactly(fd, 5)
    if head is None or head[:1] != b"M":
        return None
    payload = _read_exactly(fd, int.from_bytes(head[1:], "big"))
    try:
        d = json.loads(payload) if payload is not None else None
    except ValueError:
        return None
    if not isinstance(d, dict) or d.get("type") != "start" or not isinstance(d.get("env", {}), dict):
        return None
    return d


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    preload(argv)
    start = wait_for_start()
    if start is None:
        return 0
    for name, value in start.get("env", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    from ..cli import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
