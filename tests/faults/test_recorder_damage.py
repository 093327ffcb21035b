"""A damaged recorder file, damaged for real: a page of each table (and the events index) overwritten with random
bytes, the file truncated, garbage over its header. Then everything that reads it — `postmortem` (the real CLI),
the replay behind `console --at` and the `[`/`]` scrub, `record repair`, and the writer itself opening it —
answers with what is readable and says what is not, in one line or a marked block; never a traceback, never a
partial answer presented as whole.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkconsole.errors import UserError
from sparkconsole.recorder.postmortem import build
from sparkconsole.recorder.reader import RecorderReader
from sparkconsole.recorder.replay import replay_monitor_factory
from sparkconsole.recorder.store import RecorderStore
from tests.helpers import error_lines
from tests.test_recorder import integrity, tick

ROOT = Path(__file__).resolve().parents[2]
TICKS = 1200                 # 10 min at 2 Hz per node; spark2 stops 50 s before its DOWN
TABLES = ("ticks", "rollup", "events", "events_node_t", "endpoint_samples", "nodes", "meta")


def make_recording(path: Path, t0: float) -> dict[str, int]:
    """Two nodes, an endpoint, alerts, spark2 DOWN at t0 + 560; rollup rows for spark1. Returns rows per table."""
    s = RecorderStore(path)
    s.put_event("*", "session", {"nodes": ["spark1", "spark2"], "endpoints": {"ep": "spark2"}}, t0 - 2)
    for n in ("spark1", "spark2"):
        s.put_event(n, "hello", {"hostname": n, "boot_id": "boot-" + n}, t0 - 1)
        s.put_event(n, "state", {"state": "LIVE"}, t0)
    counts = {"ticks": 0, "events": 5, "endpoint_samples": 0, "rollup": 300}
    for i in range(TICKS):
        t = t0 + i * 0.5
        for n in ("spark1", "spark2"):
            if n == "spark2" and i > 1100:
                continue
            s.put_tick(n, tick(t, i, avail_kb=100_000_000 - i * 80_000 if n == "spark2" else 90_000_000))
            counts["ticks"] += 1
        s.put_endpoint("ep", {"healthy": True, "running": 3, "kv_usage": 0.5, "note": "x" * 150}, t)
        counts["endpoint_samples"] += 1
        if i % 4 == 0:
            s.put_event("spark2", "alert", {"key": f"k{i}", "severity": "warn", "message": "m" * 100, "active": True}, t)
            counts["events"] += 1
    s.put_event("spark2", "state", {"state": "DOWN", "error": "agent ended"}, t0 + 560)
    counts["events"] += 1
    s.close()
    db = sqlite3.connect(path)
    with db:
        for i in range(300):
            db.execute("INSERT INTO rollup VALUES(?,?,?,?)", (1, t0 - 7200 + i * 10, 20, '{"temp_c": [40, 45, 50]}'))
    db.close()
    assert not Path(f"{path}-wal").exists()
    return counts


def damage_page(path: Path, table: str, where: float = 0.95, seed: int = 7) -> int:
    """Overwrites one page of `table` (a leaf `where` through its key order; its only page for a small table) with
    random bytes; returns the page number."""
    db = sqlite3.connect(path)
    size = db.execute("PRAGMA page_size").fetchone()[0]
    pages = [r[0] for r in db.execute("SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY path",
                                      (table,))] or \
        [r[0] for r in db.execute("SELECT pageno FROM dbstat WHERE name = ? ORDER BY path", (table,))]
    db.close()
    page = pages[min(len(pages) - 1, int(len(pages) * where))]
    with open(path, "r+b") as fh:
        fh.seek((page - 1) * size)
        fh.write(random.Random(seed).randbytes(size))
    return page


def cli(args: list[str], env: dict, ledger) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "sparkconsole", *args], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=120)
    ledger.output(r.stdout + r.stderr, " ".join(args))
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    return r


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")}


@pytest.fixture
def recording(tmp_path):
    t0 = time.time() - 3600
    path = tmp_path / "rec.sqlite"
    counts = make_recording(path, t0)
    return path, t0, counts


def readable(path: Path) -> dict[str, int]:
    """Rows per table of an undamaged file."""
    db = sqlite3.connect(path)
    try:
        return {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("ticks", "rollup", "events", "endpoint_samples")}
    finally:
        db.close()


@pytest.mark.fault("a damaged page in a recorder table, read by postmortem, replay and repair")
@pytest.mark.parametrize("table", TABLES)
def test_a_damaged_page_is_said_and_the_rest_is_read(recording, table, env, tmp_path, ledger):
    path, t0, counts = recording
    damage_page(path, table)
    ledger.bad_inputs(1)
    # postmortem, the real command: a verdict with a marked partial block, or one line saying the file is damaged
    r = cli(["postmortem", "spark2", "--file", str(path), "--format", "json"], env, ledger)
    if r.returncode == 0:
        pm = json.loads(r.stdout)
        missing = pm["ticks"] < 221           # the 120 s before the DOWN hold 221 ticks when whole
        if missing:
            assert pm["unreadable"] and "unreadable" in r.stderr, (table, pm["ticks"], r.stderr)
        md = cli(["postmortem", "spark2", "--file", str(path)], env, ledger).stdout
        assert ("**Partial:" in md) == bool(pm["unreadable"]), md[:600]
    else:
        assert r.returncode == 2 and len(error_lines(r.stderr)) == 1 and "damaged" in r.stderr, r.stderr
    # the replay behind `console --at` and the scrub: plays what is readable, and its notes say what is not
    from sparkconsole.config import ClusterConfig, NodeConfig
    cluster = ClusterConfig(nodes=(NodeConfig("spark1", "127.0.0.1"), NodeConfig("spark2", "127.0.0.1")),
                            endpoints=(), source="lab.yaml")
    mon = replay_monitor_factory(path, t0 + 400)(cluster)
    reader = RecorderReader(path)
    try:
        got = len(reader.ticks("spark2", t0 + 400, t0 + 3600)) if "spark2" in reader.nodes() else 0
        gaps = reader.gap_texts(t0 + 400, t0 + 3600)
    finally:
        reader.close()
    if got < 301 or gaps:     # spark2's ticks from t0+400 on: 301 when whole
        assert mon.notes and all("recorder file damaged" in n and "\n" not in n for n in mon.notes), mon.notes
    # repair: counts printed, the new file sound, its rows the readable ones, the gaps kept in it
    out = tmp_path / "repaired.sqlite"
    r = cli(["record", "repair", str(path), "--out", str(out)], env, ledger)
    assert r.returncode == 0 and f"into {out}" in r.stdout, r.stdout + r.stderr
    assert integrity(out) == "ok"
    copied = readable(out)
    printed = {k: int(n) for n, k in (p.split(" ", 1) for p in r.stdout.splitlines()[0].split(": ", 1)[1].split(", "))}
    assert printed == {"ticks": copied["ticks"], "rollup": copied["rollup"], "events": copied["events"],
                       "endpoint samples": copied["endpoint_samples"]}
    lost = sum(counts.values()) - sum(copied.values())
    if lost:
        assert "unreadable:" in r.stdout, r.stdout          # rows missing from the copy are never silent
        again = RecorderReader(out)
        try:
            assert again.gap_texts(), "the repaired file forgot its gaps"
        finally:
            again.close()
    # the rows on the damaged page: gone with it, and said (the repair's unreadable lines, the post-mortem's block)
    ledger.lost(lost, f"rows on a damaged {table} page (said)")
    assert copied["ticks"] + copied["rollup"] + copied["events"] + copied["endpoint_samples"] > 0


@pytest.mark.fault("a damaged recorder file opened by the writer: set aside, readable rows carried over")
@pytest.mark.parametrize("how", ["page", "truncated"])
def test_the_writer_sets_a_damaged_file_aside_and_records_on(recording, how, tmp_path, ledger):
    path, t0, counts = recording
    if how == "page":
        damage_page(path, "ticks", where=0.5)
    else:
        with open(path, "r+b") as fh:
            fh.truncate(path.stat().st_size // 2)
    said: list[str] = []
    store = RecorderStore(path, on_status=lambda text, sev: said.append(text))
    store.put_tick("spark1", tick(time.time(), 99_999))
    store.flush()
    store.close()
    aside = [p for p in tmp_path.glob("rec.sqlite.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and aside[0].stat().st_size > 0, list(tmp_path.iterdir())
    assert len(said) == 1 and str(path) in said[0] and str(aside[0]) in said[0] and "readable rows" in said[0], said
    assert integrity(path) == "ok"
    r = RecorderReader(path)
    try:
        rows = r.ticks("spark1", 0, time.time() + 10)
        assert rows[-1]["seq"] == 99_999 and len(rows) > 1       # old readable rows + the new one
        assert r.gap_texts(), "the new file does not say what the damaged one lost"
    finally:
        r.close()


@pytest.mark.fault("garbage over the recorder file's header")
def test_garbage_header(recording, env, tmp_path, ledger):
    """SQLite cannot open it at all; its pages are whole. `postmortem` says so in one line naming `record repair`,
    which reads every row from the pages (as `sqlite3 .recover` does); the writer sets it aside and carries them
    over. (Before, repair and the writer found nothing readable, and repair's line named `record repair` itself.)"""
    path, t0, counts = recording
    with open(path, "r+b") as fh:
        fh.write(random.Random(3).randbytes(100))
    r = cli(["postmortem", "spark2", "--file", str(path)], env, ledger)
    assert r.returncode == 2 and len(error_lines(r.stderr)) == 1 and str(path) in r.stderr \
        and "record repair" in r.stderr, r.stderr
    with pytest.raises(UserError):
        replay_monitor_factory(path, t0)
    out = tmp_path / "new.sqlite"
    r = cli(["record", "repair", str(path), "--out", str(out)], env, ledger)
    assert r.returncode == 0 and "read from" in r.stdout and "header or schema is unreadable" in r.stdout, r.stdout
    assert readable(out) == {k: counts[k] for k in ("ticks", "rollup", "events", "endpoint_samples")}
    assert integrity(out) == "ok" and not any(Path(f"{out}{x}").exists() for x in ("-wal", "-shm"))
    # the writer: set aside, every row carried over into the new file, said in one line; recording goes on
    said, seqs = writer_meets(path)
    assert len(said) == 1 and "readable rows" in said[0] and ".damaged-" in said[0], said
    assert len(seqs) == TICKS + 1 and seqs[-1] == 5


def writer_meets(path: Path) -> tuple[list[str], list[int]]:
    """The writer opening a damaged file and recording one tick: (what it said, spark1's tick seqs after)."""
    said: list[str] = []
    store = RecorderStore(path, on_status=lambda text, sev: said.append(text))
    store.put_tick("spark1", tick(time.time(), 5))
    store.flush()
    store.close()
    return said, [x["seq"] for x in RecorderReader(path).ticks("spark1", 0, time.time() + 5)]


@pytest.mark.fault("a recorder file with nothing readable: repair says so without naming itself")
def test_nothing_readable_is_said_without_suggesting_the_command_just_run(tmp_path, env, ledger):
    path = tmp_path / "rec.sqlite"
    path.write_bytes(random.Random(5).randbytes(64 * 1024))
    ledger.bad_inputs(1)
    out = tmp_path / "new.sqlite"
    r = cli(["record", "repair", str(path), "--out", str(out)], env, ledger)
    lines = error_lines(r.stderr)
    assert r.returncode == 2 and len(lines) == 1 and str(path) in lines[0] and "nothing in it is readable" in lines[0]
    assert "record repair" not in r.stderr and "fix:" in lines[0], r.stderr
    assert not any(Path(f"{out}{x}").exists() for x in ("", "-wal", "-shm"))
    # the writer meeting it: kept aside, a new file started, said in one line
    said, seqs = writer_meets(path)
    assert len(said) == 1 and "nothing in it is readable" in said[0] and ".damaged-" in said[0], said
    assert seqs == [5]


@pytest.mark.fault("a damaged interior b-tree page of the recorder's ticks, every leaf intact")
def test_repair_reads_the_leaves_below_a_damaged_interior_page(recording, env, tmp_path, ledger):
    """Issue 40: the ticks' interior page damaged, every leaf whole: `record repair` copied no tick at all (SQL
    cannot reach a leaf but through the page above it). Now every tick on a leaf is copied; what is lost is what
    sat on the damaged page itself (a WITHOUT ROWID table is an index b-tree: its interior cells are rows), and
    the repaired file is one plain file, no -wal or -shm beside it."""
    path, t0, counts = recording
    db = sqlite3.connect(path)
    page, on_it = db.execute("SELECT pageno, ncell FROM dbstat WHERE name = 'ticks' AND pagetype = 'internal' "
                             "ORDER BY path LIMIT 1").fetchone()
    size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with open(path, "r+b") as fh:
        fh.seek((page - 1) * size)
        fh.write(random.Random(11).randbytes(size))
    ledger.bad_inputs(1)
    out = tmp_path / "repaired.sqlite"
    r = cli(["record", "repair", str(path), "--out", str(out)], env, ledger)
    assert r.returncode == 0, r.stdout + r.stderr
    copied = readable(out)
    assert copied["ticks"] == counts["ticks"] - on_it, (copied, on_it)
    assert {k: copied[k] for k in ("rollup", "events", "endpoint_samples")} == \
        {k: counts[k] for k in ("rollup", "events", "endpoint_samples")}
    assert f"{copied['ticks']} of them read from" in r.stdout and "rows in it read from its leaf pages" in r.stdout
    assert integrity(out) == "ok" and not any(Path(f"{out}{x}").exists() for x in ("-wal", "-shm"))
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    ledger.lost(on_it, "ticks on a damaged interior page of the ticks b-tree (said)")


def test_postmortem_of_a_gap_in_the_lookback_says_partial(recording):
    """The issue's case: a damaged page inside the incident's window used to give 76 of 157 ticks as if all."""
    path, t0, _ = recording
    damage_page(path, "ticks", where=0.97)
    r = RecorderReader(path)
    try:
        pm = build(r, "spark2", audit_entries=[])
    finally:
        r.close()
    assert pm["ticks"] < 221 and pm["unreadable"] and "ticks of spark2" in pm["unreadable"][0]


@pytest.mark.fault("console --at on a damaged recorder file: the gap said on screen")
async def test_console_at_says_the_gap_on_screen(recording, ledger):
    from sparkconsole.config import ClusterConfig, NodeConfig
    from sparkconsole.tui.app import SparkConsoleApp
    from tests.helpers import wait_for
    from tests.test_tui_app import SIZE, widget_text

    path, t0, _ = recording
    damage_page(path, "ticks", where=0.97)
    cluster = ClusterConfig(nodes=(NodeConfig("spark1", "127.0.0.1"), NodeConfig("spark2", "127.0.0.1")),
                            endpoints=(), source="lab.yaml")
    app = SparkConsoleApp(cluster, monitor_factory=replay_monitor_factory(path, t0 + 400), replay_at=t0 + 400)
    async with app.run_test(size=SIZE) as pilot:
        events = app.dashboard.events
        await wait_for(pilot, lambda: "recorder file damaged" in widget_text(events), timeout=30,
                       what="the damaged stretch said in the events pane")
        text = widget_text(events)
        await wait_for(pilot, lambda: app.monitor.nodes["spark1"].last is not None, timeout=30,
                       what="the readable rows replayed")
    ledger.output(text, "console --at events pane")
    assert "ticks of spark2" in text and "Traceback" not in text
