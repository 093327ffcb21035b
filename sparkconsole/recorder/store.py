"""The flight recorder's file: one SQLite database per cluster, WAL, written in batches by one background thread.

    store = RecorderStore(path, RecorderSettings())     # opens (creates) the file, starts the writer thread
    store.put_tick("spark1", tick, container="vllm_node")
    store.put_event("spark1", "state", {"state": "DOWN", "error": "…"})
    store.close()                                         # flushes what is queued, stops the thread

Callers (the console's event loop) only append to a queue: no disk I/O on the UI thread. The writer commits
at most BATCH_S after a row arrived, so a crash or SIGKILL of the process loses at most that last batch; WAL
with synchronous=NORMAL keeps every committed batch across a process kill (an OS crash may lose the last few).

Faults (recorder/health.py says each in one line naming the file and the fix, through `on_status`): a file that
cannot be written (disk full, read-only, its directory gone or unwritable) keeps the rows in memory (MAX_PENDING,
then the oldest are dropped and counted) and is tried again every RETRY_S, so recording resumes by itself; a file
removed or replaced while open is noticed (its inode) and recording goes on in a new file at the path; a damaged
file (found on opening by `quick_check`, or by any write) is moved aside and what is readable is copied into a
fresh one (recorder/damage.py).

Bounded (settings from the cluster file's `recorder:`): ticks are kept at full rate for full_rate_hours, then
folded into per-10-s rows of min/mean/max per column (table `rollup`), dropped after keep_days; past max_mb
the oldest rows go first. Events (hello, state changes, containers, alerts, guard actions, post-mortems) are
kept keep_days. Endpoint samples are kept at full rate for full_rate_hours and then dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import sqlite3
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..config import RecorderSettings
from ..errors import UserError
from ..nodes.samples import Tick

log = logging.getLogger(__name__)

BATCH_S = 0.5            # the writer commits at least this often while rows arrive (≤ 1 s lost on a kill)
RETENTION_EVERY_S = 60.0
ROLLUP_S = 10.0
SCHEMA_VERSION = 1
RETRY_S = 2.0            # a file that could not be written is tried again this often
MAX_PENDING = 200_000   # rows held while it cannot be written (≈ 30 min of 32 nodes at 2 Hz, ≈ 60 MB)

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


# What the writer thread is handed: (kind, node or name — or the flush's Event —, time, payload)
Item = tuple[str, Any, float, Any]


def tick_row(tick: Tick, container: str | None) -> tuple[Any, ...]:
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
        # With no WAL beside it (no writer, closed cleanly), read it as immutable: a read-only connection on a WAL
        # file would otherwise leave -wal and -shm files behind that only a writer removes.
        p = Path(path).resolve()
        quiet = not any(Path(f"{p}{x}").exists() for x in ("-wal", "-shm"))
        db = sqlite3.connect(p.as_uri() + "?mode=ro" + ("&immutable=1" if quiet else ""), uri=True, timeout=10)
        # A file cut short (its header counts more pages than it has) is refused outright otherwise; with this
        # the pages that are there stay readable. On a read-only connection it permits no change.
        db.execute("PRAGMA writable_schema=ON")
    else:
        private(path)
        db = sqlite3.connect(path, timeout=10, isolation_level=None)
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")     # only takes on a new file: lets the size cap give space back
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        db.execute("INSERT OR IGNORE INTO meta VALUES('schema', ?)", (str(SCHEMA_VERSION),))
    db.row_factory = sqlite3.Row
    return db


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


class RecorderStore:
    """The writer. put_* never block and never raise on disk trouble (the console must keep running): the trouble
    is `.error` (one line, None again once writing works), said through on_status(text, severity) from the
    writer thread, and the rows wait in memory until the file can be written (see the module's doc)."""

    def __init__(self, path: str | Path, settings: RecorderSettings | None = None, *,
                 clock: Callable[[], float] = time.time,
                 on_status: Callable[[str, str], None] | None = None) -> None:
        from .health import Health
        self.path = Path(path)
        self.settings = settings or RecorderSettings()
        self.clock = clock
        self.health = Health(self.path, self._say)
        self.on_status = on_status
        self.said: list[str] = []
        self.rows_written = 0
        self.batches = 0
        self._q: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._pending: deque[Item] = deque()
        self._node_ids: dict[str, int] = {}
        self._inode: tuple[int, int] | None = None
        self._size = 0
        db = self._open(check=False)     # now, so that a bad path is said at start, not later from the thread
        if db is not None:
            db.close()
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._closed = False
        self._thread.start()

    @property
    def error(self) -> str | None:
        return self.health.trouble

    @property
    def rows_dropped(self) -> int:
        return self.health.dropped

    def _say(self, text: str, severity: str) -> None:
        self.said.append(text)
        if self.on_status is None:      # nobody to say it to: the log (a listener says it on screen or stdout)
            (log.warning if severity in ("warn", "bad") else log.info)("%s", text)
        else:
            try:
                self.on_status(text, severity)
            except Exception:   # noqa: BLE001 — a listener gone (the console quitting) must not stop the writer
                log.debug("recorder status listener failed", exc_info=True)

    # ---- producers (any thread; the console's event loop)
    def put_tick(self, node: str, tick: Tick, container: str | None = None) -> None:
        if not self._closed:
            self._q.put(("tick", node, tick.time, tick_row(tick, container)))

    def put_event(self, node: str, kind: str, data: Any, t: float | None = None) -> None:
        if not self._closed:
            self._q.put(("event", node, self.clock() if t is None else t, (kind, json.dumps(data, default=str))))

    def put_endpoint(self, name: str, data: dict[str, Any], t: float | None = None) -> None:
        if not self._closed:
            self._q.put(("endpoint", name, self.clock() if t is None else t, json.dumps(data, default=str)))

    def flush(self, timeout: float = 10.0) -> None:
        """Until everything queued so far is committed, or found unwritable (tests, `record` before it exits)."""
        done = threading.Event()
        self._q.put(("flush", done, 0, None))
        done.wait(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._q.put(("stop", None, 0, None))
        self._thread.join(15)

    # ---- opening, and noticing the file moved
    def _open(self, *, check: bool) -> sqlite3.Connection | None:
        """A writable connection, or None with the trouble said. `check`: quick_check an existing file first and
        set a damaged one aside (writer thread only: it reads the whole file)."""
        db = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fresh = not self.path.exists()
            db = connect(self.path)
            if check and not fresh:
                found = db.execute("PRAGMA quick_check(1)").fetchone()[0]
                if found != "ok":
                    raise sqlite3.DatabaseError(f"database disk image is malformed: {found}")
            self._remember()
            self._node_ids.clear()
            return db
        except (sqlite3.Error, OSError) as exc:
            if db is not None:
                _close(db)
            if self.health.is_damage(exc):
                # set aside by the writer thread (it opens with check=True), not on the caller's thread
                return self._set_aside(exc) if check else None
            self.health.failed(exc)
            return None

    def _remember(self) -> None:
        """The file as this writer left it: which one, and how long (only its own vacuum shortens it)."""
        try:
            st = os.stat(self.path)
            self._inode, self._size = (st.st_dev, st.st_ino), st.st_size
        except OSError:
            pass

    def _moved(self) -> str | None:
        """'removed' / 'replaced' when the path no longer names the file this writer has open, 'cut short' when
        someone truncated it."""
        try:
            st = os.stat(self.path)
        except OSError:
            return "removed"        # gone, or its directory is (or is no longer a directory)
        if self._inode != (st.st_dev, st.st_ino):
            return "replaced"
        return "cut short" if st.st_size < self._size else None

    def _set_aside(self, exc: BaseException) -> sqlite3.Connection | None:
        """The damaged file moved to FILE.damaged-<time> (with its WAL), its readable rows copied into a new FILE."""
        from .damage import salvage
        aside = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            for suffix in ("", "-wal", "-shm"):
                src = Path(str(self.path) + suffix)
                if src.exists():
                    os.replace(src, str(aside) + suffix)
        except OSError as move_exc:
            self.health.failed(move_exc)
            return None
        try:
            counts, gaps, _ = salvage(aside, self.path)
        except (UserError, sqlite3.Error, OSError) as salvage_exc:
            for suffix in ("", "-wal", "-shm"):
                Path(str(self.path) + suffix).unlink(missing_ok=True)
            # unreadable from the start (a UserError from the reader), or the copy could not be written
            self.health.set_aside(exc, aside, None, [], copy_failed=None if isinstance(salvage_exc, UserError)
                                  else salvage_exc)
            return self._open(check=False)
        self.health.set_aside(exc, aside, counts, [g.text() for g in gaps])
        return self._open(check=False)

    # ---- the writer thread
    def _next_batch(self) -> tuple[list[Item], bool]:
        """What arrived within BATCH_S of the first item (waiting at most RETRY_S while rows are held)."""
        try:
            item = self._q.get(timeout=RETRY_S if self._pending or self.health.trouble else None)
        except queue.Empty:
            return [], False
        batch = [item]
        deadline = time.monotonic() + BATCH_S
        while item[0] not in ("stop", "flush"):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                item = self._q.get(timeout=left)
            except queue.Empty:
                break
            batch.append(item)
        return batch, any(kind == "stop" for kind, *_ in batch)

    def _run(self) -> None:
        db = self._open(check=True)
        last_retention = 0.0
        last_try = 0.0
        try:
            while True:
                batch, stop = self._next_batch()
                for item in batch:
                    if item[0] in ("tick", "event", "endpoint"):
                        self._pending.append(item)
                while len(self._pending) > MAX_PENDING:
                    self.health.drop(self._pending.popleft())
                due = not self.health.trouble or stop or time.monotonic() - last_try >= RETRY_S
                if due and (self._pending or db is None):
                    last_try = time.monotonic()
                    db = self._attempt(db)
                for kind, a, _, _ in batch:
                    if kind == "flush":
                        a.set()
                if stop:
                    if self._pending:
                        self.health.unwritten(len(self._pending))
                    return
                if db is not None and time.monotonic() - last_retention > RETENTION_EVERY_S:
                    last_retention = time.monotonic()
                    exc = self.retain(db)
                    self._remember()            # the size cap may have given pages back
                    if exc is not None and self.health.is_damage(exc):
                        _close(db)
                        db = self._set_aside(exc)
        finally:
            if db is not None:
                _leave_clean(db, self.path)

    def _attempt(self, db: sqlite3.Connection | None, *, fresh: bool = False) -> sqlite3.Connection | None:
        """Write what is held; returns the connection to go on with (None: not writable now). `fresh`: db is the
        new file a damaged one was just copied into (not set aside again in the same attempt)."""
        moved = self._moved() if db is not None else None
        if moved == "cut short" and db is not None:     # (moved is None when db is)
            _close(db)      # its WAL goes back into the file first: the newest pages are not lost with it
            db = self._set_aside(sqlite3.DatabaseError(f"the file was cut short while recording, from {self._size} "
                                                       "bytes"))
            if db is None:
                return None
            moved = None
        if moved and db is not None:
            # Its WAL, still at the path, would be replayed into whatever file is there now: emptied first.
            with contextlib.suppress(sqlite3.Error):
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            _close(db)
            db = None
            self.health.moved(moved)
        if db is None:
            db = self._open(check=moved != "removed")
            if db is None:
                return None
        try:
            self._write(db, self._pending)
        except (sqlite3.Error, OSError) as exc:
            _rollback(db)
            if self.health.is_damage(exc) and not fresh:
                _close(db)
                db = self._set_aside(exc)
                return None if db is None else self._attempt(db, fresh=True)
            self.health.failed(exc)
            _close(db)      # opened again on the next try: a full or read-only file recovers on a fresh open too
            return None
        n = len(self._pending)
        self._pending.clear()
        self._remember()
        self.health.written(n)
        return db

    def _node_id(self, db: sqlite3.Connection, name: str) -> int:
        nid = self._node_ids.get(name)
        if nid is None:
            db.execute("INSERT OR IGNORE INTO nodes(name) VALUES(?)", (name,))
            nid = db.execute("SELECT id FROM nodes WHERE name=?", (name,)).fetchone()[0]
            self._node_ids[name] = nid
        return nid

    def _write(self, db: sqlite3.Connection, rows: Sequence[Item]) -> None:
        """One transaction for all `rows`; raises on any error (the caller keeps them)."""
        ph = ", ".join("?" * (len(TICK_COLUMNS) + 2))
        db.execute("BEGIN")
        for kind, who, t, payload in rows:
            if kind == "tick":
                db.execute(f"INSERT OR REPLACE INTO ticks VALUES({ph})", (self._node_id(db, who), t, *payload))
            elif kind == "event":
                db.execute("INSERT INTO events(node, t, kind, data) VALUES(?,?,?,?)", (who, t, *payload))
            else:
                db.execute("INSERT OR REPLACE INTO endpoint_samples VALUES(?,?,?)", (who, t, payload))
        try:
            db.execute("COMMIT")
        except sqlite3.Error:
            self._node_ids.clear()      # ids inserted in the failed transaction are gone
            raise
        self.rows_written += len(rows)
        self.batches += 1

    # ---- retention (writer thread; also callable directly on a connection in tests)
    def retain(self, db: sqlite3.Connection, now: float | None = None) -> sqlite3.Error | None:
        """Returns the error when it failed (the writer sets a damaged file aside)."""
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
            log.debug("recorder retention: %s", exc)     # the next write says the fault, once
            _rollback(db)
            return exc
        return None

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


def _close(db: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        db.close()


def _rollback(db: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        db.execute("ROLLBACK")


def _leave_clean(db: sqlite3.Connection, path: Path) -> None:
    """On a clean exit the file is left whole, without -wal and -shm beside it: checkpointed, then out of WAL mode
    (the next writer turns it back on), then closed. Busy (another connection still open) leaves it as it is. Its
    directory made read-only while recording (`chmod a-w`) would keep them (removing a file is a change to its
    directory): when this user owns the directory, its owner's write bit is lifted for that moment and its mode
    given back after."""
    with _owner_writable(path.parent):
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.execute("PRAGMA journal_mode=DELETE")
        except sqlite3.Error:
            pass
        _close(db)


@contextlib.contextmanager
def _owner_writable(directory: Path) -> Iterator[None]:
    """The directory writable by its owner (this user) inside the block, its own mode again after it."""
    try:
        st = os.stat(directory)
        lift = not os.access(directory, os.W_OK) and st.st_uid == os.geteuid()
        if lift:
            os.chmod(directory, stat.S_IMODE(st.st_mode) | stat.S_IWUSR)
    except OSError:         # gone, or on a read-only filesystem: nothing can be removed there anyway
        lift = False
    try:
        yield
    finally:
        if lift:
            with contextlib.suppress(OSError):
                os.chmod(directory, stat.S_IMODE(st.st_mode))
