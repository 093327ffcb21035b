"""The console killed (SIGKILL) again and again in the middle of a bench sweep, then `bench run --resume`.

tests/test_bench_resume.py kills once; here the sweep is killed three times at different points (mid-level,
right after a level lands, during the first batch of a resumed run), each time resumed. What was measured before
each kill must still be there afterwards, unchanged (data lost = levels that vanished or changed), no level or
request may be counted twice, and the SQLite file must pass PRAGMA integrity_check after every kill.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import time

import pytest

from sparkconsole.bench.results import LevelKey, ResultsStore
from tests.test_bench_helpers import Behaviour, FakeVllm

CONC = (1, 2, 3, 4, 5, 6)
RUNS = 2


def bench(url: str, results, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sparkconsole", "bench", "run", "--url", url, "--pp", "30", "--tg", "20",
            "-c", ",".join(map(str, CONC)), "--runs", str(RUNS), "--latency-mode", "none",
            "--results", str(results), "-q", *extra]


def finished_levels(path) -> dict[tuple, float]:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return {tuple(r[:4]): r[4] for r in db.execute("SELECT pp, tg, depth, concurrency, finished FROM levels")}
        finally:
            db.close()
    except sqlite3.Error:
        return {}


def integrity(path) -> str:
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()


@pytest.mark.fault("console SIGKILLed three times mid-sweep, resumed each time")
async def test_repeated_sigkill_then_resume_loses_nothing(tmp_path, ledger):
    srv = await FakeVllm(Behaviour(token_delay=0.01)).start()
    results = tmp_path / "bench.sqlite"
    kept: dict[tuple, float] = {}
    lost = 0
    # kill when this many levels are done, after this extra delay (s) into the next one
    kills = [(1, 0.15), (3, 0.0), (4, 0.05)]
    try:
        for i, (after_levels, delay) in enumerate(kills):
            extra = ("--resume",) if i else ()
            proc = await asyncio.create_subprocess_exec(*bench(srv.url, results, *extra),
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.PIPE)
            deadline = time.monotonic() + 90
            while len(finished_levels(results)) < after_levels:
                assert proc.returncode is None, (await proc.stderr.read()).decode()
                assert time.monotonic() < deadline, "sweep made no progress"
                await asyncio.sleep(0.02)
            await asyncio.sleep(delay)
            os.kill(proc.pid, signal.SIGKILL)
            assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL
            assert integrity(results) == "ok"
            now = finished_levels(results)
            lost += sum(1 for k, v in kept.items() if now.get(k) != v)
            kept.update(now)
        proc = await asyncio.create_subprocess_exec(*bench(srv.url, results, "--resume"),
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 180)
        ledger.output(out + err, "bench run --resume")
        assert proc.returncode == 0, err.decode()
    finally:
        await srv.stop()
    assert integrity(results) == "ok"
    final = finished_levels(results)
    lost += sum(1 for k, v in kept.items() if final.get(k) != v)
    ledger.lost(lost, "bench levels after SIGKILL + resume")
    assert lost == 0
    with ResultsStore(results) as store:
        runs = store.runs()
        assert len(runs) == 1 and runs[0].finished
        levels = store.levels(runs[0].run_id)
        assert [lv.key.concurrency for lv in levels] == list(CONC)          # each level exactly once
        for lv in levels:
            rows = store.requests(runs[0].run_id, LevelKey(lv.key.pp, lv.key.tg, lv.key.depth, lv.key.concurrency))
            assert sorted((r["run_index"], r["req_index"]) for r in rows) == [
                (i, j) for i in range(1, RUNS + 1) for j in range(lv.key.concurrency)]   # no request twice
