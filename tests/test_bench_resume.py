"""A sweep killed with SIGKILL keeps every finished level, and `--resume` continues without counting twice."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import time

from sparkconsole.bench.results import LevelKey, ResultsStore
from tests.helpers import levels_done
from tests.test_bench_helpers import Behaviour, FakeVllm

CONC = (1, 2, 3, 4, 5)
RUNS = 2


def _bench(url: str, results, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sparkconsole", "bench", "run", "--url", url, "--pp", "30", "--tg", "20",
            "-c", ",".join(map(str, CONC)), "--runs", str(RUNS), "--latency-mode", "none",
            "--results", str(results), "-q", *extra]


async def _wait(proc: asyncio.subprocess.Process, timeout: float) -> int:
    return await asyncio.wait_for(proc.wait(), timeout)


async def test_sigkill_mid_sweep_then_resume(tmp_path):
    srv = await FakeVllm(Behaviour(token_delay=0.01)).start()
    results = tmp_path / "bench.sqlite"
    try:
        proc = await asyncio.create_subprocess_exec(*_bench(srv.url, results), stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE)
        deadline = time.monotonic() + 60
        while levels_done(results) < 2:
            assert proc.returncode is None, (await proc.stderr.read()).decode()
            assert time.monotonic() < deadline, "sweep made no progress"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.15)            # now inside a later level, mid-batch
        os.kill(proc.pid, signal.SIGKILL)
        assert await _wait(proc, 10) == -signal.SIGKILL

        db = sqlite3.connect(results)
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        before = {tuple(r[:4]): r[4] for r in db.execute("SELECT pp, tg, depth, concurrency, finished FROM levels")}
        db.close()
        assert 2 <= len(before) < len(CONC)

        proc = await asyncio.create_subprocess_exec(*_bench(srv.url, results, "--resume"),
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
    finally:
        await srv.stop()

    db = sqlite3.connect(results)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    with ResultsStore(results) as store:
        runs = store.runs()
        assert len(runs) == 1 and runs[0].finished
        levels = store.levels(runs[0].run_id)
        assert [lv.key.concurrency for lv in levels] == list(CONC)           # each level exactly once
        for lv in levels:
            k = (lv.key.pp, lv.key.tg, lv.key.depth, lv.key.concurrency)
            if k in before:
                assert lv.finished == before[k]                               # kept, not measured again
            rows = store.requests(runs[0].run_id, LevelKey(*k))
            # The interrupted level's partial batches were replaced, not added to.
            assert len(rows) == RUNS * lv.key.concurrency
            assert sorted((r["run_index"], r["req_index"]) for r in rows) == [
                (i, j) for i in range(1, RUNS + 1) for j in range(lv.key.concurrency)]
            assert lv.metrics["requests_ok"] == RUNS * lv.key.concurrency
    assert f"{len(CONC) - len(before)} level(s) measured, {len(before)} already done" in out.decode()
