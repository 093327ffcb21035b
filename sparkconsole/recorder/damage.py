"""Reading around damaged pages of a recorder file, and copying what is still readable into a new one.

A damaged page makes every query that touches it fail ("database disk image is malformed"), and SQLite says no
more than that. The recorder's tables are b-trees keyed by time (ticks, rollups, endpoint samples: per node or
endpoint; events: by id), so a query over a key range touches only the pages holding that range:

    rows = read_ranges(fetch, lo, hi, width, gaps, "ticks", "spark1")   # fetch(a, b): the rows with a ≤ key ≤ b

tries the whole range, and where it fails splits it in two, down to pieces `width` wide; the pieces that still
fail are the gap, recorded as a Gap between the nearest readable keys on either side. Every reader method uses
this on a damaged file (recorder/reader.py), so a post-mortem or a replay shows what is readable and says what
is not; `salvage(src, dst)` copies every readable row into a fresh file (`sparkconsole record repair`, and the
writer when it finds its own file damaged).
"""

from __future__ import annotations

import math
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DAMAGE_CODES = ("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_IOERR")
TIME_WIDTH_S = 1.0          # a gap in time is known to the second
MAX_NODE_ID_PROBE = 256     # node ids probed when the nodes table itself is unreadable


def is_damage(exc: BaseException) -> bool:
    """An error that says the file's content cannot be read (not a lock, not a full disk)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    return name.startswith(DAMAGE_CODES) or "malformed" in text or "not a database" in text


@dataclass
class Gap:
    table: str
    key: str | None             # the node or endpoint; None for the whole table
    after: float | None         # the last readable key before it (None: from the start)
    before: float | None        # the first readable key after it (None: to the end)
    error: str
    is_time: bool = True
    note: str | None = None     # instead of a key range: what could not be read

    def text(self) -> str:
        if self.note:
            return f"{self.table}: {self.note} ({self.error})"
        def at(t: float) -> str:
            return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if self.is_time else f"id {t:.0f}"
        where = (f"between {at(self.after)} and {at(self.before)}" if self.after is not None and self.before is not None
                 else f"after {at(self.after)}" if self.after is not None
                 else f"before {at(self.before)}" if self.before is not None else "all of it")
        return f"{self.table}" + (f" of {self.key}" if self.key else "") + f" unreadable {where} ({self.error})"


def read_ranges(fetch: Callable[[float, float], list], lo: float, hi: float, width: float, gaps: list[Gap],
                table: str, key: str | None, *, keyof: Callable = lambda row: row[0], integer: bool = False) -> list:
    """fetch(a, b) over [lo, hi], splitting around the pieces that fail with damage (see the module's doc)."""
    out: list = []
    bad: list[tuple[float, float, str]] = []

    def go(a: float, b: float) -> None:
        try:
            out.extend(fetch(a, b))
            return
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                raise
            if b - a <= width:
                bad.append((a, b, " ".join(str(exc).split())[:80]))
                return
        mid = (a + b) // 2 if integer else a + (b - a) / 2
        go(a, mid)
        go(mid + 1 if integer else math.nextafter(mid, math.inf), b)

    go(lo, hi)
    if bad:
        keys = sorted(keyof(r) for r in out)
        merged: list[list] = []
        for a, b, err in bad:
            if merged and _adjacent(merged[-1][1], a, keys):
                merged[-1][1] = b
            else:
                merged.append([a, b, err])
        for a, b, err in merged:
            after = max((k for k in keys if k < a), default=None)
            before = min((k for k in keys if k > b), default=None)
            gaps.append(Gap(table, key, after, before, err, not integer))
    return out


def _adjacent(prev_end: float, start: float, keys: list) -> bool:
    """Two failed pieces are one gap when no readable key lies between them."""
    return not any(prev_end < k < start for k in keys)


# ---- the copy into a new file

def salvage(src: str | Path, dst: str | Path) -> tuple[dict[str, int], list[Gap]]:
    """Every row SQLite can still read from `src` into a new recorder file `dst` (which must not exist).
    Returns ({table: rows copied}, the gaps). Raises sqlite3.DatabaseError when src cannot be opened at all."""
    from .reader import RecorderReader
    from .store import connect

    r = RecorderReader(src)
    counts = {"ticks": 0, "rollup": 0, "events": 0, "endpoint_samples": 0}
    out = connect(dst)
    try:
        out.execute("BEGIN")
        for name in r.nodes():
            out.execute("INSERT OR IGNORE INTO nodes(name) VALUES(?)", (name,))
            nid = out.execute("SELECT id FROM nodes WHERE name=?", (name,)).fetchone()[0]
            for row in r.raw_ticks(name):
                out.execute(f"INSERT OR REPLACE INTO ticks VALUES({', '.join('?' * len(row))})", (nid, *row))
                counts["ticks"] += 1
            for row in r.raw_rollups(name):
                out.execute("INSERT OR REPLACE INTO rollup VALUES(?,?,?,?)", (nid, *row))
                counts["rollup"] += 1
        for row in r.raw_events():
            out.execute("INSERT INTO events(node, t, kind, data) VALUES(?,?,?,?)", row)
            counts["events"] += 1
        for row in r.raw_endpoint_samples():
            out.execute("INSERT OR REPLACE INTO endpoint_samples VALUES(?,?,?)", row)
            counts["endpoint_samples"] += 1
        out.execute("COMMIT")
        out.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        out.close()
        r.close()
    return counts, list(r.gaps)
