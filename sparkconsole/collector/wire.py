"""What goes over the collector's socket: newline-delimited JSON, one object a line, each with a "type".

    collector   {pid, since, role, source, recorder}     first: who this is, and its recorder file
    hello       {node, rx, line}                         the agent's own hello line, as the collector took it
    tick        {node, rx, time, line}                   the agent's own tick line (nodes/samples.py reads both)
    node        {node, state, since, error, bad_lines, reboots}   a node's state, when it changes
    endpoint    {name, url, node, snap}                  an endpoint poll (serving/endpoint.py's snapshot)
    alert       {key, severity, source, message, time, active}    every raise and clear
    ready       {}                                       the current state has been sent; changes follow
    beat        {}                                       every BEAT_S: a collector that is silent longer is gone
    bye         {reason}                                 the last message before the collector closes this viewer:
                                                         it fell behind, or the collector has all the viewers it
                                                         serves (server.py's bounds)

On connect a viewer gets `collector`, then for each node its hello, its last ticks (the last one with the node's
containers in it) and its state, then each endpoint's last poll, the active alerts, then `ready`; after that each change as it happens.
The agent's lines travel as they came, so a viewer parses them with the same code a monitor uses, and `rx` (when
the collector received them) keeps every age the same on both sides.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .seams import Json

if TYPE_CHECKING:
    from ..serving.endpoint import EndpointSnapshot

BEAT_S = 1.0              # the collector says something at least this often
SILENT_S = 5.0            # a viewer that hears nothing for this long counts its collector gone (frozen, stopped)
MAX_LINE = 1 << 22         # a snapshot line is one agent line and a little: anything longer is not ours
SUN_PATH_MAX = 100         # sockaddr_un's path is 108 bytes with its NUL: a longer path goes through /proc


def encode(kind: str, **fields: Any) -> bytes:
    return (json.dumps({"type": kind, **fields}, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> Json | None:
    try:
        d = json.loads(line)
    except ValueError:
        return None
    return d if isinstance(d, dict) and isinstance(d.get("type"), str) else None


class ShortPath:
    """The socket's path as bind/connect can take it: itself, or (too long for sockaddr_un, as under a deep
    state dir) its directory's open descriptor through /proc/self/fd. Use as a context manager."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> str:
        if len(os.fsencode(str(self.path))) <= SUN_PATH_MAX:
            return str(self.path)
        self._fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return f"/proc/self/fd/{self._fd}/{self.path.name}"

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def snapshot_from(d: Json) -> EndpointSnapshot:
    """An endpoint message's `snap` back into the EndpointSnapshot the collector polled (JSON lists → tuples)."""
    from dataclasses import fields

    from ..serving.endpoint import EndpointSnapshot
    names = {f.name for f in fields(EndpointSnapshot)}
    return EndpointSnapshot(**{k: _tuples(v) for k, v in d.items() if k in names})
