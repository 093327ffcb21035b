"""Reads a recorder file back (read-only; safe while a console or `sparkconsole record` writes it)."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from datetime import datetime
from pathlib import Path

from ..errors import UserError
from .store import TICK_COLUMNS, connect


_REL = re.compile(r"^-(\d+(?:\.\d+)?)\s*([smhd])$")


def parse_at(text: str, now: float | None = None, *, field: str = "--at") -> float:
    """'2026-11-24 03:10[:SS]' (local time), an ISO time, epoch seconds, or '-15m' / '-90s' / '-2h' / '-1d'."""
    now = time.time() if now is None else now
    s = text.strip()
    m = _REL.match(s)
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return float(s) if re.match(r"^\d{9,}(\.\d+)?$", s) else datetime.fromisoformat(s).timestamp()
    except ValueError:
        raise UserError(f"cannot read the time {s[:40]!r}", field=field,
                        fix='write "2026-11-24 03:10" (local time) or a relative time such as -15m') from None


class RecorderReader:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise UserError(f"no recorder file at {self.path}", field="recorder",
                            fix="run the console or `sparkconsole record` first (recorder: enabled in the cluster file)")
        try:
            self.db = connect(self.path, readonly=True)
            self.db.execute("SELECT 1 FROM ticks LIMIT 1")
        except sqlite3.DatabaseError as exc:
            raise UserError(f"{self.path}: not a recorder file ({exc})", field="recorder",
                            fix="point --file at a file written by sparkconsole record") from None

    def close(self) -> None:
        self.db.close()

    def nodes(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT name FROM nodes ORDER BY id")]

    def tick_counts(self) -> dict[str, int]:
        return {r[0]: r[1] for r in self.db.execute(
            "SELECT n.name, count(*) FROM ticks t JOIN nodes n ON n.id = t.node GROUP BY n.name")}

    def ticks(self, node: str, since: float, until: float) -> list[dict]:
        cols = ", ".join(f"t.{c}" for c in TICK_COLUMNS)
        rows = self.db.execute(f"SELECT t.t, {cols} FROM ticks t JOIN nodes n ON n.id = t.node "
                               "WHERE n.name = ? AND t.t >= ? AND t.t <= ? ORDER BY t.t", (node, since, until))
        return [dict(r) for r in rows]

    def last_tick_before(self, node: str, t: float) -> dict | None:
        cols = ", ".join(f"t.{c}" for c in TICK_COLUMNS)
        r = self.db.execute(f"SELECT t.t, {cols} FROM ticks t JOIN nodes n ON n.id = t.node "
                            "WHERE n.name = ? AND t.t <= ? ORDER BY t.t DESC LIMIT 1", (node, t)).fetchone()
        return dict(r) if r else None

    def rollups(self, node: str, since: float, until: float) -> list[dict]:
        rows = self.db.execute("SELECT r.t, r.n, r.data FROM rollup r JOIN nodes n ON n.id = r.node "
                               "WHERE n.name = ? AND r.t >= ? AND r.t <= ? ORDER BY r.t", (node, since, until))
        return [{"t": r["t"], "n": r["n"], "data": json.loads(r["data"])} for r in rows]

    def events(self, node: str | None, since: float, until: float, kinds: tuple[str, ...] = ()) -> list[dict]:
        q = "SELECT node, t, kind, data FROM events WHERE t >= ? AND t <= ?"
        args: list = [since, until]
        if node is not None:
            q += " AND node = ?"
            args.append(node)
        if kinds:
            q += f" AND kind IN ({','.join('?' * len(kinds))})"
            args += kinds
        return [{"node": r["node"], "t": r["t"], "kind": r["kind"], "data": json.loads(r["data"]) if r["data"] else None}
                for r in self.db.execute(q + " ORDER BY t, id", args)]

    def last_event_before(self, node: str, kind: str, t: float) -> dict | None:
        r = self.db.execute("SELECT node, t, kind, data FROM events WHERE node = ? AND kind = ? AND t <= ? "
                            "ORDER BY t DESC, id DESC LIMIT 1", (node, kind, t)).fetchone()
        return None if r is None else {"node": r["node"], "t": r["t"], "kind": r["kind"],
                                       "data": json.loads(r["data"]) if r["data"] else None}

    def endpoint_samples(self, name: str, since: float, until: float) -> list[dict]:
        return [{"t": r["t"], **json.loads(r["data"])} for r in self.db.execute(
            "SELECT t, data FROM endpoint_samples WHERE name = ? AND t >= ? AND t <= ? ORDER BY t", (name, since, until))]

    def span(self) -> tuple[float, float] | None:
        r = self.db.execute("SELECT min(t), max(t) FROM ticks").fetchone()
        return None if r[0] is None else (r[0], r[1])
