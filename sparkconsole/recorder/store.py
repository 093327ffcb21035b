"""The flight recorder's file: one SQLite database per cluster, WAL, written in batches by one background thread.

    store = RecorderStore(path, RecorderSettings())     # opens (creates) the file, starts the writer thread
    store.put_tick("spark1", tick, container="vllm_node")
    store.put_event("spark1", "state", {"state": "DOWN", "error": "…"})
    store.close()                                         # flushes what is queued, stops the thread

Callers (the console's event loop) only append to a queue: no disk I/O on the UI thread. The writer commits
at most BATCH_S after a row arrived, so a crash or SIGKILL of the process loses at most that last batch; WAL
with synchronous=NORMAL keeps every committed batch across a process kill (an OS crash may lose the last few).

Bounded (settings from the cluster file's `recorder:`): ticks are kept at full rate for full_rate_hours, then
folded into per-10-s rows of min/mean/max per column (table `rollup`), dropped after keep_days; past max_mb
the oldest rows go first. Events (hello, state changes, containers, alerts, guard actions, post-mortems) are
kept keep_days. Endpoint samples are kept at full rate for full_rate_hours and then dropped.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from ..config import RecorderSettings
from ..nodes.samples import Tick

log = logging.getLogger(__name__)

BATCH_S = 0.5            # the writer commits at least this often while rows arrive (≤ 1 s lost on a kill)
RETENTION_EVERY_S = 60.0
ROLLUP_S = 10.0
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


def tick_row(tick: Tick, container: str | None) -> tuple:
    """The tick's readings in TICK_COLUMNS order (None where the node did not give one)."""
    m, p = tick.mem, tick.pressure
    g = tick.gpus[0] if tick.gpus else None
    cg = next((c for c in tick.cgroups if c.name == container), None) if container else None
    return (tick.seq,
            m.available_kb if m else None, m.total_kb if m else None, m.cached_kb if m else None,
            m.swap_free_kb if m else None, m.swap_total_kb if m else None,
            p.some_avg10 if p else None, p.full_avg10 if p else None,
            g.temp_c if g else None, g.slowdown_c if g else None, g.power_w if g else None,
            g.sm_clock_mhz if g else None, g.util_pct if g else None, g.reasons_mask if g else None,
            cg.current_b if cg else None, cg.max_b if cg else None)


def connect(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        db = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True, timeout=10)
    else:
        db = sqlite3.connect(path, timeout=10, isolation_level=None)
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")     # only takes on a new file: lets the size cap give space back
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        db.execute("INSERT OR IGNORE INTO meta VALUES('schema', ?)", (str(SCHEMA_VERSION),))
    db.row_factory = sqlite3.Row
    return db


class RecorderStore:
    """The writer. put_* never block and never raise on disk trouble (the console must keep running); the first
    write error is kept in .error and logged, and later rows are dropped."""

    def __init__(self, path: str | Path, settings: RecorderSettings | None = None, *, clock=time.time) -> None:
        self.path = Path(path)
        self.settings = settings or RecorderSettings()
        self.clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh = not self.path.exists()
        db = connect(self.path)          # created here so a bad path is an error now, not in the thread
        db.close()
        if fresh:
            os.chmod(self.path, 0o600)   # node names, commands: private like the audit log
        self.error: str | None = None
        self.rows_written = 0
        self.batches = 0
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._node_ids: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._closed = False
        self._thread.start()

    # ---- producers (any thread; the console's event loop)
    def put_tick(self, node: str, tick: Tick, container: str | None = None) -> None:
        if not self._closed:
            self._q.put(("tick", node, tick.time, tick_row(tick, container)))

    def put_event(self, node: str, kind: str, data: Any, t: float | None = None) -> None:
        if not self._closed:
            self._q.put(("event", node, self.clock() if t is None else t, (kind, json.dumps(data, default=str))))

    def put_endpoint(self, name: str, data: dict, t: float | None = None) -> None:
        if not self._closed:
            self._q.put(("endpoint", name, self.clock() if t is None else t, json.dumps(data, default=str)))

    def flush(self, timeout: float = 10.0) -> None:
        """Until everything queued so far is committed (tests, and `record` before it exits)."""
        done = threading.Event()
        self._q.put(("flush", done, 0, None))
        done.wait(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._q.put(("stop", None, 0, None))
        self._thread.join(15)

    # ---- the writer thread
    def _run(self) -> None:
        db = connect(self.path)
        last_retention = 0.0
        try:
            while True:
                item = self._q.get()
                batch = [item]
                deadline = time.monotonic() + BATCH_S
                stop = False
                while item[0] not in ("stop", "flush"):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        item = self._q.get(timeout=left)
                    except queue.Empty:
                        break
                    batch.append(item)
                self._write(db, batch)
                for kind, a, _, _ in batch:
                    if kind == "flush":
                        a.set()
                    elif kind == "stop":
                        stop = True
                if stop:
                    return
                if time.monotonic() - last_retention > RETENTION_EVERY_S:
                    last_retention = time.monotonic()
                    self.retain(db)
        finally:
            db.close()

    def _node_id(self, db: sqlite3.Connection, name: str) -> int:
        nid = self._node_ids.get(name)
        if nid is None:
            db.execute("INSERT OR IGNORE INTO nodes(name) VALUES(?)", (name,))
            nid = db.execute("SELECT id FROM nodes WHERE name=?", (name,)).fetchone()[0]
            self._node_ids[name] = nid
        return nid

    def _write(self, db: sqlite3.Connection, batch: list) -> None:
        if self.error:
            return
        ph = ", ".join("?" * (len(TICK_COLUMNS) + 2))
        try:
            db.execute("BEGIN")
            for kind, who, t, payload in batch:
                if kind == "tick":
                    db.execute(f"INSERT OR REPLACE INTO ticks VALUES({ph})", (self._node_id(db, who), t, *payload))
                elif kind == "event":
                    db.execute("INSERT INTO events(node, t, kind, data) VALUES(?,?,?,?)", (who, t, *payload))
                elif kind == "endpoint":
                    db.execute("INSERT OR REPLACE INTO endpoint_samples VALUES(?,?,?)", (who, t, payload))
                else:
                    continue
                self.rows_written += 1
            db.execute("COMMIT")
            self.batches += 1
        except sqlite3.Error as exc:
            self.error = f"recorder: {self.path}: {exc}"
            log.error("%s", self.error)
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    # ---- retention (writer thread; also callable directly on a connection in tests)
    def retain(self, db: sqlite3.Connection, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        s = self.settings
        full_cut = now - s.full_rate_hours * 3600
        keep_cut = now - s.keep_days * 86400
        try:
            db.execute("BEGIN")
            self._fold(db, full_cut)
            db.execute("DELETE FROM endpoint_samples WHERE t < ?", (full_cut,))
            db.execute("DELETE FROM rollup WHERE t < ?", (keep_cut,))
            db.execute("DELETE FROM events WHERE t < ?", (keep_cut,))
            db.execute("COMMIT")
            self._cap(db, int(s.max_mb * 1024 * 1024))
        except sqlite3.Error as exc:
            log.warning("recorder retention: %s", exc)
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    @staticmethod
    def _fold(db: sqlite3.Connection, cut: float) -> None:
        """Ticks older than `cut` become one rollup row per node and 10-s bucket: {column: [min, mean, max]}."""
        cut = (cut // ROLLUP_S) * ROLLUP_S          # whole buckets only, so a bucket is never folded twice
        aggs = ", ".join(f"min({c}), avg({c}), max({c})" for c in ROLLED)
        rows = db.execute(f"SELECT node, CAST(t / {ROLLUP_S} AS INTEGER) * {ROLLUP_S} AS b, count(*), {aggs} "
                          "FROM ticks WHERE t < ? GROUP BY node, b", (cut,)).fetchall()
        for r in rows:
            vals = list(r)[3:]
            data = {c: vals[3 * i:3 * i + 3] for i, c in enumerate(ROLLED) if vals[3 * i] is not None}
            db.execute("INSERT OR REPLACE INTO rollup VALUES(?,?,?,?)", (r[0], r[1], r[2], json.dumps(data)))
        db.execute("DELETE FROM ticks WHERE t < ?", (cut,))

    @staticmethod
    def _cap(db: sqlite3.Connection, cap_bytes: int) -> None:
        """Past the size cap: drop the oldest tenth of what is there (rollups, then ticks), give pages back."""
        for _ in range(20):
            pages = db.execute("PRAGMA page_count").fetchone()[0] - db.execute("PRAGMA freelist_count").fetchone()[0]
            if pages * db.execute("PRAGMA page_size").fetchone()[0] <= cap_bytes:
                break
            for table in ("rollup", "endpoint_samples", "events", "ticks"):
                lo, hi = db.execute(f"SELECT min(t), max(t) FROM {table}").fetchone()
                if lo is not None and hi > lo:
                    db.execute(f"DELETE FROM {table} WHERE t < ?", (lo + (hi - lo) / 10,))
                    break
            else:
                break
        db.executescript("PRAGMA incremental_vacuum")    # executescript steps it to the end (execute frees one page)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
