"""Reading around damaged pages of a recorder file (what is still readable is copied into a new one by
recorder/salvage.py).

A damaged page makes every query that touches it fail ("database disk image is malformed"), and SQLite says no
more than that. The recorder's tables are b-trees keyed by time (ticks, rollups, endpoint samples: per node or
endpoint; events: by id), so a query over a key range touches only the pages holding that range:

    rows = read_ranges(fetch, lo, hi, width, gaps, "ticks", "spark1")   # fetch(a, b, n): ≤ n rows, a ≤ key ≤ b

walks the range in key order; where a read fails it finds the last readable row, then gallops past the damage to
the next key where a read works, and records a Gap between the readable keys on either side. Every reader method uses
this on a damaged file (recorder/reader.py), so a post-mortem or a replay shows what is readable and says what
is not; `salvage(src, dst)` (recorder/salvage.py) copies every readable row into a fresh file (`sparkconsole
record repair`, and the writer when it finds its own file damaged). Where SQL could not read, or could not open the
file at all, the rows are then read from the pages themselves (recorder/leaves.py, as `sqlite3 .recover` does): a
damaged interior page of a b-tree no longer costs the rows on the intact leaves below it, and each gap says how
many rows in it came
back that way.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

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
        # `cur` lies in damage
        gap = Gap(table, key, None, None, err, not integer)
        setattr(gap, "before" if desc else "after", last_good)
        gaps.append(gap)
        good = _next_readable(ok, cur, sign, width, (lo, hi), integer=integer)
        if good is None:
            break
        open_gap, cur = gap, good
    return out


def _next_readable(ok: Callable[[float], bool], cur: float, sign: int, width: float, bounds: tuple[float, float], *,
                   integer: bool) -> float | None:
    """The nearest key past `cur` (in the walk's direction, `sign`) where a read works, found to within `width`:
    steps doubling from `width` until one reads, then halving back; None when none does within `bounds`."""
    lo, hi = bounds
    bad, good, step = cur, None, width
    while lo <= cur + sign * step <= hi:
        if ok(cur + sign * step):
            good = cur + sign * step
            break
        bad, step = cur + sign * step, step * 2
    if good is None:
        return None
    while abs(good - bad) > width:
        mid = (bad + good) // 2 if integer else bad + (good - bad) / 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good
