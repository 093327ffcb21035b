"""Reports from a results file: markdown (per-run detail, and comparison tables like the published ones with a
winner column and its margin), CSV (one row per level), JSON (llama-benchy's schema)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import UTC, datetime

from .advisor import margin_text
from .benchy_io import export_benchy
from .results import LevelResult, ResultsStore, RunInfo

# (metric, title, unit, higher is better, format)
COMPARED = (("tg_throughput", "Decode throughput (total)", "t/s", True, "{:.1f}"),
            ("pp_throughput", "Prefill throughput (total)", "t/s", True, "{:.0f}"),
            ("e2e_ttft", "Time to first token (mean)", "ms", False, "{:.0f}"))


def select_runs(store: ResultsStore, run_ids: Sequence[str] | None = None) -> list[RunInfo]:
    return [store.run(r) for r in run_ids] if run_ids else store.runs()


def _fmt(v: float | None, fmt: str = "{:.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def _pm(lv: LevelResult, name: str, fmt: str) -> str:
    m = lv.metric(name)
    if m is None:
        return "—"
    return fmt.format(m.mean) + (f" ± {fmt.format(m.std)}" if m.std and len(m.values) > 1 else "")


def _pct(lv: LevelResult, name: str, p: str) -> float | None:
    d = lv.metrics.get(name)
    return d.get(p) if isinstance(d, dict) else None


def run_markdown(run: RunInfo, levels: Sequence[LevelResult]) -> str:
    when = datetime.fromtimestamp(run.created, UTC).strftime("%Y-%m-%d %H:%M UTC")
    prov = [f"source {run.source}", f"model {run.model or '?'}"]
    if run.vllm_version:
        prov.append(f"vLLM {run.vllm_version}")
    if run.topology:
        prov.append(f"topology {run.topology}")
    if run.recipe:
        prov.append(f"recipe {run.recipe}" + (f" ({run.recipe_hash})" if run.recipe_hash else ""))
    if run.endpoint:
        prov.append(f"endpoint {run.endpoint}")
    if run.latency_mode:
        prov.append(f"latency {run.latency_mode} {run.latency_ms or 0:.1f} ms")
    if run.simulated:
        prov.append(f"SIMULATED (speed ×{run.speed:g}, intervals scaled)")
    state = "finished" if run.finished else "unfinished"
    lines = [f"## {run.label} — run {run.run_id} ({when}, {state})", "", "; ".join(prov) + ".", ""]
    lines.append("| test | c | decode t/s (total) | decode t/s (req) | peak t/s | prefill t/s (total) | "
                 "TTFR ms | est. prefill ms | TTFT ms | TTFT p50/p90/p99 ms | ITL p50/p99 ms | TPOT p50 ms | "
                 "ok/failed | max °C | throttle |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for lv in levels:
        k = lv.key
        test = f"pp{k.pp} tg{k.tg}" + (f" @ d{k.depth}" if k.depth else "")
        ttft_p = "/".join(_fmt(_pct(lv, "ttft_ms", p), "{:.0f}") for p in ("p50", "p90", "p99"))
        itl_p = "/".join(_fmt(_pct(lv, "itl_ms", p), "{:.1f}") for p in ("p50", "p99"))
        ok, bad = lv.metrics.get("requests_ok"), lv.metrics.get("requests_failed")
        th = lv.thermal
        lines.append(
            f"| {test} | {k.concurrency} | {_pm(lv, 'tg_throughput', '{:.1f}')} | {_pm(lv, 'tg_req_throughput', '{:.1f}')}"
            f" | {_pm(lv, 'peak_throughput', '{:.1f}')} | {_pm(lv, 'pp_throughput', '{:.0f}')}"
            f" | {_pm(lv, 'ttfr', '{:.0f}')} | {_pm(lv, 'est_ppt', '{:.0f}')} | {_pm(lv, 'e2e_ttft', '{:.0f}')}"
            f" | {ttft_p} | {itl_p} | {_fmt(_pct(lv, 'tpot_ms', 'p50'), '{:.1f}')}"
            f" | {'—' if ok is None else f'{ok}/{bad}'} | {_fmt(th.max_temp_c if th else None, '{:.0f}')}"
            f" | {', '.join(th.throttle_reasons) if th and th.throttle_reasons else '—'} |")
    kv = [lv for lv in levels if (lv.metrics.get("kv") or {}).get("read")]
    if kv:
        lines += ["", "KV cache over the connector (receiving servers' /metrics around each level):", "",
                  "| test | c | transfers | per request | ms per transfer | prompt from transfer |",
                  "|---|---:|---:|---:|---:|---:|"]
        for lv in kv:
            k, f = lv.key, lv.metrics["kv"]
            per = f.get("bytes_per_request")
            share = f.get("prompt_external_share")
            lines.append(f"| pp{k.pp} tg{k.tg} | {k.concurrency} | {_fmt(f.get('transfers'), '{:.0f}')}"
                         f" | {'—' if per is None else f'{per / 1024:.0f} KiB'} | {_fmt(f.get('xfer_ms_mean'))}"
                         f" | {'—' if share is None else f'{share * 100:.0f}%'} |")
    errors: dict[str, int] = {}
    for lv in levels:
        for e, n in (lv.metrics.get("errors") or {}).items():
            errors[e] = errors.get(e, 0) + n
    if errors:
        lines += ["", "Failed requests:"] + [f"- {n} × {e}" for e, n in sorted(errors.items(), key=lambda x: -x[1])]
    return "\n".join(lines) + "\n"


def winner_cell(values: dict[str, float], unit: str, higher: bool, fmt: str) -> str:
    """'cluster-tp2 69.0 t/s (+20%)': the best label, its value, and its margin over the runner-up."""
    if not values:
        return "—"
    ranked = sorted(values.items(), key=lambda kv: kv[1], reverse=higher)
    label, best = ranked[0]
    if len(ranked) < 2 or not ranked[1][1]:
        return f"{label} {fmt.format(best)} {unit}"
    return f"{label} {fmt.format(best)} {unit}{margin_text(best / ranked[1][1] - 1.0)}"


def comparison_markdown(levels: Sequence[LevelResult]) -> str:
    """Tables like the published topology study: rows are concurrency levels, columns the compared labels."""
    shapes = sorted({(lv.key.pp, lv.key.tg, lv.key.depth) for lv in levels})
    out = []
    for shape in shapes:
        sub = [lv for lv in levels if (lv.key.pp, lv.key.tg, lv.key.depth) == shape]
        labels = list(dict.fromkeys(lv.label for lv in sub))
        if len(labels) < 2:
            continue
        grid = {(lv.label, lv.key.concurrency): lv for lv in sub}
        conc = sorted({lv.key.concurrency for lv in sub})
        pp, tg, depth = shape
        for metric, title, unit, higher, fmt in COMPARED:
            out.append(f"### {title}, {unit} — pp{pp} tg{tg}" + (f" depth {depth}" if depth else ""))
            out.append("")
            out.append("| concurrency | " + " | ".join(labels) + " | winner |")
            out.append("|---:|" + "---:|" * len(labels) + "---|")
            for c in conc:
                vals = {}
                cells = []
                for label in labels:
                    lv = grid.get((label, c))
                    v = lv.mean(metric) if lv else None
                    cells.append(_fmt(v, fmt))
                    if v is not None:
                        vals[label] = v
                out.append(f"| {c} | " + " | ".join(cells) + f" | {winner_cell(vals, unit, higher, fmt)} |")
            out.append("")
    return "\n".join(out)


def markdown(store: ResultsStore, run_ids: Sequence[str] | None = None) -> str:
    runs = select_runs(store, run_ids)
    if not runs:
        return "No runs in this results file.\n"
    parts = [f"# Benchmark report — {store.path.name}", ""]
    cmp_levels = []
    empty = []
    for run in runs:
        levels = store.levels(run.run_id)
        if not levels:         # stopped before its first level finished: nothing to tabulate
            empty.append(run)
            continue
        cmp_levels += levels
        parts.append(run_markdown(run, levels))
    if empty:
        parts.append("Stopped before a level finished, nothing measured: " + ", ".join(
            f"{r.label} (run {r.run_id}, {datetime.fromtimestamp(r.created, UTC):%Y-%m-%d %H:%M} UTC)"
            for r in empty) + ".\n")
    cmp = comparison_markdown(cmp_levels)
    if cmp:
        parts += ["## Comparison", "", cmp]
    return "\n".join(parts)


CSV_FIELDS = ("run_id", "label", "source", "topology", "model", "vllm_version", "simulated", "pp", "tg", "depth",
              "concurrency", "runs", "decode_tps", "decode_tps_std", "decode_req_tps", "peak_tps", "prefill_tps",
              "prefill_tps_std", "prefill_req_tps", "ttfr_ms", "est_ppt_ms", "ttft_ms", "ttft_p50_ms", "ttft_p90_ms",
              "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
              "requests_ok", "requests_failed", "max_temp_c", "throttle_reasons")


def csv_text(store: ResultsStore, run_ids: Sequence[str] | None = None) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for run in select_runs(store, run_ids):
        for lv in store.levels(run.run_id):
            def std(n: str, lv: LevelResult = lv) -> float | None:
                m = lv.metric(n)
                return m.std if m else None
            row = {"run_id": run.run_id, "label": run.label, "source": run.source, "topology": run.topology,
                   "model": run.model, "vllm_version": run.vllm_version, "simulated": int(run.simulated),
                   "pp": lv.key.pp, "tg": lv.key.tg, "depth": lv.key.depth, "concurrency": lv.key.concurrency,
                   "runs": lv.runs, "decode_tps": lv.mean("tg_throughput"), "decode_tps_std": std("tg_throughput"),
                   "decode_req_tps": lv.mean("tg_req_throughput"), "peak_tps": lv.mean("peak_throughput"),
                   "prefill_tps": lv.mean("pp_throughput"), "prefill_tps_std": std("pp_throughput"),
                   "prefill_req_tps": lv.mean("pp_req_throughput"), "ttfr_ms": lv.mean("ttfr"),
                   "est_ppt_ms": lv.mean("est_ppt"), "ttft_ms": lv.mean("e2e_ttft"),
                   "requests_ok": lv.metrics.get("requests_ok"), "requests_failed": lv.metrics.get("requests_failed"),
                   "max_temp_c": lv.thermal.max_temp_c if lv.thermal else None,
                   "throttle_reasons": ";".join(lv.thermal.throttle_reasons) if lv.thermal else ""}
            for name in ("ttft", "itl", "tpot"):
                for p in ("p50", "p90", "p99"):
                    row[f"{name}_{p}_ms"] = _pct(lv, f"{name}_ms", p)
            w.writerow(row)
    return buf.getvalue()


def json_text(store: ResultsStore, run_ids: Sequence[str] | None = None) -> str:
    """llama-benchy JSON: one object for one run, a list of them for several."""
    docs = [export_benchy(store, r.run_id) for r in select_runs(store, run_ids)]
    return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2) + "\n"
