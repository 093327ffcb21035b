"""Reports, llama-benchy import/export, the published table and the advisor, on real SQLite files."""

from __future__ import annotations

import csv
import io
import json

import pytest

from sparkconsole.bench import advisor, report
from sparkconsole.bench.benchy_io import bundled_published_csv, export_benchy, import_benchy, import_file
from sparkconsole.bench.measure import run_sweep
from sparkconsole.bench.results import ResultsStore
from sparkconsole.bench.sweep import SweepSpec
from sparkconsole.errors import UserError
from tests.test_bench_helpers import Behaviour, FakeVllm

# Recorded output of a real llama-benchy 0.4.0 run (--pp 64 --tg 16 --runs 2 --concurrency 1 4 --exact-tg
# --format json) against tests/test_bench_helpers.FakeVllm; floats rounded to 4 decimals.
BENCHY_JSON = (
    '{"version":"0.4.0","timestamp":"2026-11-22 17:11:02Z","latency_mode":"api","latency_ms":1.1858,"mode'
    'l":"fake/model-1","prefix_caching_enabled":false,"max_concurrency":4,"benchmarks":[{"concurrency":1,'
    '"context_size":0,"prompt_size":64,"response_size":16,"is_context_prefill_phase":false,"pp_throughput'
    '":{"mean":50617.9283,"std":43369.2885,"values":[7248.6398,93987.2167]},"pp_req_throughput":{"mean":5'
    '0617.9283,"std":43369.2885,"values":[7248.6398,93987.2167]},"tg_throughput":{"mean":244.5846,"std":2'
    '5.278,"values":[219.3066,269.8625]},"tg_req_throughput":{"mean":244.5846,"std":25.278,"values":[219.'
    '3066,269.8625]},"peak_throughput":{"mean":263.3988,"std":27.2224,"values":[236.1764,290.6212]},"peak'
    '_req_throughput":{"mean":263.3988,"std":27.2224,"values":[236.1764,290.6212]},"ttfr":{"mean":5.9409,'
    '"std":4.0741,"values":[10.015,1.8668]},"est_ppt":{"mean":4.7551,"std":4.0741,"values":[8.8292,0.6809'
    ']},"e2e_ttft":{"mean":12.2038,"std":0.7561,"values":[12.9599,11.4478]},"throughput_over_time":null,"'
    'requests_throughput_over_time":null},{"concurrency":4,"context_size":0,"prompt_size":64,"response_si'
    'ze":16,"is_context_prefill_phase":false,"pp_throughput":{"mean":10275.7017,"std":220.0728,"values":['
    '10055.6288,10495.7745]},"pp_req_throughput":{"mean":3858.1894,"std":696.1073,"values":[4400.8689,427'
    '2.0287,3033.9557,2969.0726,3311.7412,4803.3326,4622.4229,3452.0922]},"tg_throughput":{"mean":814.951'
    '4,"std":2.4437,"values":[817.3951,812.5077]},"tg_req_throughput":{"mean":218.9002,"std":9.0169,"valu'
    'es":[212.2348,211.9825,212.4786,212.3118,216.1151,234.3009,233.9787,217.7993]},"peak_throughput":{"m'
    'ean":877.6399,"std":2.6317,"values":[880.2716,875.0082]},"peak_req_throughput":{"mean":235.7387,"std'
    '":9.7105,"values":[228.5606,228.2889,228.8231,228.6435,232.7393,252.324,251.977,234.5531]},"ttfr":{"'
    'mean":18.3368,"std":3.1363,"values":[15.7284,16.167,22.2804,22.7414,20.511,14.5099,15.0314,19.7253]}'
    ',"est_ppt":{"mean":17.151,"std":3.1363,"values":[14.5426,14.9812,21.0946,21.5556,19.3252,13.3241,13.'
    '8456,18.5395]},"e2e_ttft":{"mean":23.1885,"std":1.8079,"values":[23.0723,22.9186,25.1749,25.1608,24.'
    '3908,20.383,20.337,24.0707]},"throughput_over_time":null,"requests_throughput_over_time":null}]}'
)


def _published() -> dict[tuple[str, int], dict[str, float]]:
    rows = [line for line in bundled_published_csv().read_text().splitlines() if line and not line.startswith("#")]
    return {(r["topology"], int(r["concurrency"])): {k: float(r[k]) for k in ("decode_tps", "prefill_tps", "ttft_ms")}
            for r in csv.DictReader(io.StringIO("\n".join(rows)))}


@pytest.fixture
def store(tmp_path):
    with ResultsStore(tmp_path / "r.sqlite") as s:
        yield s


def test_import_llama_benchy_json(store, tmp_path):
    path = tmp_path / "benchy.json"
    path.write_text(BENCHY_JSON)
    doc = json.loads(BENCHY_JSON)
    run_id = import_benchy(store, path)
    assert import_benchy(store, path) == run_id                  # a re-import adds nothing
    run = store.run(run_id)
    assert run.source == "llama-benchy" and run.model == "fake/model-1" and run.tool_version == "llama-benchy 0.4.0"
    levels = store.levels(run_id)
    assert [(lv.key.pp, lv.key.tg, lv.key.concurrency) for lv in levels] == [(64, 16, 1), (64, 16, 4)]
    for lv, b in zip(levels, doc["benchmarks"], strict=False):
        assert lv.decode_tps == b["tg_throughput"]["mean"] and lv.ttft_ms == b["e2e_ttft"]["mean"]
        assert lv.runs == len(b["tg_throughput"]["values"])
    # Exported again in llama-benchy's schema, the metrics come back unchanged.
    out = export_benchy(store, run_id)
    assert {k for k in doc if k != "benchmarks"} <= set(out)
    for mine, theirs in zip(out["benchmarks"], doc["benchmarks"], strict=False):
        for k, v in theirs.items():
            assert mine[k] == v, k


@pytest.mark.parametrize("text, field", [
    ("{not json", None),
    ('{"model": "x"}', "benchmarks"),
    ('{"benchmarks": [{"concurrency": "four", "prompt_size": 1, "response_size": 1}]}', "benchmarks[0].concurrency"),
    ('{"benchmarks": [{"concurrency": 1, "prompt_size": 1, "response_size": 1, "tg_throughput": {"mean": "x"}}]}',
     "benchmarks[0].tg_throughput"),
])
def test_bad_llama_benchy_files_give_one_line_errors(store, tmp_path, text, field):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        import_benchy(store, path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "fix:" in msg
    if field:
        assert field in msg
    assert store.runs() == []


def test_published_table_imports_as_one_run_per_topology(store):
    pub = _published()
    ids = import_file(store, bundled_published_csv())
    assert import_file(store, bundled_published_csv()) == ids
    runs = store.runs()
    assert [r.label for r in runs] == list(dict.fromkeys(t for t, _ in pub))
    for r in runs:
        for lv in store.levels(r.run_id):
            want = pub[(r.label, lv.key.concurrency)]
            assert (lv.key.pp, lv.key.tg) == (1024, 128)
            assert (lv.decode_tps, lv.prefill_tps, lv.ttft_ms) == (want["decode_tps"], want["prefill_tps"],
                                                                   want["ttft_ms"])


def test_advisor_derives_the_published_when_to_use_which(store):
    import_file(store, bundled_published_csv())
    pub = _published()
    verdicts = advisor.advise(store.levels())
    by = {(v.band_label, v.criterion): v for v in verdicts}
    low_decode, high_prefill = by[("c1–c4", "decode")], by[("c32–c64", "prefill")]
    assert low_decode.winner == "cluster-tp2"
    assert high_prefill.winner == "2x-solo-simple-shuffle"
    assert by[("c32–c64", "TTFT")].winner == "2x-solo-simple-shuffle"
    # The margin is the band mean against the runner-up's, from the table itself.
    mean = lambda topo, cs, m: sum(pub[(topo, c)][m] for c in cs) / len(cs)  # noqa: E731
    assert low_decode.value == pytest.approx(mean("cluster-tp2", (1, 2, 4), "decode_tps"))
    ru = low_decode.runner_up
    assert low_decode.margin == pytest.approx(low_decode.value / mean(ru, (1, 2, 4), "decode_tps") - 1)
    assert all(low_decode.value > mean(t, (1, 2, 4), "decode_tps") for t, _ in pub if t != "cluster-tp2")
    md = advisor.markdown(verdicts)
    assert "| c1–c4 | cluster-tp2" in md and "2x-solo-simple-shuffle" in md


def test_comparison_report_has_a_winner_column_with_margin(store):
    import_file(store, bundled_published_csv())
    md = report.markdown(store)
    pub = _published()
    c1 = {t: v["decode_tps"] for (t, c), v in pub.items() if c == 1}
    best, second = sorted(c1.values(), reverse=True)[:2]
    winner = max(c1, key=c1.get)
    assert f"{winner} {best:.1f} t/s ({(best / second - 1) * 100:+.0f}%)" in md
    assert "cluster-tp2 69.0 t/s (+20%)" in md          # the published example, derived
    ttft_rows = md.split("Time to first token")[1]
    assert "| winner |" in ttft_rows


async def test_reports_of_a_measured_run(store, tmp_path):
    srv = await FakeVllm(Behaviour(token_delay=0.001)).start()
    try:
        out = await run_sweep(SweepSpec(url=srv.url, pp=(30,), tg=(10,), concurrency=(1, 2), runs=2,
                                        latency_mode="none"), store)
    finally:
        await srv.stop()
    rows = list(csv.DictReader(io.StringIO(report.csv_text(store))))
    assert [int(r["concurrency"]) for r in rows] == [1, 2]
    assert all(float(r["decode_tps"]) > 0 and r["model"] == "fake/model-1" for r in rows)
    assert all(float(r["itl_p50_ms"]) <= float(r["itl_p99_ms"]) for r in rows)
    doc = json.loads(report.json_text(store))
    assert doc["model"] == "fake/model-1" and doc["max_concurrency"] == 2
    assert [b["concurrency"] for b in doc["benchmarks"]] == [1, 2]
    # Our JSON is llama-benchy's: it imports back as a run with the same figures.
    path = tmp_path / "export.json"
    path.write_text(json.dumps(doc))
    again = import_benchy(store, path, label="roundtrip")
    assert [lv.decode_tps for lv in store.levels(again)] == [lv.decode_tps for lv in store.levels(out.run_id)]
    md = report.markdown(store, [out.run_id])
    assert "| pp30 tg10 | 2 |" in md and "vLLM 0.32.0-fake" in md


def test_results_file_that_is_not_one_is_refused(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello, not a database " * 100)
    with pytest.raises(UserError, match="not a results file"):
        ResultsStore(bad)


def test_a_results_file_from_a_newer_sparkconsole_is_refused_and_left_closed(tmp_path):
    """The refusing store closes its connection at once: the newer sparkconsole's writer can leave WAL mode."""
    import sqlite3

    from tests.helpers import refusal_leaves_file_alone

    path = tmp_path / "results.sqlite"
    ResultsStore(path).close()
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("UPDATE meta SET value='999' WHERE key='schema'")
    assert refusal_leaves_file_alone(writer, lambda: ResultsStore(path), "upgrade sparkconsole")

def test_advisor_keeps_one_row_per_band_when_a_level_lacks_a_figure(store):
    from sparkconsole.bench.results import LevelKey, LevelResult

    one = lambda v: {"mean": v, "std": 0.0, "values": [v]}  # noqa: E731
    for label, rows in {"a": {1: (10, None), 2: (20, 200), 4: (30, 300)},
                        "b": {1: (12, 150), 2: (18, 100), 4: (25, 100)}}.items():
        run_id, _ = store.begin_run(source="sparkconsole", label=label, spec={"l": label})
        for c, (dec, pre) in rows.items():
            metrics = {"tg_throughput": one(dec), "pp_throughput": one(pre) if pre else None}
            store.record_level(LevelResult(run_id, label, LevelKey(64, 16, 0, c), 1, metrics, finished=1.0))
    verdicts = advisor.advise(store.levels())
    decode = next(v for v in verdicts if v.criterion == "decode")
    prefill = next(v for v in verdicts if v.criterion == "prefill")
    assert decode.winner == "a" and decode.band == (1, 4) and decode.margin == pytest.approx(20 / (55 / 3) - 1)
    assert prefill.winner == "a" and prefill.band == (2, 4)          # compared where both measured it
    rows = [line for line in advisor.markdown(verdicts).splitlines() if line.startswith("| c") and "concurrency" not in line]
    assert len(rows) == 1 and rows[0].startswith("| c1–c4 |") and "[c2–c4]" in rows[0]
    assert "TTFT" in advisor.markdown(verdicts) and "—" in rows[0]  # no TTFT measured: an empty cell


def test_results_file_from_before_the_itl_columns_is_upgraded_on_open(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE requests (run_id TEXT NOT NULL, pp INTEGER NOT NULL, tg INTEGER NOT NULL, depth INTEGER"
               " NOT NULL, concurrency INTEGER NOT NULL, run_index INTEGER NOT NULL, req_index INTEGER NOT NULL,"
               " ok INTEGER NOT NULL, error TEXT, status INTEGER, prompt_tokens INTEGER, completion_tokens INTEGER,"
               " tokens_estimated INTEGER NOT NULL DEFAULT 0, ttfr_ms REAL, ttft_ms REAL, est_ppt_ms REAL,"
               " prefill_tps REAL, decode_tps REAL, tpot_ms REAL,"
               " PRIMARY KEY (run_id, pp, tg, depth, concurrency, run_index, req_index))")
    db.commit()
    db.close()
    from sparkconsole.bench.results import LevelKey
    with ResultsStore(path) as store:
        store.record_requests("r1", LevelKey(1, 2, 0, 1), 1, [{"ok": True, "itl_max_ms": 7.5}])
        assert store.requests("r1")[0]["itl_max_ms"] == 7.5
