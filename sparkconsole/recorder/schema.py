"""The flight recorder file's shape: its tables and their columns, and how a connection to it is opened (a writer's
creates the tables; a reader's is read-only). Below every module that reads or writes the file."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

SCHEMA_VERSION = 1

# One row per tick: the readings a post-mortem and a replay need, as plain columns (≈ 100 bytes a row;
# the agent's JSON line is ≈ 700). GPU columns are the node's first GPU (a GB10 has one).
TICK_COLUMNS = ("seq", "avail_kb", "total_kb", "cached_kb", "swap_free_kb", "swap_total_kb", "psi_some", "psi_full",
                "temp_c", "slowdown_c", "power_w", "clock_mhz", "util_pct", "reasons", "cg_cur_b", "cg_max_b")
ROLLED = TICK_COLUMNS[1:]    # what the 10-s rows summarise (seq is not a reading)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS nodes(id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS ticks(node INTEGER NOT NULL, t REAL NOT NULL,
    {", ".join(TICK_COLUMNS)}, PRIMARY KEY(node, t)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollup(node INTEGER NOT NULL, t REAL NOT NULL, n INTEGER, data TEXT,
    PRIMARY KEY(node, t)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events(id INTEGER PRIMARY KEY, node TEXT NOT NULL, t REAL NOT NULL, kind TEXT NOT NULL,
    data TEXT);
CREATE INDEX IF NOT EXISTS events_node_t ON events(node, t);
CREATE TABLE IF NOT EXISTS endpoint_samples(name TEXT NOT NULL, t REAL NOT NULL, data TEXT,
    PRIMARY KEY(name, t)) WITHOUT ROWID;
"""


def connect(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        # With no WAL beside it (no writer, closed cleanly), read it as immutable: a read-only connection on a WAL
        # file would otherwise leave -wal and -shm files behind that only a writer removes.
        p = Path(path).resolve()
        quiet = not any(Path(f"{p}{x}").exists() for x in ("-wal", "-shm"))
        db = sqlite3.connect(p.as_uri() + "?mode=ro" + ("&immutable=1" if quiet else ""), uri=True, timeout=10)
    else:
        private(path)
        db = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        _prepare(db, readonly=readonly)
    except BaseException:
        db.close()      # now: an open connection keeps the writer from leaving its file clean
        raise
    db.row_factory = sqlite3.Row
    return db


def _prepare(db: sqlite3.Connection, *, readonly: bool) -> None:
    if readonly:
        # A file cut short (its header counts more pages than it has) is refused outright otherwise; with this
        # the pages that are there stay readable. On a read-only connection it permits no change.
        db.execute("PRAGMA writable_schema=ON")
        return
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")     # only takes on a new file: lets the size cap give space back
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(_SCHEMA)
    db.execute("INSERT OR IGNORE INTO meta VALUES('schema', ?)", (str(SCHEMA_VERSION),))


def private(path: str | Path) -> None:
    """The file made 0600 before SQLite opens it (node names, commands: private like the audit log). SQLite gives
    its -wal and -shm the database file's mode when it makes them, so they are 0600 too however the first write
    goes (a disk with 12 KiB free once left a -shm at 0644: the file was made 0644 and changed after); one left
    by an older version is made 0600 here."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.chmod(f"{path}{suffix}", 0o600)
