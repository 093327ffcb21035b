"""llama-benchy JSON in and out, and published topology tables (CSV) in, so existing runs can be compared.

llama-benchy 0.4.0 `--format json`: top-level metadata (version, timestamp, latency_mode, latency_ms, model,
prefix_caching_enabled, max_concurrency) and `benchmarks`, one per level, each with concurrency, context_size,
prompt_size, response_size, is_context_prefill_phase and metrics {mean, std, values} named pp_throughput,
pp_req_throughput, tg_throughput, tg_req_throughput, peak_throughput, peak_req_throughput, ttfr, est_ppt,
e2e_ttft (t/s and ms). Our level metrics use the same names, so the mapping is one to one.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import time
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..yamlsrc import read_user_file
from .metrics import Metric
from .results import LevelKey, LevelResult, ResultsStore

BENCHY_METRICS = ("pp_throughput", "pp_req_throughput", "tg_throughput", "tg_req_throughput", "peak_throughput",
                  "peak_req_throughput", "ttfr", "est_ppt", "e2e_ttft")
PUBLISHED_COLUMNS = ("topology", "concurrency", "decode_tps", "prefill_tps", "ttft_ms")
BUNDLED_TABLE = "gpt-oss-120b-topologies.csv"
MAX_IMPORT_BYTES = 200_000_000       # a llama-benchy JSON with every request is large, but not this large


def import_file(store: ResultsStore, path: str | Path, *, label: str | None = None) -> list[str]:
    """Import a llama-benchy .json or a published-table .csv; returns the run ids (re-imports are no-ops)."""
    if str(path).lower().endswith(".csv"):
        return import_published_csv(store, path)
    return [import_benchy(store, path, label=label)]


def import_benchy(store: ResultsStore, path: str | Path, *, label: str | None = None) -> str:
    raw = read_user_file(path, MAX_IMPORT_BYTES)
    file = str(path)
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"not JSON ({exc})", file=file, fix="pass a file written by llama-benchy --format json") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise UserError("no 'benchmarks' list", file=file, field="benchmarks",
                        fix="pass a file written by llama-benchy --format json")
    levels = []
    for i, b in enumerate(doc["benchmarks"]):
        where = f"benchmarks[{i}]"
        if not isinstance(b, dict):
            raise UserError("not an object", file=file, field=where, fix="pass an unmodified llama-benchy JSON file")
        if b.get("is_context_prefill_phase"):
            continue     # the context-load phase of a prefix-caching run is not a level of its own here
        nums = {}
        for f in ("concurrency", "prompt_size", "response_size", "context_size"):
            v = b.get(f, 0 if f == "context_size" else None)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise UserError(f"{f} must be a whole number, got {v!r}", file=file, field=f"{where}.{f}",
                                fix="pass an unmodified llama-benchy JSON file")
            nums[f] = v
        metrics: dict[str, Any] = {}
        for name in BENCHY_METRICS:
            m = b.get(name)
            if m is None:
                metrics[name] = None
                continue
            try:
                got = Metric.from_json(m)
                if got is None:
                    raise ValueError("no metric")
                metrics[name] = got.to_json()
            except (KeyError, TypeError, ValueError, AttributeError):
                raise UserError("a metric needs numeric mean, std and values", file=file, field=f"{where}.{name}",
                                fix="pass an unmodified llama-benchy JSON file") from None
        tg = metrics.get("tg_throughput") or {}
        levels.append((LevelKey(nums["prompt_size"], nums["response_size"], nums["context_size"],
                                max(1, nums["concurrency"])), metrics, len(tg.get("values") or ()) or 1))
    sha = hashlib.sha256(raw).hexdigest()[:16]
    model = doc.get("model") if isinstance(doc.get("model"), str) else None
    run_label = label or Path(path).stem
    created = _parse_time(doc.get("timestamp"))
    run_id, existing = store.begin_run(
        source="llama-benchy", label=run_label, spec={"import": "llama-benchy", "sha256": sha}, resume=True,
        model=model, latency_mode=doc.get("latency_mode"), latency_ms=_num(doc.get("latency_ms")),
        tool_version=f"llama-benchy {doc.get('version', '?')}", created=created)
    if existing:
        return run_id
    for key, metrics, runs in levels:
        store.record_level(LevelResult(run_id=run_id, label=run_label, key=key, runs=runs, metrics=metrics,
                                       finished=created))
    store.finish_run(run_id)
    return run_id


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _parse_time(v: object) -> float:
    if isinstance(v, str):
        for fmt in ("%Y-%m-%d %H:%M:%SZ", "%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S"):
            try:
                return datetime.strptime(v, fmt).replace(tzinfo=UTC).timestamp()
            except ValueError:
                pass
    return time.time()


def export_benchy(store: ResultsStore, run_id: str) -> dict[str, Any]:
    """One run as llama-benchy 0.4.0 JSON (our extra percentiles ride along under `sparkconsole`)."""
    run = store.run(run_id)
    levels = store.levels(run.run_id)
    benchmarks = []
    for lv in levels:
        entry: dict[str, Any] = {"concurrency": lv.key.concurrency, "context_size": lv.key.depth,
                                 "prompt_size": lv.key.pp, "response_size": lv.key.tg,
                                 "is_context_prefill_phase": False}
        for name in BENCHY_METRICS:
            entry[name] = lv.metrics.get(name)
        entry["throughput_over_time"] = None
        entry["requests_throughput_over_time"] = None
        extra = {k: lv.metrics.get(k) for k in ("ttft_ms", "itl_ms", "tpot_ms", "requests_ok", "requests_failed")
                 if lv.metrics.get(k) is not None}
        if lv.thermal and (lv.thermal.max_temp_c is not None or lv.thermal.throttle_reasons):
            extra["max_temp_c"] = lv.thermal.max_temp_c
            extra["throttle_reasons"] = list(lv.thermal.throttle_reasons)
        if extra:
            entry["sparkconsole"] = extra
        benchmarks.append(entry)
    return {
        "version": run.tool_version or "sparkconsole",
        "timestamp": datetime.fromtimestamp(run.created, UTC).strftime("%Y-%m-%d %H:%M:%SZ"),
        "latency_mode": run.latency_mode or "none",
        "latency_ms": run.latency_ms or 0.0,
        "model": run.model or "",
        "prefix_caching_enabled": False,
        "max_concurrency": max((lv.key.concurrency for lv in levels), default=1),
        "benchmarks": benchmarks,
        "sparkconsole": {"run_id": run.run_id, "label": run.label, "source": run.source, "topology": run.topology,
                         "recipe": run.recipe, "recipe_hash": run.recipe_hash, "endpoint": run.endpoint,
                         "vllm_version": run.vllm_version, "simulated": run.simulated, "speed": run.speed},
    }


def bundled_published_csv() -> Path:
    """The published gpt-oss-120b topology table, bundled with the simulator's data."""
    return Path(str(resources.files("sparkconsole.sim").joinpath("data", BUNDLED_TABLE)))


def import_published_csv(store: ResultsStore, path: str | Path) -> list[str]:
    """A published table (topology, concurrency, decode_tps, prefill_tps, ttft_ms; totals) -> one run per topology.

    pp/tg come from a comment line such as '# … pp1024 tg128 …' (else 1024/128, the published setup)."""
    raw = read_user_file(path, MAX_IMPORT_BYTES)
    file = str(path)
    text = raw.decode("utf-8", "replace")
    notes = [line[1:].strip() for line in text.splitlines() if line.startswith("#")]
    pp = tg = None
    for n in notes:
        m = re.search(r"\bpp(\d+)\s+tg(\d+)\b", n)
        if m:
            pp, tg = int(m.group(1)), int(m.group(2))
            break
    pp, tg = pp or 1024, tg or 128
    model = None
    m = re.search(r"sweep:\s*(\S+)", notes[0]) if notes else None
    if m:
        model = m.group(1)
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip() and not line.startswith("#")]
    if not lines:
        raise UserError("no rows", file=file, fix="a published table needs a header and rows")
    reader = csv.DictReader(io.StringIO("\n".join(line for _, line in lines)))
    missing = [c for c in PUBLISHED_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise UserError(f"missing column(s) {', '.join(missing)}", file=file, line=lines[0][0],
                        fix="header must be " + ",".join(PUBLISHED_COLUMNS))
    by_topo: dict[str, list[tuple[int, dict[str, float]]]] = {}
    for (lineno, _), row in zip(lines[1:], reader, strict=False):
        try:
            c = int(row["concurrency"])
            vals = {k: float(row[k]) for k in ("decode_tps", "prefill_tps", "ttft_ms")}
        except (TypeError, ValueError):
            raise UserError("concurrency must be whole, the metrics numbers", file=file, line=lineno,
                            fix="correct the row") from None
        by_topo.setdefault(row["topology"], []).append((c, vals))
    sha = hashlib.sha256(raw).hexdigest()[:16]
    ids = []
    for topo, rows in by_topo.items():
        run_id, existing = store.begin_run(
            source="published", label=topo, spec={"import": "published", "sha256": sha, "topology": topo},
            resume=True, topology=topo, model=model, tool_version="; ".join(notes)[:500] or None)
        ids.append(run_id)
        if existing:
            continue
        for c, vals in rows:
            def one(v: float) -> dict[str, Any]:
                return {"mean": v, "std": 0.0, "values": [v]}
            metrics = {"tg_throughput": one(vals["decode_tps"]), "pp_throughput": one(vals["prefill_tps"]),
                       "e2e_ttft": one(vals["ttft_ms"])}
            store.record_level(LevelResult(run_id=run_id, label=topo, key=LevelKey(pp, tg, 0, c), runs=1,
                                           metrics=metrics, finished=time.time()))
        store.finish_run(run_id)
    return ids
