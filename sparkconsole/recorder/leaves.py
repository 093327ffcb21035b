"""Rows read straight from the pages of a recorder file, for what SQL cannot reach.

A damaged interior page of a b-tree cuts SQL off from every leaf below it, though the leaves, where the rows are,
may be whole: `sqlite3 .recover` reads them directly. Python's sqlite3 offers neither SQLite's recovery extension
nor its `sqlite_dbpage` / `sqlite_dbdata` tables (not in the builds it links), so this module reads the file format
itself (https://www.sqlite.org/fileformat2.html): every page whose type is a table leaf or an index page (the
recorder's WITHOUT ROWID tables are index b-trees, whose interior pages hold rows too), each cell's record
(following overflow pages), its values by their serial types. A row is given to a table of the recorder's own
schema (recorder/store.py) by its shape; anything else (the schema, the indexes, a page of random bytes) is left
out, and so are the pages on the freelist (what retention deleted). A file with a WAL beside it is read from a copy
whose WAL was checkpointed into it first, so the newest version of each page is the one read.
"""

from __future__ import annotations

import contextlib
import mmap
import shutil
import sqlite3
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .store import TICK_COLUMNS

MAGIC = b"SQLite format 3\x00"
TABLE_LEAF, INDEX_LEAF, INDEX_INTERIOR = 13, 10, 2
ROW_PAGES = (TABLE_LEAF, INDEX_LEAF, INDEX_INTERIOR)      # the page types whose cells hold rows
PAGE_SIZES = tuple(1 << n for n in range(9, 17))      # 512 … 65536
Data = bytes | mmap.mmap                               # the file's bytes, mapped


@dataclass
class LeafRows:
    """What the leaf pages hold, in the recorder's tables' column order (node ids as the file numbered them)."""
    nodes: dict[int, str] = field(default_factory=dict)                 # node id -> name
    ticks: list[tuple[Any, ...]] = field(default_factory=list)          # (node id, t, *TICK_COLUMNS)
    rollup: list[tuple[Any, ...]] = field(default_factory=list)         # (node id, t, n, data)
    events: list[tuple[Any, ...]] = field(default_factory=list)         # (id, node, t, kind, data)
    endpoint_samples: list[tuple[Any, ...]] = field(default_factory=list)   # (name, t, data)
    pages: int = 0                                                      # pages read rows from

    @property
    def rows(self) -> int:
        return len(self.ticks) + len(self.rollup) + len(self.events) + len(self.endpoint_samples)


def read_leaves(path: str | Path) -> LeafRows:
    """Every row of the recorder's tables found on a page of `path` (with its WAL checkpointed in a copy). The file
    is mapped, not read into memory: a recorder file may be a gigabyte."""
    path = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        src = _with_wal(path, Path(tmp))
        if src.stat().st_size == 0:
            return LeafRows()
        with open(src, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _rows(data)


def _rows(data: Data) -> LeafRows:
    out = LeafRows()
    size, usable = _page_size(data)
    free = _freelist(data, size)
    for n in range(1, len(data) // size + 1):
        if n in free:                   # a freed page keeps the rows deleted from it (retention): not rows
            continue
        page = data[(n - 1) * size:n * size]
        head = 100 if n == 1 else 0
        if page[head] not in ROW_PAGES:
            continue
        cells = _cells(data, page, head, size, usable)
        if cells is None:
            continue
        out.pages += 1
        for rowid, values in cells:
            _place(out, rowid, values)
    return out


def _with_wal(path: Path, tmp: Path) -> Path:
    """The file; with a WAL beside it, a copy into which SQLite checkpointed the WAL (when the copy opens at all:
    with a damaged header the main file is read as it is)."""
    wal = Path(f"{path}-wal")
    if not wal.exists() or wal.stat().st_size == 0:
        return path
    copy = tmp / "copy.sqlite"
    shutil.copyfile(path, copy)
    shutil.copyfile(wal, f"{copy}-wal")
    with contextlib.suppress(sqlite3.Error):
        db = sqlite3.connect(copy)
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
    return copy


def _page_size(data: Data) -> tuple[int, int]:
    """(page size, usable bytes per page) from the header; with the header gone, the size at which most pages
    read as pages with rows (a recorder file is mostly leaves)."""
    if data[:16] == MAGIC:
        size = struct.unpack(">H", data[16:18])[0]
        size = 65536 if size == 1 else size
        if size in PAGE_SIZES:
            return size, size - data[20]
    best = max(PAGE_SIZES, key=lambda s: sum(_cells(data, data[i:i + s], 0, s, s) is not None
                                            for i in range(s, len(data) - s + 1, s)))
    return best, best


def _freelist(data: Data, size: int) -> set[int]:
    """The pages on the file's freelist (trunk pages and the leaves they list), as far as the chain reads."""
    if data[:16] != MAGIC:
        return set()
    pages = len(data) // size
    trunk, total = struct.unpack(">II", data[32:40])
    free: set[int] = set()
    while 1 <= trunk <= pages and trunk not in free and len(free) <= total:
        free.add(trunk)
        page = data[(trunk - 1) * size:trunk * size]
        trunk, count = struct.unpack(">II", page[:8])
        listed = struct.unpack(f">{min(count, size // 4 - 2)}I", page[8:8 + 4 * min(count, size // 4 - 2)])
        free.update(n for n in listed if 1 <= n <= pages)
    return free


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """A SQLite varint at buf[i]: (value, index past it). Raises IndexError past the end."""
    v = 0
    for k in range(8):
        b = buf[i + k]
        v = (v << 7) | (b & 0x7F)
        if b < 0x80:
            return v, i + k + 1
    return (v << 8) | buf[i + 8], i + 9


def _cells(data: Data, page: bytes, head: int, size: int, usable: int) -> list[tuple[int | None, list[Any]]] | None:
    """(rowid or None, record values) of every cell of a page with rows; None when the page does not read as one."""
    kind = page[head]
    if kind not in ROW_PAGES:
        return None
    top = head + (12 if kind == INDEX_INTERIOR else 8)        # an interior page's header has its right child
    count = struct.unpack(">H", page[head + 3:head + 5])[0]
    if top + 2 * count > usable:
        return None
    out = []
    for c in range(count):
        at = struct.unpack(">H", page[top + 2 * c:top + 2 + 2 * c])[0]
        try:
            if not top + 2 * count <= at < usable:
                return None
            payload_n, i = _varint(page, at + (4 if kind == INDEX_INTERIOR else 0))     # past its left child
            rowid = None
            if kind == TABLE_LEAF:
                rowid, i = _varint(page, i)
            payload = _payload(data, page, i, payload_n, kind, size, usable)
            values = _record(payload) if payload is not None else None
        except IndexError:
            return None
        if values is None:
            return None
        out.append((rowid, values))
    return out


def _payload(data: Data, page: bytes, i: int, n: int, kind: int, size: int, usable: int) -> bytes | None:
    """The cell's payload: what is on the page, then its overflow pages' chain."""
    most = usable - 35 if kind == TABLE_LEAF else (usable - 12) * 64 // 255 - 23
    if n <= most:
        return page[i:i + n] if i + n <= usable else None
    least = (usable - 12) * 32 // 255 - 23
    local = least + (n - least) % (usable - 4)
    local = local if local <= most else least
    out = bytearray(page[i:i + local])
    nxt = struct.unpack(">I", page[i + local:i + local + 4])[0]
    pages = len(data) // size
    for _ in range(n // (usable - 4) + 2):
        if len(out) >= n or not 1 <= nxt <= pages:
            break
        over = data[(nxt - 1) * size:nxt * size]
        nxt = struct.unpack(">I", over[:4])[0]
        out += over[4:usable]
    return bytes(out[:n]) if len(out) >= n else None


_INTS = {1: 1, 2: 2, 3: 3, 4: 4, 5: 6, 6: 8}


def _record(buf: bytes) -> list[Any] | None:
    """A record's values by their serial types; None when it does not parse whole."""
    try:
        header, i = _varint(buf, 0)
        types = []
        while i < header:
            t, i = _varint(buf, i)
            types.append(t)
    except IndexError:
        return None
    if i != header or header > len(buf):
        return None
    values: list[Any] = []
    at = header
    for t in types:
        if t in (0, 8, 9):
            values.append(None if t == 0 else t - 8)
            continue
        n = _INTS.get(t) or (8 if t == 7 else (t - 12) // 2 if t >= 12 else -1)
        if n < 0 or at + n > len(buf):
            return None
        raw = buf[at:at + n]
        at += n
        if t == 7:
            values.append(struct.unpack(">d", raw)[0])
        elif t < 7:
            values.append(int.from_bytes(raw, "big", signed=True))
        elif t % 2:
            try:
                values.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                return None
        else:
            values.append(raw)
    return values if at == len(buf) else None


def _num(v: Any) -> bool:
    return isinstance(v, (int, float))


def _text(v: Any, *, null: bool = False) -> bool:
    return isinstance(v, str) or (null and v is None)


def _place(out: LeafRows, rowid: int | None, v: list[Any]) -> None:
    """Give a row to the recorder table whose shape it has (WITHOUT ROWID tables are index leaves, keyed first)."""
    if rowid is not None:           # a table leaf: events (id is the rowid), nodes
        if len(v) == 5 and v[0] is None and _text(v[1]) and _num(v[2]) and _text(v[3]) and _text(v[4], null=True):
            out.events.append((rowid, v[1], float(v[2]), v[3], v[4]))
        elif len(v) == 2 and v[0] is None and _text(v[1]):
            out.nodes[rowid] = v[1]
        return
    if len(v) == 2 + len(TICK_COLUMNS) and isinstance(v[0], int) and _num(v[1]) and isinstance(v[2], int) \
            and all(x is None or _num(x) for x in v[3:]):
        out.ticks.append((v[0], float(v[1]), *v[2:]))
    elif len(v) == 4 and isinstance(v[0], int) and _num(v[1]) and (v[2] is None or isinstance(v[2], int)) \
            and _text(v[3], null=True):
        out.rollup.append((v[0], float(v[1]), v[2], v[3]))
    elif len(v) == 3 and _text(v[0]) and _num(v[1]) and _text(v[2], null=True):
        out.endpoint_samples.append((v[0], float(v[1]), v[2]))
