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
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from ..paths import DEFAULT_RESULTS, DEMO_RESULTS

if TYPE_CHECKING:      # the benchmark code is imported in the functions: `bench --help` answers at once
    from ..bench.matrix import Launcher, MatrixOutcome, StaticLauncher
    from ..bench.results import LevelResult, ResultsStore, ThermalNote
    from ..bench.sweep import Progress, SweepSpec
    from ..launch import progress as launch_progress
    from ..launch.lint import Finding
    from ..nodes.monitor import ClusterMonitor
    from ..sim.cluster import SimCluster

    ThermalProbe = Callable[[], ThermalNote | None]

# (args) -> bench.matrix.Launcher: replaces the recipe runner's launcher (tests, embedding); None: RecipeLauncher.
launcher_factory: Callable[[argparse.Namespace], Launcher] | None = None
DEMO_SPEED = 10.0
DEMO_LOAD_SPEEDUP = 1000.0      # the demo's weights "load" in a moment: the matrix is about serving


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


def _spec(args: argparse.Namespace, url: str, **extra: Any) -> SweepSpec:
    from ..bench.sweep import SweepSpec
    return SweepSpec(url=url, model=args.model, pp=args.pp, tg=args.tg, depth=args.depth,
                     concurrency=args.concurrency, runs=args.runs, warmup=not args.no_warmup,
                     latency_mode=args.latency_mode, exact_tg=not args.no_exact_tg, token_ids=not args.no_token_ids,
                     stall_timeout=args.stall_timeout, first_timeout=args.first_timeout,
                     on_failure=args.on_failure, pace=args.pace, **extra)


class _ProgressLine:
    """One progress line on stderr: rewritten in place on a terminal, one line per update otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.width = 0

    def __call__(self, p: Progress) -> None:
        self.text(p.line())

    def text(self, line: str) -> None:
        if self.quiet:
            return
        if self.tty:
            sys.stderr.write("\r" + line.ljust(self.width))
            self.width = len(line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def level(self, lv: LevelResult) -> None:
        if self.quiet:
            return
        if self.tty:
            sys.stderr.write("\r" + " " * self.width + "\r")
            self.width = 0
        d, p, t = lv.decode_tps, lv.prefill_tps, lv.ttft_ms
        bad = lv.metrics.get("requests_failed") or 0

        def fmt(v: float | None, f: str) -> str:
            return "—" if v is None else f.format(v)
        sys.stderr.write(f"{lv.label}: {lv.key}  decode {fmt(d, '{:.1f}')} t/s  prefill {fmt(p, '{:.0f}')} t/s  "
                         f"TTFT {fmt(t, '{:.0f}')} ms" + (f"  failed {bad}" if bad else "") + "\n")
        sys.stderr.flush()


def _thermal_probe(monitor: ClusterMonitor) -> ThermalProbe:
    """For sweeps: the watched nodes' hottest GPU and noted clock-event reasons, as a ThermalNote."""
    from ..bench.results import ThermalNote
    from ..nodes.thermal import cluster_reading

    def probe() -> ThermalNote | None:
        r = cluster_reading(monitor.nodes.values())
        return None if r is None else ThermalNote(r.max_temp_c, r.throttle_reasons)
    return probe


async def _cluster_probe(args: argparse.Namespace) -> tuple[ThermalProbe | None, ClusterMonitor | None]:
    """With an explicit --cluster, watch its nodes during the sweep; returns (probe, monitor) or (None, None)."""
    if not getattr(args, "cluster", None):
        return None, None
    from ..clusterfile import cluster_for
    from ..nodes.monitor import ClusterMonitor
    monitor = ClusterMonitor(cluster_for(args))
    await monitor.start()
    await monitor.wait_first_ticks(10.0)
    return _thermal_probe(monitor), monitor


async def _run(args: argparse.Namespace) -> int:
    from ..bench.matrix import recipe_hash
    from ..bench.measure import run_sweep
    from ..bench.results import ResultsStore
    from ..bench.sweep import check_reachable
    if not args.url:
        args.url = _gateway_url(args)
    spec = _spec(args, args.url, topology=args.topology, label=args.label, recipe=args.recipe,
                 recipe_hash=recipe_hash(args.recipe) if args.recipe else None,
                 kv_metrics=tuple(_metrics_url(u) for u in args.kv_metrics))
    await check_reachable(args.url)      # nothing listening: one line, and no results file made for nothing
    line = _ProgressLine(args.quiet)
    probe, monitor = await _cluster_probe(args)
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


def _topologies(args: argparse.Namespace) -> list[str]:
    if args.topologies is None:
        from ..bench.matrix import MATRIX_TOPOLOGIES
        if args.endpoints:
            return list(dict.fromkeys(item.partition("=")[0].strip() for item in args.endpoints.split(",")))
        if launcher_factory is not None:
            return list(MATRIX_TOPOLOGIES)
        from ..launch.launcher import resolve_topology
        from ..recipes import find_recipe
        supported = find_recipe(args.recipe).topologies
        return [t for t in MATRIX_TOPOLOGIES if resolve_topology(t)[0] in supported]
    topologies = [t.strip() for t in args.topologies.split(",") if t.strip()]
    if not topologies:
        raise UserError("no topologies", field="--topologies", fix="e.g. --topologies solo,cluster-tp2")
    if len(set(topologies)) != len(topologies):
        raise UserError("a topology is named twice", field="--topologies", fix="name each topology once")
    return topologies


def _static_launcher(text: str) -> StaticLauncher:
    from ..bench.matrix import StaticLauncher
    urls: dict[str, str] = {}
    for item in text.split(","):
        topo, sep, url = item.partition("=")
        if not sep or not url.strip():
            raise UserError(f"bad entry {item!r}", field="--endpoints", fix="use topo=URL,topo=URL")
        urls[topo.strip()] = url.strip()
    return StaticLauncher(urls)


def _launch_printer(args: argparse.Namespace, line: _ProgressLine
                    ) -> tuple[Callable[[launch_progress.Progress], None], Callable[[Finding], None]]:
    """Runner progress and preflight findings as progress lines: readiness and failures, every step with -v."""
    shown = {"ready", "failed", "info"} | ({"step", "stopped"} if args.verbose else set())

    def progress(ev: launch_progress.Progress) -> None:
        if ev.stage in shown:
            line.text(f"  {ev.node}: {ev.message}")

    def finding(f: Finding) -> None:
        if f.severity != "warn" or args.verbose or f.rule == "least_busy_identical":
            line.text("  " + f.line())
    return progress, finding


def _demo_nodes() -> tuple[tuple[str, str], ...]:
    """Two loopback addresses whose router and server ports are free (a demo may already run on .2/.3)."""
    import socket
    for third in range(0, 250):
        base = f"127.0.{third}"
        ok = True
        for host in (base + ".2", base + ".3"):
            for port in (4000, 8000):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sk:
                    try:
                        sk.bind((host, port))
                    except OSError:
                        ok = False
        if ok:
            return (("spark1", base + ".2"), ("spark2", base + ".3"))
    raise UserError("no free loopback address pair for the simulated cluster", field="--demo",
                    fix="stop other demos (ports 4000 and 8000 on 127.0.x.2/.3)")


def _check_matrix_args(args: argparse.Namespace) -> None:
    if args.speed is not None and not args.demo:
        raise UserError("--speed sets the simulated clock", field="--speed", fix="use it with --demo")
    if args.demo and (args.endpoints or getattr(args, "cluster", None)):
        raise UserError("--demo runs on its own simulated cluster", field="--demo",
                        fix="drop --endpoints/--cluster, or drop --demo")
    if args.keep_last and (args.demo or args.endpoints):
        what = "the simulated cluster ends with the command" if args.demo else "--endpoints launches nothing"
        raise UserError(f"--keep-last leaves a launch serving, but {what}", field="--keep-last",
                        fix="drop --keep-last, or run the matrix on your cluster's nodes")


def _print_kept(args: argparse.Namespace, kept: tuple[str, str]) -> None:
    import shlex

    from ..launch.launcher import resolve_topology
    topo, url = kept
    cluster = ["--cluster", args.cluster] if getattr(args, "cluster", None) else []
    stop = ["sparkconsole", *cluster, "recipe", "stop", args.recipe, "-T", resolve_topology(topo)[0]]
    print(f"{topo} left serving at {url} (--keep-last); stop it with: {shlex.join(stop)}")


class _MatrixParts:
    """What a matrix run starts before it measures (a simulated cluster, the node monitor, the launcher), kept as each
    starts so that whatever did start is stopped, also when a later part fails."""

    def __init__(self) -> None:
        self.sim: SimCluster | None = None
        self.monitor: ClusterMonitor | None = None
        self.launcher: Launcher | None = None
        self.probe: ThermalProbe | None = None

    async def close(self) -> None:
        try:
            if self.launcher is not None and hasattr(self.launcher, "close"):
                await self.launcher.close()
        finally:
            if self.monitor is not None:
                await self.monitor.stop()
            if self.sim is not None:
                await self.sim.stop()


async def _recipe_launcher(args: argparse.Namespace, topologies: list[str], speed: float, line: _ProgressLine,
                           parts: _MatrixParts) -> None:
    """The recipe's launches on the cluster file's nodes, or with --demo on a simulated pair started here."""
    from ..launch.launcher import RecipeLauncher, resolve_topology
    from ..nodes.monitor import ClusterMonitor
    from ..recipes import find_recipe
    from .recipe import load_cluster_for
    from .recipe_io import overrides_from_sets
    find_recipe(args.recipe)                      # wrong names fail before anything starts
    for topo in topologies:
        resolve_topology(topo)
    overrides = overrides_from_sets(args.sets)
    if args.demo:
        from ..sim.cluster import Serving, SimCluster
        from ..sim.node import NodeTuning
        nodes = _demo_nodes()
        line.text(f"starting a simulated cluster: {nodes[0][0]} {nodes[0][1]}, {nodes[1][0]} {nodes[1][1]} "
                  f"(speed ×{speed:g}, figures in simulated time)")
        # Both nodes carry the published OOM guards: a cluster prepared for benchmarking.
        parts.sim = sim = SimCluster(speed=speed, serving=Serving(topology="none"), nodes=nodes,
                                     load_speedup=DEMO_LOAD_SPEEDUP,
                                     tunings={name: NodeTuning.hardened() for name, _ in nodes})
        await sim.start()
        line.text(f"simulated cluster up (state in {sim.root}; removed at the end)")
        assert sim.cluster is not None and sim.root is not None      # start() made them
        cluster = sim.cluster
        overrides.setdefault("router_dir", str(sim.root / "routers"))
    else:
        cluster = load_cluster_for(args)
    parts.monitor = monitor = ClusterMonitor(cluster, history=4)
    await monitor.start()
    await monitor.wait_first_ticks(10.0)
    parts.probe = _thermal_probe(monitor)
    on_progress, on_finding = _launch_printer(args, line)
    parts.launcher = RecipeLauncher(cluster, monitor=monitor, overrides=overrides, force=args.force,
                                    trust=args.trust, poll_interval=0.5 if args.demo else 1.0,
                                    on_progress=on_progress, on_finding=on_finding)


async def _matrix(args: argparse.Namespace) -> int:
    from ..bench.matrix import run_matrix
    from ..bench.results import ResultsStore
    topologies = _topologies(args)
    _check_matrix_args(args)
    speed = DEMO_SPEED if args.speed is None else args.speed
    if args.demo and args.results == DEFAULT_RESULTS:
        args.results = DEMO_RESULTS
    if args.demo and not 0.01 <= speed <= 1000:
        raise UserError(f"speed {speed:g} out of range", field="--speed", fix="give 0.01 to 1000 (1 = real time)")
    line = _ProgressLine(args.quiet)
    template = _spec(args, "http://unset.invalid")
    parts = _MatrixParts()
    try:
        if args.endpoints:
            parts.launcher = _static_launcher(args.endpoints)
        elif launcher_factory is not None:
            parts.launcher = launcher_factory(args)
        if parts.launcher is not None:          # running endpoints (or a test's launcher): the nodes only watched
            parts.probe, parts.monitor = await _cluster_probe(args)
        else:
            await _recipe_launcher(args, topologies, speed, line, parts)
        assert parts.launcher is not None
        with ResultsStore(args.results) as store:
            out = await run_matrix(args.recipe, topologies, parts.launcher, template, store, resume=args.resume,
                                   simulated=bool(args.demo), speed=speed if args.demo else 1.0,
                                   thermal_probe=parts.probe, on_level=line.level, on_progress=line,
                                   on_status=line.text, keep_last=args.keep_last)
    finally:
        await parts.close()
    return _matrix_report(args, out)


def _matrix_report(args: argparse.Namespace, out: MatrixOutcome) -> int:
    """What the matrix measured, skipped and failed, the topologies side by side, what it left serving; the exit
    status (1 when a topology failed or the run paused)."""
    print(f"measured {len(out.measured)}, skipped {len(out.skipped)}, failed {len(out.failed)}; "
          f"results in {args.results}" + (" (SIMULATED)" if args.demo else ""))
    for topo, why in out.failed.items():
        print(f"  {topo}: {why}")
    if out.run_ids:
        _print_comparison(args.results, list(out.run_ids.values()))
    if out.kept is not None:
        _print_kept(args, out.kept)
    if out.paused is not None:
        print(f"paused at {out.paused} — fix the endpoint, then run the same command with --resume")
        return 1
    return 1 if out.failed else 0


def _print_comparison(results: str, run_ids: list[str]) -> None:
    """The matrix's own runs side by side, and the advisor's verdict on them (`bench report`/`advise` of them)."""
    from ..bench.advisor import advise, markdown
    from ..bench.report import comparison_markdown
    with _existing(results) as store:
        levels = [lv for r in run_ids for lv in store.levels(r)]
    sys.stdout.write("\n" + comparison_markdown(levels) + "\n" + markdown(advise(levels)))


def _existing(path: str) -> ResultsStore:
    from ..bench.results import ResultsStore
    if not Path(path).is_file():
        raise UserError("file not found", file=path, fix="pass a results file written by `sparkconsole bench run`")
    return ResultsStore(path)


def run(args: argparse.Namespace) -> int | Coroutine[Any, Any, int]:
    cmd = args.bench_command
    if cmd == "run":
        return _run(args)
    if cmd == "matrix":
        return _matrix(args)
    if cmd == "report":
        from ..bench import report
        with _existing(args.file) as store:
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
        with _existing(args.file) as store:
            levels = ([lv for r in args.run for lv in store.levels(store.run(r).run_id)] if args.run
                      else store.levels())
        sys.stdout.write(markdown(advise(levels)))
        return 0
    if cmd == "list":
        with _existing(args.file) as store:
            for r in store.runs():
                n = len(store.finished_keys(r.run_id))
                state = "finished" if r.finished else "unfinished"
                print(f"{r.run_id}  {r.source:12} {r.label:28} {r.model or '?':24} {n:3} level(s)  {state}"
                      + ("  SIMULATED" if r.simulated else ""))
        return 0
    raise UserError(f"unknown bench action {cmd!r}", fix="see `sparkconsole bench --help`")
