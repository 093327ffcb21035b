"""The audit log: one JSON line per action the console took on a node — who, when, where, the exact command.

Lives at state_dir()/audit.log (0600). Commands are redacted before they are written, so the log can be
shown and shared. Appends are single O_APPEND writes, so lines from concurrent writers never interleave.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import paths, secrets

LOG_NAME = "audit.log"
# Past this size the log is rotated to audit.log.1 (one generation kept).
MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class AuditEntry:
    time: float
    who: str
    node: str
    action: str
    command: str


def log_path() -> Path:
    return paths.state_dir() / LOG_NAME


def _who() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry and no LOGNAME (some containers)
        return f"uid{os.getuid()}"


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(str(text).split())[:limit]


def record(action: str, node: str, command: str | Sequence[str]) -> None:
    """Append one entry; `command` (a shell string or an argv list) is redacted first."""
    if not isinstance(command, str):
        command = shlex.join(secrets.redact_argv(command))
    entry = {"time": round(time.time(), 3), "who": _who(), "node": _one_line(node),
             "action": _one_line(action), "command": secrets.redact(command)}
    line = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
    path = log_path()
    try:
        if path.stat().st_size + len(line) > MAX_BYTES:
            os.replace(path, path.with_name(LOG_NAME + ".1"))
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read(limit: int | None = None, *, node: str | None = None) -> list[AuditEntry]:
    """Entries oldest first (the last `limit` when given); unreadable lines are skipped."""
    path = log_path()
    keep: deque[AuditEntry] = deque(maxlen=limit if limit and limit > 0 else None)
    try:
        fh = path.open("r", encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    with fh:
        for raw in fh:
            try:
                d = json.loads(raw)
                e = AuditEntry(time=float(d["time"]), who=str(d["who"]), node=str(d["node"]),
                               action=str(d["action"]), command=str(d["command"]))
            except (ValueError, KeyError, TypeError):
                continue
            if node is None or e.node == node:
                keep.append(e)
    return list(keep)
