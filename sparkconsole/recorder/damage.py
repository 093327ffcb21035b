"""Reading around damaged pages of a recorder file, and copying what is still readable into a new one.

A damaged page makes every query that touches it fail ("database disk image is malformed"), and SQLite says no
more than that. The recorder's tables are b-trees keyed by time (ticks, rollups, endpoint samples: per node or
endpoint; events: by id), so a query over a key range touches only the pages holding that range:

    rows = read_ranges(fetch, lo, hi, width, gaps, "ticks", "spark1")   # fetch(a, b, n): ≤ n rows, a ≤ key ≤ b

walks the range in key order; where a read fails it finds the last readable row, then gallops past the damage to
the next key where a read works, and records a Gap between the readable keys on either side. Every reader method uses
this on a damaged file (recorder/reader.py), so a post-mortem or a replay shows what is readable and says what
is not; `salvage(src, dst)` copies every readable row into a fresh file (`sparkconsole record repair`, and the
writer when it finds its own file damaged). Where SQL could not read, or could not open the file at all, the rows
are then read from the pages themselves (recorder/leaves.py, as `sqlite3 .recover` does): a damaged interior page
of a b-tree no longer costs the rows on the intact leaves below it, and each gap says how many rows in it came
back that way.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:
    from .leaves import LeafRows

DAMAGE_CODES = ("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_IOERR")
TIME_WIDTH_S = 1.0          # a gap in time is known to the second
MAX_NODE_ID_PROBE = 256     # node ids probed when the nodes table itself is unreadable


def is_damage(exc: BaseException, *, reading: bool = True) -> bool:
    """An error that says the file's content cannot be read (not a lock, not a full disk). For a writer an I/O
    error is not damage: the disk may come back, and the file is tried again rather than set aside."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    codes = DAMAGE_CODES if reading else DAMAGE_CODES[:2]
    return name.startswith(codes) or "malformed" in text or "not a database" in text


@dataclass
class Gap:
    table: str
    key: str | None             # the node or endpoint; None for the whole table
    after: float | None         # the last readable key before it (None: from the start)
    before: float | None        # the first readable key after it (None: to the end)
    error: str
    is_time: bool = True
    note: str | None = None     # instead of a key range: what could not be read
    recovered: int = 0          # rows in it read from the leaf pages below the damage (record repair)

    def overlaps(self, lo: float, hi: float) -> bool:
        """Whether what is missing may lie within [lo, hi] (events and node names: always, incidents come from them)."""
        if self.note or self.table in ("events", "nodes") or not self.is_time:
            return True
        return (self.after if self.after is not None else -math.inf) < hi \
            and (self.before if self.before is not None else math.inf) > lo

    def as_list(self) -> list[Any]:
        return [self.table, self.key, self.after, self.before, self.error, self.is_time, self.note, self.recovered]

    def text(self) -> str:
        if self.note:
            return f"{self.table}: {self.note} ({self.error})"
        def at(t: float) -> str:
            return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if self.is_time else f"id {t:.0f}"
        where = (f"between {at(self.after)} and {at(self.before)}" if self.after is not None and self.before is not None
                 else f"after {at(self.after)}" if self.after is not None
                 else f"before {at(self.before)}" if self.before is not None else "all of it")
        return (f"{self.table}" + (f" of {self.key}" if self.key else "") + f" unreadable {where} ({self.error})"
                + (f"; {self.recovered} rows in it read from its leaf pages" if self.recovered else ""))


def read_ranges(fetch: Callable[[float, float, int], list[Any]], lo: float, hi: float, width: float, gaps: list[Gap],
                table: str, key: str | None, *, integer: bool = False, desc: bool = False,
                first: int | None = None, chunk: int = 2000) -> list[Any]:
    """The readable rows with lo ≤ key ≤ hi, walking the key order (descending with `desc`), at most `first`.
    fetch(a, b, n): at most n rows with a ≤ key ≤ b in that order, key first. Where a read fails, smaller ones find
    the last readable row; past it the walk gallops (steps doubling from `width`) to the nearest key where a read
    works, narrows that to `width`, records the Gap between the readable keys on either side, and goes on."""
    out: list[Any] = []
    sign = -1 if desc else 1

    def past(k: float) -> float:
        return k + sign if integer else math.nextafter(k, sign * math.inf)

    def span(c: float) -> tuple[float, float]:
        return (lo, c) if desc else (c, hi)

    def ok(c: float) -> bool:
        try:
            fetch(*span(c), 1)
            return True
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                raise
            return False

    cur, last_good, open_gap = (hi if desc else lo), None, None
    while lo <= cur <= hi and (first is None or len(out) < first):
        n, rows, err = chunk if first is None else min(chunk, first - len(out)), None, ""
        while n >= 1:
            try:
                rows = fetch(*span(cur), n)
                break
            except sqlite3.DatabaseError as exc:
                if not is_damage(exc):
                    raise
                err, n = " ".join(str(exc).split())[:80], n // 2
        if rows is not None:
            if rows and open_gap is not None:
                setattr(open_gap, "after" if desc else "before", rows[0][0])
                open_gap = None
            out.extend(rows)
            if len(rows) < n:
                break
            last_good = rows[-1][0]
            cur = past(last_good)
            continue
        # `cur` lies in damage: the nearest key past it where a read works
        bad, good, step = cur, None, width
        while lo <= cur + sign * step <= hi:
            if ok(cur + sign * step):
                good = cur + sign * step
                break
            bad, step = cur + sign * step, step * 2
        gap = Gap(table, key, None, None, err, not integer)
        setattr(gap, "before" if desc else "after", last_good)
        gaps.append(gap)
        if good is None:
            break
        while abs(good - bad) > width:
            mid = (bad + good) // 2 if integer else bad + (good - bad) / 2
            if ok(mid):
                good = mid
            else:
                bad = mid
        open_gap, cur = gap, good
    return out


# ---- the copy into a new file

TABLES = ("ticks", "rollup", "events", "endpoint_samples")


def salvage(src: str | Path, dst: str | Path) -> tuple[dict[str, int], list[Gap], int]:
    """Every row SQLite can still read from `src`, then what only its leaf pages hold, into a new recorder file
    `dst` (which must not exist). Returns ({table: rows copied}, the gaps left, rows read from leaf pages).
    Raises UserError when nothing in src is readable, and OSError / sqlite3.Error when dst cannot be written."""
    from .leaves import read_leaves
    from .reader import RecorderReader
    from .store import connect

    if not Path(src).is_file():
        raise UserError(f"no recorder file at {src}", field="recorder", fix="give the path of a recorder file")
    try:
        r: RecorderReader | None = RecorderReader(src)
        unopened = ""
    except UserError as exc:                 # not even its schema reads: the pages are all there is
        r, unopened = None, exc.problem.rpartition("(")[2].rstrip(")")
    leaves = read_leaves(src) if r is None else None
    if leaves is not None and not leaves.rows:
        raise UserError(f"{src}: nothing in it is readable, neither by SQLite nor from its pages ({unopened})",
                        field="recorder",
                        fix="keep the file aside if it matters (nothing can be copied from it) and start a new "
                            "recording: `sparkconsole record` writes a fresh file")
    counts = dict.fromkeys(TABLES, 0)
    out = connect(dst)
    try:
        out.execute("BEGIN")
        copy = _Copy(out, counts)
        gaps = copy.readable(r) if r is not None else []
        if leaves is None and gaps:
            leaves = read_leaves(src)
        from_leaves = 0
        if leaves is not None:
            from_leaves = copy.leaves(leaves, {} if r is None else r.node_names())
            gaps = copy.settled(gaps)
            if r is None:
                gaps.append(Gap("file", None, None, None, unopened,
                                note="its header or schema is unreadable: every row was read from its pages"))
        # The gaps travel with the rows: a post-mortem of the new file still says what is missing.
        out.execute("INSERT OR REPLACE INTO meta VALUES('unreadable', ?)", (json.dumps([g.as_list() for g in gaps]),))
        out.execute("COMMIT")
        # a plain file, no -wal/-shm beside it: what was repaired is handed over whole
        out.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        out.execute("PRAGMA journal_mode=DELETE")
    finally:
        out.close()
        if r is not None:
            r.close()
    return counts, gaps, from_leaves


class _Copy:
    """Rows into the new file, counted; a node's id there looked up once."""

    def __init__(self, out: sqlite3.Connection, counts: dict[str, int]) -> None:
        self.out, self.counts = out, counts
        self._ids: dict[str, int] = {}
        self._events: set[tuple[Any, ...]] = set()

    def node(self, name: str) -> int:
        nid = self._ids.get(name)
        if nid is None:
            self.out.execute("INSERT OR IGNORE INTO nodes(name) VALUES(?)", (name,))
            nid = self._ids[name] = self.out.execute("SELECT id FROM nodes WHERE name=?", (name,)).fetchone()[0]
        return nid

    def put(self, table: str, sql: str, row: tuple[Any, ...]) -> int:
        n = self.out.execute(sql, row).rowcount
        self.counts[table] += n
        return n

    def readable(self, r: Any) -> list[Gap]:
        """What SQL reads of the damaged file (recorder/reader.py reads around the damage); the gaps it found."""
        for name in r.nodes():
            nid = self.node(name)
            for row in r.raw_ticks(name):
                self.put("ticks", f"INSERT OR REPLACE INTO ticks VALUES({', '.join('?' * (len(row) + 1))})",
                         (nid, *row))
            for row in r.raw_rollups(name):
                self.put("rollup", "INSERT OR REPLACE INTO rollup VALUES(?,?,?,?)", (nid, *row))
        for row in r.raw_events():
            self._events.add(tuple(row))
            self.put("events", "INSERT INTO events(node, t, kind, data) VALUES(?,?,?,?)", row)
        for row in r.raw_endpoint_samples():
            self.put("endpoint_samples", "INSERT OR REPLACE INTO endpoint_samples VALUES(?,?,?)", row)
        return list(r.gaps)

    def leaves(self, leaves: LeafRows, names: dict[int, str]) -> int:
        """The leaf pages' rows that SQL did not give (a row already copied stays as SQL read it); returns how
        many. Node ids become names by the nodes table's own leaves, else as SQL named them (node#N)."""
        for nid, name in leaves.nodes.items():
            old = names.get(nid)
            if old is not None and old != name and old.startswith("node#"):     # its name was unreadable by SQL
                self.out.execute("UPDATE nodes SET name=? WHERE name=?", (name, old))
                self._ids[name] = self._ids.pop(old)
            names[nid] = name
        got = 0
        for row in leaves.ticks:
            got += self.put("ticks", f"INSERT OR IGNORE INTO ticks VALUES({', '.join('?' * len(row))})",
                            (self.node(names.get(row[0], f"node#{row[0]}")), *row[1:]))
        for row in leaves.rollup:
            got += self.put("rollup", "INSERT OR IGNORE INTO rollup VALUES(?,?,?,?)",
                            (self.node(names.get(row[0], f"node#{row[0]}")), *row[1:]))
        for _, node, t, kind, data in sorted(leaves.events):
            if (node, t, kind, data) not in self._events:
                self._events.add((node, t, kind, data))
                got += self.put("events", "INSERT INTO events(node, t, kind, data) VALUES(?,?,?,?)",
                                (node, t, kind, data))
        for row in leaves.endpoint_samples:
            got += self.put("endpoint_samples", "INSERT OR IGNORE INTO endpoint_samples VALUES(?,?,?)", row)
        return got

    def settled(self, gaps: list[Gap]) -> list[Gap]:
        """The gaps once the pages' rows are in: each says how many rows in it came back (what sat on the damaged
        page itself is still lost: in the recorder's WITHOUT ROWID tables an interior page holds rows too); the
        gap of the node names closes when the names came back."""
        left = []
        for g in gaps:
            if g.table == "nodes" and not any(n.startswith("node#") for n in self._ids):
                continue
            where = {"ticks": ("ticks", "node"), "rollup": ("rollup", "node"),
                     "endpoint samples": ("endpoint_samples", "name")}.get(g.table)
            if where is not None and g.key is not None:
                key: Any = self._ids.get(g.key) if where[1] == "node" else g.key
                g.recovered = self.out.execute(f"SELECT count(*) FROM {where[0]} WHERE {where[1]}=? AND t>? AND t<?",
                                               (key, g.after if g.after is not None else -math.inf,
                                                g.before if g.before is not None else math.inf)).fetchone()[0]
            left.append(g)
        return left
