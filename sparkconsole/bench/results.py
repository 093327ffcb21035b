"""The results file: one SQLite database (WAL) holding runs, their finished levels and every request.

Written as the sweep goes: each batch's requests in one transaction, each finished level in one transaction.
Keys are idempotent (run, pp, tg, depth, concurrency[, run index, request index]), so a resumed sweep replaces
what an interrupted level left and never counts a level twice. A level row exists only once the level finished.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from .metrics import Metric

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    finished REAL,
    source TEXT NOT NULL,            -- sparkconsole | llama-benchy | published
    label TEXT NOT NULL,             -- what reports compare by: topology, else endpoint
    topology TEXT, recipe TEXT, recipe_hash TEXT, endpoint TEXT, model TEXT, vllm_version TEXT,
    simulated INTEGER NOT NULL DEFAULT 0, speed REAL NOT NULL DEFAULT 1,
    latency_mode TEXT, latency_ms REAL, tool_version TEXT,
    spec_hash TEXT, spec_json TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS levels (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    pp INTEGER NOT NULL, tg INTEGER NOT NULL, depth INTEGER NOT NULL, concurrency INTEGER NOT NULL,
    runs INTEGER NOT NULL, started REAL, finished REAL NOT NULL,
    max_temp_c REAL, throttle_json TEXT NOT NULL DEFAULT '[]',
    metrics_json TEXT NOT NULL,
    PRIMARY KEY (run_id, pp, tg, depth, concurrency)
);
CREATE TABLE IF NOT EXISTS requests (
    run_id TEXT NOT NULL, pp INTEGER NOT NULL, tg INTEGER NOT NULL, depth INTEGER NOT NULL,
    concurrency INTEGER NOT NULL, run_index INTEGER NOT NULL, req_index INTEGER NOT NULL,
    ok INTEGER NOT NULL, error TEXT, status INTEGER,
    prompt_tokens INTEGER, completion_tokens INTEGER, tokens_estimated INTEGER NOT NULL DEFAULT 0,
    ttfr_ms REAL, ttft_ms REAL, est_ppt_ms REAL, prefill_tps REAL, decode_tps REAL, tpot_ms REAL,
    itl_p50_ms REAL, itl_p99_ms REAL, itl_max_ms REAL,
    PRIMARY KEY (run_id, pp, tg, depth, concurrency, run_index, req_index)
);
"""
# Columns added after files were first written: (table, column, type), added to older files on open.
_ADDED_COLUMNS = (("requests", "itl_p50_ms", "REAL"), ("requests", "itl_p99_ms", "REAL"),
                  ("requests", "itl_max_ms", "REAL"))
_REQUEST_FIELDS = ("ok", "error", "status", "prompt_tokens", "completion_tokens", "tokens_estimated", "ttfr_ms",
                   "ttft_ms", "est_ppt_ms", "prefill_tps", "decode_tps", "tpot_ms", "itl_p50_ms", "itl_p99_ms",
                   "itl_max_ms")


@dataclass(frozen=True)
class LevelKey:
    pp: int
    tg: int
    depth: int
    concurrency: int

    def __str__(self) -> str:
        d = f" d{self.depth}" if self.depth else ""
        return f"pp{self.pp} tg{self.tg}{d} c{self.concurrency}"


@dataclass(frozen=True)
class ThermalNote:
    """The nodes' hottest GPU and any throttle reasons seen while a level ran (from an injected probe)."""

    max_temp_c: float | None = None
    throttle_reasons: tuple[str, ...] = ()

    def merge(self, other: ThermalNote | None) -> ThermalNote:
        if other is None:
            return self
        temps = [t for t in (self.max_temp_c, other.max_temp_c) if t is not None]
        reasons = tuple(dict.fromkeys((*self.throttle_reasons, *other.throttle_reasons)))
        return ThermalNote(max(temps) if temps else None, reasons)


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    created: float
    finished: float | None
    source: str
    label: str
    topology: str | None = None
    recipe: str | None = None
    recipe_hash: str | None = None
    endpoint: str | None = None
    model: str | None = None
    vllm_version: str | None = None
    simulated: bool = False
    speed: float = 1.0
    latency_mode: str | None = None
    latency_ms: float | None = None
    tool_version: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LevelResult:
    """One finished level: what the TUI draws (via `on_level`) and what reports and the advisor read."""

    run_id: str
    label: str
    key: LevelKey
    runs: int
    metrics: dict[str, Any]
    thermal: ThermalNote | None = None
    started: float | None = None
    finished: float = 0.0

    def metric(self, name: str) -> Metric | None:
        return Metric.from_json(self.metrics.get(name))

    @property
    def failure(self) -> str | None:
        """Why the level failed (how many requests, the commonest reason); None when every request succeeded."""
        return self.metrics.get("failure")

    def mean(self, name: str) -> float | None:
        m = self.metric(name)
        return m.mean if m else None

    @property
    def decode_tps(self) -> float | None:       # total across concurrent requests
        return self.mean("tg_throughput")

    @property
    def prefill_tps(self) -> float | None:
        return self.mean("pp_throughput")

    @property
    def ttft_ms(self) -> float | None:
        return self.mean("e2e_ttft")


def spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ResultsStore:
    """A results file. Opening creates it (and its directory) if missing; a file that is not one is refused."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        db = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
            self._prepare()
        except (sqlite3.DatabaseError, OSError, UserError) as exc:
            if db is not None:
                db.close()      # now: the refusal's traceback would keep it open until the garbage collector runs
            if isinstance(exc, UserError):
                raise
            if isinstance(exc, OSError):
                raise UserError(f"cannot open ({exc.strerror})", file=str(self.path),
                                fix="choose a writable path") from None
            raise UserError(f"not a results file ({exc})", file=str(self.path),
                            fix="point --results at a sparkconsole results file or a new path") from None

    def _prepare(self) -> None:
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)
        for table, col, typ in _ADDED_COLUMNS:
            if col not in {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {col} {typ}")
        row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) > SCHEMA_VERSION:
            raise UserError(f"results file has schema {row[0]}, this sparkconsole reads {SCHEMA_VERSION}",
                            file=str(self.path), fix="upgrade sparkconsole")

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------------------------
    def _tx(self) -> _Tx:
        return _Tx(self.db)

    def begin_run(self, *, source: str, label: str, spec: dict[str, Any], resume: bool = False, **prov: Any) -> tuple[str, bool]:
        """Start a run, or with `resume` reopen the newest run of the same spec. Returns (run_id, resumed)."""
        h = spec_hash(spec)
        if resume:
            # A run on a simulated clock never continues as a real one, nor at another speed.
            where, params = "spec_hash=? AND source=?", [h, source]
            for col in ("simulated", "speed"):
                if col in prov:
                    where += f" AND {col}=?"
                    params += _sql([prov[col]])
            row = self.db.execute(f"SELECT run_id FROM runs WHERE {where} ORDER BY created DESC LIMIT 1",
                                  params).fetchone()
            if row:
                # Refresh provenance that may have changed (a relaunched endpoint's URL, the vLLM version).
                sets = {k: v for k, v in prov.items() if v is not None and k not in ("created", "run_id")}
                if sets:
                    assigns = ", ".join(f"{k}=?" for k in sets)
                    self.db.execute(f"UPDATE runs SET {assigns} WHERE run_id=?", (*_sql(sets.values()), row[0]))
                return row[0], True
        run_id = prov.pop("run_id", None) or uuid.uuid4().hex[:12]
        cols = {"run_id": run_id, "created": prov.pop("created", None) or time.time(), "source": source, "label": label,
                "spec_hash": h, "spec_json": json.dumps(spec, sort_keys=True, default=str), **prov}
        with self._tx():
            self.db.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                            tuple(_sql(cols.values())))
        return run_id, False

    def finish_run(self, run_id: str) -> None:
        self.db.execute("UPDATE runs SET finished=? WHERE run_id=?", (time.time(), run_id))

    def clear_level(self, run_id: str, key: LevelKey) -> None:
        """Drop what an interrupted attempt at this level left (its requests), before measuring it again."""
        with self._tx():
            self.db.execute("DELETE FROM requests WHERE run_id=? AND pp=? AND tg=? AND depth=? AND concurrency=?",
                            (run_id, key.pp, key.tg, key.depth, key.concurrency))

    def record_requests(self, run_id: str, key: LevelKey, run_index: int, rows: Sequence[dict[str, Any]]) -> None:
        cols = ("run_id", "pp", "tg", "depth", "concurrency", "run_index", "req_index") + _REQUEST_FIELDS
        with self._tx():
            self.db.executemany(
                f"INSERT OR REPLACE INTO requests ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                [(run_id, key.pp, key.tg, key.depth, key.concurrency, run_index, i, *_request_values(r))
                 for i, r in enumerate(rows)])

    def record_level(self, level: LevelResult) -> None:
        k, th = level.key, level.thermal or ThermalNote()
        with self._tx():
            self.db.execute(
                "INSERT OR REPLACE INTO levels (run_id, pp, tg, depth, concurrency, runs, started, finished,"
                " max_temp_c, throttle_json, metrics_json) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (level.run_id, k.pp, k.tg, k.depth, k.concurrency, level.runs, level.started, level.finished,
                 th.max_temp_c, json.dumps(list(th.throttle_reasons)), json.dumps(level.metrics)))

    def delete_run(self, run_id: str) -> None:
        with self._tx():
            for table in ("requests", "levels", "runs"):
                self.db.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))

    # -- reading ---------------------------------------------------------------------------------------------
    def runs(self) -> list[RunInfo]:
        return [_run_info(r) for r in self.db.execute("SELECT * FROM runs ORDER BY created, run_id")]

    def run(self, run_id: str) -> RunInfo:
        row = self.db.execute("SELECT * FROM runs WHERE run_id=? OR run_id LIKE ? ORDER BY created DESC",
                              (run_id, run_id + "%")).fetchone()
        if row is None:
            raise UserError(f"no run {run_id!r}", file=str(self.path), fix="list runs with `sparkconsole bench report`")
        return _run_info(row)

    def levels(self, run_id: str | None = None) -> list[LevelResult]:
        q = ("SELECT l.*, r.label FROM levels l JOIN runs r USING (run_id)"
             + (" WHERE run_id=?" if run_id else "") + " ORDER BY r.created, l.run_id, depth, pp, tg, concurrency")
        out = []
        for row in self.db.execute(q, (run_id,) if run_id else ()):
            out.append(LevelResult(
                run_id=row["run_id"], label=row["label"],
                key=LevelKey(row["pp"], row["tg"], row["depth"], row["concurrency"]), runs=row["runs"],
                metrics=json.loads(row["metrics_json"]),
                thermal=ThermalNote(row["max_temp_c"], tuple(json.loads(row["throttle_json"] or "[]"))),
                started=row["started"], finished=row["finished"]))
        return out

    def finished_keys(self, run_id: str) -> set[LevelKey]:
        return {LevelKey(*r) for r in self.db.execute(
            "SELECT pp, tg, depth, concurrency FROM levels WHERE run_id=?", (run_id,))}

    def requests(self, run_id: str, key: LevelKey | None = None) -> list[dict[str, Any]]:
        args: list[object]
        q, args = "SELECT * FROM requests WHERE run_id=?", [run_id]
        if key:
            q += " AND pp=? AND tg=? AND depth=? AND concurrency=?"
            args += [key.pp, key.tg, key.depth, key.concurrency]
        return [dict(r) for r in self.db.execute(q + " ORDER BY pp, tg, depth, concurrency, run_index, req_index", args)]


class _Tx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


def _request_values(row: dict[str, Any]) -> tuple[Any, ...]:
    flags = {"ok": int(row.get("ok", True)), "tokens_estimated": int(bool(row.get("tokens_estimated")))}
    return tuple(flags[f] if f in flags else row.get(f) for f in _REQUEST_FIELDS)


def _sql(values: Iterable[Any]) -> list[Any]:
    return [json.dumps(v) if isinstance(v, (dict, list, tuple)) else int(v) if isinstance(v, bool) else v
            for v in values]


def _run_info(row: sqlite3.Row) -> RunInfo:
    d = dict(row)
    spec = json.loads(d.pop("spec_json") or "{}")
    d.pop("spec_hash", None)
    d["simulated"] = bool(d["simulated"])
    return RunInfo(**d, spec=spec)
