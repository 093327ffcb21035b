"""`sparkconsole bench run|matrix|report|import|advise|list`: benchmark sweeps and their results, headless.

    sparkconsole bench run --url http://127.0.0.1:8000 --pp 1024 --tg 128 --concurrency 1,2,4,8,16,32,64 --runs 3
    sparkconsole bench run --url URL … --results runs/bench.sqlite --resume      # continue an interrupted sweep
    sparkconsole bench matrix --recipe gpt-oss-120b --topologies solo,cluster-tp2,2x-solo-shuffle,2x-solo-least-busy
    sparkconsole bench matrix --recipe gpt-oss-120b --demo --speed 10      # the same on a simulated cluster
    sparkconsole bench matrix --recipe gpt-oss-120b --topologies solo,cluster-tp2 --endpoints solo=URL,cluster-tp2=URL
    sparkconsole bench report runs/bench.sqlite [--format md|csv|json] [--run ID]
    sparkconsole bench import results.json [--results FILE]     # llama-benchy JSON (or a published-table CSV)
    sparkconsole bench import --published                       # the bundled gpt-oss-120b topology study
    sparkconsole bench advise runs/bench.sqlite                 # which topology wins which concurrency band

`bench matrix` launches each topology through the recipe runner on the nodes of the cluster file (plan, preflight,
run, wait until ready), sweeps it, records it and stops it; `--demo` does that on a simulated two-node cluster
started for the run (every figure in simulated time, `--speed F` runs its clock F times faster).

Results go to a SQLite file (default runs/bench.sqlite) as each level finishes. With the global `--cluster FILE`,
the nodes are watched during the sweep and each level records the hottest GPU and any power/thermal throttling. An API key, if the endpoint needs
one, is read from $SPARKCONSOLE_API_KEY or $OPENAI_API_KEY and never stored.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..paths import DEFAULT_RESULTS, DEMO_RESULTS
from .bench_cli import ProgressLine, cluster_probe, existing_results, sweep_spec
from .bench_matrix import DEMO_SPEED


def _ints(name: str, low: int = 1) -> Callable[[str], tuple[int, ...]]:
    def parse(text: str) -> tuple[int, ...]:
        try:
            vals = tuple(int(x) for x in text.replace(" ", ",").split(",") if x)
        except ValueError:
            vals = ()
        if not vals or any(v < low for v in vals):
            raise argparse.ArgumentTypeError(f"{name} needs comma-separated whole numbers ≥ {low}, e.g. 1,2,4")
        return vals
    return parse


def _sweep_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model name (default: the first /v1/models lists)")
    p.add_argument("--pp", type=_ints("--pp"), default=(1024,), help="prompt tokens (list), default 1024")
    p.add_argument("--tg", type=_ints("--tg"), default=(128,), help="generated tokens (list), default 128")
    p.add_argument("--depth", type=_ints("--depth", 0), default=(0,), help="context tokens before the prompt (list)")
    p.add_argument("--concurrency", "-c", type=_ints("--concurrency"), default=(1, 2, 4, 8, 16, 32, 64),
                   help="concurrency levels, default 1,2,4,8,16,32,64")
    p.add_argument("--runs", type=int, default=3, help="batches per level (default 3)")
    p.add_argument("--no-warmup", action="store_true", help="skip the unrecorded warm-up batch of each level")
    p.add_argument("--pace", type=float, default=0.0, metavar="SECONDS",
                   help="start each batch at least SECONDS after the one before started: a steady load that leaves "
                        "the servers room, e.g. beside a `recipe restart` (default 0: back to back)")
    p.add_argument("--latency-mode", choices=("api", "generation", "none"), default="api",
                   help="latency subtracted from TTFR for the prefill estimate (llama-benchy's modes)")
    p.add_argument("--no-exact-tg", action="store_true", help="do not send min_tokens/ignore_eos")
    p.add_argument("--no-token-ids", action="store_true", help="do not ask for return_token_ids")
    p.add_argument("--stall-timeout", type=float, default=60.0,
                   help="seconds without data mid-stream before a request fails (default 60)")
    p.add_argument("--first-timeout", type=float, default=600.0,
                   help="seconds a request may wait for its first chunk: queueing and prefill (default 600)")
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"results file (default {DEFAULT_RESULTS})")
    p.add_argument("--resume", action="store_true", help="continue the newest run of the same sweep in --results")
    p.add_argument("--on-failure", choices=("continue", "pause"), default="continue",
                   help="after a level with failed requests: go on (default), or stop (continue with --resume)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress line")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("bench", help="benchmark sweeps, results, reports and the topology advisor",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="bench_command", metavar="ACTION")
    sub.required = True

    r = sub.add_parser("run", help="sweep one endpoint")
    r.add_argument("--url", help="the OpenAI-compatible server, e.g. http://127.0.0.1:8000 (default: the cluster "
                                 "file's gateway, with --model naming the model it routes to)")
    r.add_argument("--topology", help="topology name to record (what reports compare by)")
    r.add_argument("--label", help="name to compare this run by (default: topology, else the URL)")
    r.add_argument("--recipe", help="recipe name or file to record as provenance")
    r.add_argument("--kv-metrics", action="append", default=[], metavar="URL",
                   help="a server that receives the KV cache (disagg's decode side, e.g. http://10.0.0.2:8000): "
                        "each level records what crossed the connector (repeatable; `bench matrix` does it itself)")
    _sweep_options(r)
    r.set_defaults(func=run)
    _register_matrix(sub)
    _register_results(sub)


def _register_matrix(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    m = sub.add_parser("matrix", help="launch, sweep and stop each topology in turn")
    m.add_argument("--recipe", required=True, help="recipe name or file")
    m.add_argument("--topologies",
                   help="comma-separated: solo, cluster-tp2, 2x-solo[-shuffle|-least-busy|-vllm-router], disagg "
                        "(default: those of solo,cluster-tp2,2x-solo-shuffle,2x-solo-least-busy,disagg the recipe "
                        "supports; with --endpoints, the topologies it names)")
    m.add_argument("--endpoints", help="already-running endpoints instead of launching: topo=URL,topo=URL")
    m.add_argument("--demo", action="store_true",
                   help="start a simulated two-node GB10 cluster and run the matrix on it (figures in simulated time; "
                        f"results default to {DEMO_RESULTS})")
    m.add_argument("--speed", type=float, metavar="F",
                   help=f"with --demo: simulated clock speed relative to real time (default {DEMO_SPEED:g})")
    m.add_argument("--force", action="store_true", help="launch although preflight refuses (never a blocking rule)")
    m.add_argument("--trust", action="store_true", help="run the recipe's pre_exec and mods that `recipe plan` "
                   "lists under 'needs confirmation'")
    m.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="recipe placeholder value for every launch, e.g. --set max_num_batched_tokens=16384")
    m.add_argument("--verbose", "-v", action="store_true", help="print every launch step, not only readiness")
    m.add_argument("--keep-last", action="store_true",
                   help="leave the last topology serving once it is measured, instead of stopping it: end the list "
                        "with the one to serve and it is not loaded twice (stop it later with `recipe stop`)")
    _sweep_options(m)
    m.set_defaults(func=run)


def _register_results(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The actions on a results file: report, import, advise, list."""
    rep = sub.add_parser("report", help="markdown, CSV or llama-benchy JSON from a results file")
    rep.add_argument("file", help="results file")
    rep.add_argument("--format", choices=("md", "csv", "json"), default="md")
    rep.add_argument("--run", action="append", help="only this run id (repeatable; a prefix is enough)")
    rep.add_argument("--output", "-o", help="write to this file instead of stdout")
    rep.set_defaults(func=run)

    imp = sub.add_parser("import", help="llama-benchy JSON or a published table CSV into a results file")
    imp.add_argument("files", nargs="*", help="FILE.json (llama-benchy) or FILE.csv (published table)")
    imp.add_argument("--published", action="store_true", help="the bundled gpt-oss-120b topology study")
    imp.add_argument("--label", help="name for the imported run (default: the file name)")
    imp.add_argument("--results", default=DEFAULT_RESULTS, help=f"results file (default {DEFAULT_RESULTS})")
    imp.set_defaults(func=run)

    adv = sub.add_parser("advise", help="which topology wins decode, prefill and TTFT per concurrency band")
    adv.add_argument("file", help="results file")
    adv.add_argument("--run", action="append", help="only these run ids")
    adv.set_defaults(func=run)

    ls = sub.add_parser("list", help="runs in a results file")
    ls.add_argument("file", help="results file")
    ls.set_defaults(func=run)


async def _run(args: argparse.Namespace) -> int:
    from ..bench.matrix import recipe_hash
    from ..bench.measure import run_sweep
    from ..bench.results import ResultsStore
    from ..bench.sweep import check_reachable
    if not args.url:
        args.url = _gateway_url(args)
    spec = sweep_spec(args, args.url, topology=args.topology, label=args.label, recipe=args.recipe,
                 recipe_hash=recipe_hash(args.recipe) if args.recipe else None,
                 kv_metrics=tuple(_metrics_url(u) for u in args.kv_metrics))
    await check_reachable(args.url)      # nothing listening: one line, and no results file made for nothing
    line = ProgressLine(args.quiet)
    probe, monitor = await cluster_probe(args)
    try:
        with ResultsStore(args.results) as store:
            out = await run_sweep(spec, store, resume=args.resume, on_level=line.level, on_progress=line,
                                  thermal_probe=probe)
    finally:
        if monitor is not None:
            await monitor.stop()
    skipped = f", {len(out.skipped)} already done" if out.skipped else ""
    print(f"run {out.run_id}: {len(out.levels)} level(s) measured{skipped}; results in {args.results}"
          + (" (SIMULATED)" if out.provenance.get("simulated") else ""))
    if out.paused_after is not None:
        print(f"paused after failed level {out.paused_after}: {out.levels[-1].failure} — fix the endpoint, then "
              "run the same command with --resume")
        return 1
    return 0


def _gateway_url(args: argparse.Namespace) -> str:
    """No --url: the gateway's (launch/gateway.py), where --model picks the workload."""
    from ..clusterfile import cluster_for
    from ..launch.gateway import url
    via = url(cluster_for(args))
    if via is None:
        raise UserError("no --url, and the cluster file has no gateway", field="--url",
                        fix="give the server: --url http://IP:PORT, or add 'gateway: {port: 4100}' to the cluster file")
    if not args.model:
        raise UserError("through the gateway, --model names the model to sweep", field="--model",
                        fix="add --model NAME (one the gateway lists: sparkconsole recipe status)")
    return via


def _metrics_url(url: str) -> str:
    """A server's base URL or its /metrics page, as the operator gives it: the page."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise UserError(f"--kv-metrics {url!r} is not an http(s) URL", field="--kv-metrics",
                        fix="give the decode server's address, e.g. http://10.0.0.2:8000")
    return base if base.endswith("/metrics") else base + "/metrics"


def run(args: argparse.Namespace) -> int | Coroutine[Any, Any, int]:
    cmd = args.bench_command
    if cmd == "run":
        return _run(args)
    if cmd == "matrix":
        from .bench_matrix import matrix
        return matrix(args)
    if cmd == "report":
        from ..bench import report
        with existing_results(args.file) as store:
            text = {"md": report.markdown, "csv": report.csv_text, "json": report.json_text}[args.format](
                store, args.run)
        if args.output:
            Path(args.output).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
        return 0
    if cmd == "import":
        from ..bench.benchy_io import bundled_published_csv, import_file
        from ..bench.results import ResultsStore
        files = list(args.files) + ([str(bundled_published_csv())] if args.published else [])
        if not files:
            raise UserError("nothing to import", field="FILE", fix="pass a llama-benchy JSON file or --published")
        with ResultsStore(args.results) as store:
            for f in files:
                ids = import_file(store, f, label=args.label)
                print(f"{f}: {len(ids)} run(s) in {args.results}: {', '.join(ids)}")
        return 0
    if cmd == "advise":
        from ..bench.advisor import advise, markdown
        with existing_results(args.file) as store:
            levels = ([lv for r in args.run for lv in store.levels(store.run(r).run_id)] if args.run
                      else store.levels())
        sys.stdout.write(markdown(advise(levels)))
        return 0
    if cmd == "list":
        with existing_results(args.file) as store:
            for r in store.runs():
                n = len(store.finished_keys(r.run_id))
                state = "finished" if r.finished else "unfinished"
                print(f"{r.run_id}  {r.source:12} {r.label:28} {r.model or '?':24} {n:3} level(s)  {state}"
                      + ("  SIMULATED" if r.simulated else ""))
        return 0
    raise UserError(f"unknown bench action {cmd!r}", fix="see `sparkconsole bench --help`")
