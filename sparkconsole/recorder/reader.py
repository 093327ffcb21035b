"""Reads a recorder file back (read-only; safe while a console or `sparkconsole record` writes it).

On a damaged file every method returns what SQLite can still read and adds what it could not to `.gaps`
(recorder/damage.py): callers say so (a post-mortem's "partial" block, the replay's notes), never presenting
the readable part as the whole. A value that is not a number where a reading should be reads as missing."""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import UserError
from .damage import MAX_NODE_ID_PROBE, TIME_WIDTH_S, Gap, is_damage, read_ranges
from .schema import TICK_COLUMNS, connect

ALL = (0.0, 1e11)            # every time a recording can hold, for a whole-table read
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


def _json(text: Any) -> Any:
    try:
        return json.loads(text) if text else None
    except (ValueError, TypeError):
        return None


def _num(v: object) -> int | float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


_TCOLS = ", ".join(f"t.{c}" for c in TICK_COLUMNS)


class RecorderReader:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise UserError(f"no recorder file at {self.path}", field="recorder",
                            fix="run the console or `sparkconsole record` first (recorder: enabled in the cluster file)")
        self.gaps: list[Gap] = []
        self.db = self._open()
        # A reader that refuses closes its connection now: left to the garbage collector (the refusal's traceback
        # keeps it alive), it would keep the writer from leaving its file clean (no -wal, no -shm) at exit.
        try:
            self.gaps += self._recorded_gaps()
            self._ids = self._load_nodes()
        except BaseException:
            self.db.close()
            raise
        self._events_all: list[dict[str, Any]] | None = None

    def _open(self) -> sqlite3.Connection:
        db = None
        try:
            db = connect(self.path, readonly=True)
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            if not db.execute("SELECT 1 FROM sqlite_master WHERE name='ticks'").fetchall():
                raise sqlite3.DatabaseError("it has no ticks table")
            return db
        except sqlite3.DatabaseError as exc:
            if db is not None:
                db.close()
            raise UserError(f"{self.path}: unreadable as a recorder file ({' '.join(str(exc).split())[:80]})",
                            field="recorder", fix="point --file at a file written by sparkconsole record; if this one "
                            "is damaged, `sparkconsole record repair FILE` copies what is readable") from None

    def close(self) -> None:
        self.db.close()

    def gap_texts(self, lo: float = -math.inf, hi: float = math.inf) -> list[str]:
        """What could not be read so far that may lie within [lo, hi], one line each, without repeats."""
        return list(dict.fromkeys(g.text() for g in self.gaps if g.overlaps(lo, hi)))

    def _recorded_gaps(self) -> list[Gap]:
        """The gaps of the damaged file this one was copied from (recorder/salvage.py keeps them)."""
        try:
            r = self._rows("SELECT value FROM meta WHERE key = 'unreadable'")
            return [Gap(*g) for g in json.loads(r[0][0])] if r else []
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                raise
            return [Gap("meta", None, None, None, " ".join(str(exc).split())[:80],
                        note="unreadable: whether this file was copied from a damaged one is not known")]
        except (ValueError, TypeError):
            return []

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        return self.db.execute(sql, args).fetchall()

    def _load_nodes(self) -> dict[str, int]:
        try:
            return {r[1]: r[0] for r in self._rows("SELECT id, name FROM nodes ORDER BY id")}
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                raise
            found: dict[str, int] = {}
            for nid in range(1, MAX_NODE_ID_PROBE + 1):     # the names are gone; the ticks still carry the ids
                try:
                    present = bool(self._rows("SELECT 1 FROM ticks WHERE node=? LIMIT 1", (nid,)))
                except sqlite3.DatabaseError:
                    present = True
                if present:
                    found[f"node#{nid}"] = nid
            self.gaps.append(Gap("nodes", None, None, None, " ".join(str(exc).split())[:80],
                                 note="the node names are unreadable; nodes are shown by number (node#1, …)"))
            return found

    def nodes(self) -> list[str]:
        return sorted(self._ids, key=self._ids.__getitem__)

    def node_names(self) -> dict[int, str]:
        """The file's node ids and the names read for them (node#N where the names are unreadable)."""
        return {i: n for n, i in self._ids.items()}

    def tick_counts(self) -> dict[str, int]:
        try:
            return {r[0]: r[1] for r in self._rows(
                "SELECT n.name, count(*) FROM ticks t JOIN nodes n ON n.id = t.node GROUP BY n.name")}
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                raise
            return {n: len(self._tick_rows(n, *ALL)) for n in self.nodes()}

    def _ranged(self, sql: str, pre: tuple[Any, ...], since: float, until: float, table: str, key: str | None, *,
                desc: bool = False, first: int | None = None) -> list[Any]:
        """`sql` selects key-first rows with pre + (a, b) and ends in ORDER BY key; read at once, or around the damage."""
        order = " DESC" if desc else ""
        try:
            return self._rows(sql + order + (" LIMIT ?" if first else ""), (*pre, since, until, *((first,) if first else ())))
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                raise
        return read_ranges(lambda a, b, n: self._rows(sql + order + " LIMIT ?", (*pre, a, b, n)), since, until,
                           TIME_WIDTH_S, self.gaps, table, key, desc=desc, first=first)

    def _tick_rows(self, node: str, since: float, until: float, **kw: Any) -> list[Any]:
        nid = self._ids.get(node)
        if nid is None:
            return []
        return self._ranged(f"SELECT t.t, {_TCOLS} FROM ticks t WHERE t.node = ? AND t.t >= ? AND t.t <= ? ORDER BY t.t",
                            (nid,), since, until, "ticks", node, **kw)

    def ticks(self, node: str, since: float, until: float) -> list[dict[str, Any]]:
        keys = ("t", *TICK_COLUMNS)
        return [dict(zip(keys, map(_num, r), strict=False)) for r in self._tick_rows(node, since, until)]

    def raw_ticks(self, node: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._tick_rows(node, *ALL)]

    def last_tick_before(self, node: str, t: float) -> dict[str, Any] | None:
        rows = self._tick_rows(node, 0.0, t, desc=True, first=1)
        return dict(zip(("t", *TICK_COLUMNS), map(_num, rows[0]), strict=False)) if rows else None

    def _rollup_rows(self, node: str, since: float, until: float) -> list[Any]:
        nid = self._ids.get(node)
        if nid is None:
            return []
        return self._ranged("SELECT t, n, data FROM rollup WHERE node = ? AND t >= ? AND t <= ? ORDER BY t",
                            (nid,), since, until, "rollup", node)

    def rollups(self, node: str, since: float, until: float) -> list[dict[str, Any]]:
        return [{"t": r[0], "n": r[1], "data": _json(r[2]) or {}} for r in self._rollup_rows(node, since, until)]

    def raw_rollups(self, node: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._rollup_rows(node, *ALL)]

    # ---- events: by (node, t) through their index; around damage by id, the table's own key
    def _all_events(self) -> list[dict[str, Any]]:
        if self._events_all is None:
            sql = "SELECT id, node, t, kind, data FROM events NOT INDEXED WHERE id >= ? AND id <= ? ORDER BY id"
            try:
                rows = self._rows(sql, (0, 1 << 62))
            except sqlite3.DatabaseError as exc:
                if not is_damage(exc):
                    raise
                first = len(self.gaps)
                rows = read_ranges(lambda a, b, n: self._rows(sql + " LIMIT ?", (a, b, n)), 0, 1 << 62, 1, self.gaps,
                                   "events", None, integer=True)
                when = {r[0]: r[2] for r in rows}
                for g in self.gaps[first:]:         # ids → the times of the readable events around the gap
                    g.after, g.before, g.is_time = when.get(g.after), when.get(g.before), True
            self._events_all = sorted(({"id": r[0], "node": r[1], "t": r[2], "kind": r[3], "data": _json(r[4])}
                                       for r in rows if isinstance(r[2], (int, float))), key=lambda e: (e["t"], e["id"]))
        return self._events_all

    def events(self, node: str | None, since: float, until: float,
               kinds: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        q = "SELECT node, t, kind, data FROM events WHERE t >= ? AND t <= ?"
        args: list[Any] = [since, until]
        if node is not None:
            q += " AND node = ?"
            args.append(node)
        if kinds:
            q += f" AND kind IN ({','.join('?' * len(kinds))})"
            args += kinds
        try:
            return [{"node": r[0], "t": r[1], "kind": r[2], "data": _json(r[3])}
                    for r in self._rows(q + " ORDER BY t, id", args)]
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                raise
        return [{k: e[k] for k in ("node", "t", "kind", "data")} for e in self._all_events()
                if since <= e["t"] <= until and (node is None or e["node"] == node) and (not kinds or e["kind"] in kinds)]

    def last_event_before(self, node: str, kind: str, t: float) -> dict[str, Any] | None:
        try:
            r = self.db.execute("SELECT node, t, kind, data FROM events WHERE node = ? AND kind = ? AND t <= ? "
                                "ORDER BY t DESC, id DESC LIMIT 1", (node, kind, t)).fetchone()
            return None if r is None else {"node": r[0], "t": r[1], "kind": r[2], "data": _json(r[3])}
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                raise
        found = self.events(node, 0.0, t, (kind,))
        return found[-1] if found else None

    def raw_events(self) -> list[tuple[Any, ...]]:
        return [(e["node"], e["t"], e["kind"], json.dumps(e["data"])) for e in self._all_events()]

    # ---- endpoint samples
    def _endpoint_rows(self, name: str, since: float, until: float) -> list[Any]:
        return self._ranged("SELECT t, data FROM endpoint_samples WHERE name = ? AND t >= ? AND t <= ? ORDER BY t",
                            (name,), since, until, "endpoint samples", name)

    def endpoint_samples(self, name: str, since: float, until: float) -> list[dict[str, Any]]:
        out = []
        for r in self._endpoint_rows(name, since, until):
            d = _json(r[1])
            if isinstance(d, dict):
                out.append({"t": r[0], **d})
        return out

    def endpoint_names(self) -> list[str]:
        names: list[str] = []
        while True:      # one seek per name: a damaged page costs the names behind it, not the whole list
            try:
                r = self._rows("SELECT name FROM endpoint_samples WHERE name > ? ORDER BY name LIMIT 1",
                               (names[-1] if names else "",))
            except sqlite3.DatabaseError as exc:
                if not is_damage(exc):
                    raise
                self.gaps.append(Gap("endpoint samples", None, None, None, " ".join(str(exc).split())[:80],
                                     note="the endpoint names past " + (names[-1] if names else "the first")
                                     + " are unreadable"))
                return names
            if not r:
                return names
            names.append(r[0][0])

    def raw_endpoint_samples(self) -> list[tuple[Any, ...]]:
        return [(name, r[0], r[1]) for name in self.endpoint_names() for r in self._endpoint_rows(name, *ALL)]

    def span(self) -> tuple[float, float] | None:
        firsts, lasts = [], []
        for node in self._ids:
            a = self._tick_rows(node, *ALL, first=1)
            b = self._tick_rows(node, *ALL, first=1, desc=True)
            if a and b:
                firsts.append(a[0][0])
                lasts.append(b[0][0])
        return (min(firsts), max(lasts)) if firsts else None
