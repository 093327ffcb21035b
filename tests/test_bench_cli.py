"""`sparkconsole bench …` end to end: real subprocesses, real results files, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.test_bench_helpers import Behaviour, FakeVllm


def sc(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkconsole", "bench", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_import_published_then_advise_and_report(tmp_path):
    f = str(tmp_path / "pub.sqlite")
    r = sc("import", "--published", "--results", f)
    assert r.returncode == 0, r.stderr
    assert "4 run(s)" in r.stdout
    adv = sc("advise", f)
    assert adv.returncode == 0, adv.stderr
    low = next(line for line in adv.stdout.splitlines() if line.startswith("| c1–c4"))
    assert low.split("|")[2].strip().startswith("cluster-tp2")
    csv_out = sc("report", f, "--format", "csv")
    assert csv_out.returncode == 0 and len(csv_out.stdout.strip().splitlines()) == 1 + 28
    listing = sc("list", f)
    assert listing.stdout.count("published") == 4


@pytest.mark.parametrize("args, needle", [
    (("report", "missing.sqlite"), "missing.sqlite: file not found"),
    (("advise", "notes.txt"), "notes.txt: not a results file"),
    (("import", "nothing.json", "--results", "x.sqlite"), "nothing.json: file not found"),
    (("import", "--results", "x.sqlite"), "nothing to import"),
    (("matrix", "--recipe", "r", "--topologies", "solo", "--endpoints", "solo"), "--endpoints: bad entry"),
    (("matrix", "--recipe", "r", "--topologies", "solo"), "recipe: no recipe named 'r'"),
    (("matrix", "--recipe", "gpt-oss-120b", "--speed", "3"), "--speed: --speed sets the simulated clock"),
    (("matrix", "--recipe", "gpt-oss-120b", "--demo", "--keep-last"),
     "--keep-last: --keep-last leaves a launch serving, but the simulated cluster ends with the command"),
    (("matrix", "--recipe", "gpt-oss-120b", "--topologies", "solo", "--endpoints", "solo=http://127.0.0.1:9",
      "--keep-last"), "--keep-last: --keep-last leaves a launch serving, but --endpoints launches nothing"),
    # nothing listens there: said before the model is asked for (issue 24, item 9)
    (("run", "--url", "http://127.0.0.1:9", "--results", "x.sqlite", "--latency-mode", "none"),
     "--url: cannot connect to http://127.0.0.1:9"),
    (("run", "--url", "http://127.0.0.1:9", "--kv-metrics", "10.0.0.2:8000", "--results", "x.sqlite"),
     "--kv-metrics: --kv-metrics '10.0.0.2:8000' is not an http(s) URL"),
])
def test_mistakes_are_one_line_errors(tmp_path, args, needle):
    (tmp_path / "notes.txt").write_text("not a database " * 200)
    r = sc(*args, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparkconsole: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_bad_concurrency_list_is_refused_by_the_parser(tmp_path):
    r = sc("run", "--url", "http://x", "-c", "1,zero", cwd=tmp_path)
    assert r.returncode == 2 and "--concurrency needs comma-separated whole numbers" in r.stderr


async def test_run_then_json_report(tmp_path):
    srv = await FakeVllm(Behaviour(token_delay=0.001, sim_speed=4.0)).start()
    f = str(tmp_path / "b.sqlite")
    try:
        import asyncio
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sparkconsole", "bench", "run", "--url", srv.url + "/v1", "--pp", "20", "--tg", "6",
            "-c", "1,2", "--runs", "1", "--results", f, "--topology", "solo",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        await srv.stop()
    assert proc.returncode == 0, err.decode()
    assert "2 level(s) measured" in out.decode() and "SIMULATED" in out.decode()
    assert "level 2/2 pp20 tg6 c2" in err.decode()            # the progress line
    doc = json.loads(sc("report", f, "--format", "json").stdout)
    assert doc["sparkconsole"]["topology"] == "solo" and doc["sparkconsole"]["simulated"] is True
    assert [b["concurrency"] for b in doc["benchmarks"]] == [1, 2]
    md = sc("report", f).stdout
    assert "SIMULATED (speed ×4" in md


async def test_matrix_on_failure_pause_stops_there_and_says_how_to_go_on(tmp_path):
    """`bench matrix --endpoints … --on-failure pause`: the first topology's server answers HTTP 500, so its first
    level fails; the matrix stops there (the second endpoint is never swept), says so in one line, exits 1."""
    import asyncio
    bad = await FakeVllm(Behaviour(token_delay=0.001, http_status=500)).start()
    good = await FakeVllm(Behaviour(token_delay=0.001)).start()
    f = str(tmp_path / "m.sqlite")
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sparkconsole", "bench", "matrix", "--recipe", "gpt-oss-120b",
            "--topologies", "solo,cluster-tp2", "--endpoints", f"solo={bad.url}/v1,cluster-tp2={good.url}/v1",
            "--pp", "20", "--tg", "6", "-c", "1,2", "--runs", "1", "--latency-mode", "none", "--on-failure", "pause",
            "--results", f, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        await bad.stop()
        await good.stop()
    text = out.decode()
    assert proc.returncode == 1, err.decode()[-2000:]
    assert "measured 0, skipped 0, failed 0" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("paused at "))
    assert line.startswith("paused at solo after pp20 tg6 c1: ") and "HTTP 500" in line and "--resume" in line
    assert "Traceback" not in err.decode()
    doc = json.loads(sc("report", f, "--format", "json").stdout)
    assert doc["sparkconsole"]["topology"] == "solo"          # only solo was swept
