"""A damaged recorder file's readable rows copied into a new file: what SQL still reads (recorder/damage.py's
walk around the damage), then what only the leaf pages hold (recorder/leaves.py). `sparkconsole record repair`,
and the writer (recorder/store.py) when it finds its own file damaged."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

from ..errors import UserError
from .damage import Gap
from .leaves import LeafRows, read_leaves
from .reader import RecorderReader
from .schema import connect

TABLES = ("ticks", "rollup", "events", "endpoint_samples")


def salvage(src: str | Path, dst: str | Path) -> tuple[dict[str, int], list[Gap], int]:
    """Every row SQLite can still read from `src`, then what only its leaf pages hold, into a new recorder file
    `dst` (which must not exist). Returns ({table: rows copied}, the gaps left, rows read from leaf pages).
    Raises UserError when nothing in src is readable, and OSError / sqlite3.Error when dst cannot be written."""
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
