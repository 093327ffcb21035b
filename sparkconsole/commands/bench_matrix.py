"""`sparkconsole bench matrix`: each topology launched through the recipe runner (or --endpoints already
running, or --demo on a simulated pair started for the run), swept, recorded and stopped in turn; then the
topologies side by side and the advisor's verdict."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from ..paths import DEFAULT_RESULTS, DEMO_RESULTS
from .bench_cli import ProgressLine, cluster_probe, existing_results, sweep_spec, watch_nodes

if TYPE_CHECKING:      # the benchmark code is imported in the functions: `bench --help` answers at once
    from ..bench.matrix import Launcher, MatrixOutcome, StaticLauncher
    from ..launch import progress as launch_progress
    from ..launch.lint import Finding
    from ..nodes.monitor import ClusterMonitor
    from ..recipes.model import Recipe
    from ..sim.cluster import SimCluster
    from .bench_cli import ThermalProbe

DEMO_SPEED = 10.0
DEMO_LOAD_SPEEDUP = 1000.0      # the demo's weights "load" in a moment: the matrix is about serving


def _topologies(args: argparse.Namespace) -> list[str]:
    if args.topologies is None:
        from ..bench.matrix import MATRIX_TOPOLOGIES
        if args.endpoints:
            return list(dict.fromkeys(item.partition("=")[0].strip() for item in args.endpoints.split(",")))
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


def _launch_printer(args: argparse.Namespace, line: ProgressLine
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


def _recipe_ports(recipe: Recipe, topologies: list[str], overrides: dict[str, Any]) -> tuple[int, ...]:
    """The ports the recipe's launches bind on a node as they name them: the server's (from --set, each swept
    topology's defaults, the recipe's defaults: every one a launch may take, launch/planning.py's node_port; 8000
    when none names one), the router's and the cluster rendezvous. A simulated pair for the matrix takes addresses
    where these are free (a demo may run on .2/.3)."""
    from ..launch.launcher import resolve_topology
    named = [overrides.get("port"), recipe.defaults.get("port"),
             *(recipe.topology_defaults.get(resolve_topology(t)[0], {}).get("port") for t in topologies)]
    servers = set()
    for port in (p for p in named if p is not None):
        with contextlib.suppress(TypeError, ValueError):     # not a number: the launch itself names file and field
            servers.add(int(port))
    return tuple(sorted({*(servers or {8000}), recipe.router.port, recipe.cluster.master_port}))


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


async def _recipe_launcher(args: argparse.Namespace, topologies: list[str], speed: float, line: ProgressLine,
                           parts: _MatrixParts) -> None:
    """The recipe's launches on the cluster file's nodes, or with --demo on a simulated pair started here."""
    from ..launch.launcher import RecipeLauncher, resolve_topology
    from ..recipes import find_recipe
    from .recipe import load_cluster_for
    from .recipe_io import overrides_from_sets
    recipe = find_recipe(args.recipe)             # wrong names fail before anything starts
    for topo in topologies:
        resolve_topology(topo)
    overrides = overrides_from_sets(args.sets)
    if args.demo:
        from ..sim.cluster import DEFAULT_NODES, Serving, SimCluster
        from ..sim.node import NodeTuning
        line.text(f"starting a simulated cluster (speed ×{speed:g}, figures in simulated time)")
        # Both nodes carry the published OOM guards: a cluster prepared for benchmarking.
        parts.sim = sim = SimCluster(speed=speed, serving=Serving(topology="none"), load_speedup=DEMO_LOAD_SPEEDUP,
                                     tunings={name: NodeTuning.hardened() for name, _ in DEFAULT_NODES},
                                     fixed_ports=_recipe_ports(recipe, topologies, overrides))
        await sim.start()
        nodes = ", ".join(f"{name} {addr}" for name, addr in sim.node_specs)
        line.text(f"simulated cluster up: {nodes} (state in {sim.root}; removed at the end)")
        assert sim.cluster is not None and sim.root is not None      # start() made them
        cluster = sim.cluster
        overrides.setdefault("router_dir", str(sim.root / "routers"))
    else:
        cluster = load_cluster_for(args)
    parts.probe, parts.monitor = await watch_nodes(cluster, history=4)
    monitor = parts.monitor
    on_progress, on_finding = _launch_printer(args, line)
    parts.launcher = RecipeLauncher(cluster, monitor=monitor, overrides=overrides, force=args.force,
                                    trust=args.trust, poll_interval=0.5 if args.demo else 1.0,
                                    on_progress=on_progress, on_finding=on_finding)


async def matrix(args: argparse.Namespace) -> int:
    from ..bench.matrix import run_matrix
    from ..bench.results import ResultsStore
    topologies = _topologies(args)
    _check_matrix_args(args)
    speed = DEMO_SPEED if args.speed is None else args.speed
    if args.demo and args.results == DEFAULT_RESULTS:
        args.results = DEMO_RESULTS
    if args.demo and not 0.01 <= speed <= 1000:
        raise UserError(f"speed {speed:g} out of range", field="--speed", fix="give 0.01 to 1000 (1 = real time)")
    line = ProgressLine(args.quiet)
    template = sweep_spec(args, "http://unset.invalid")
    parts = _MatrixParts()
    try:
        if args.endpoints:
            parts.launcher = _static_launcher(args.endpoints)
        if parts.launcher is not None:          # running endpoints: the nodes only watched
            parts.probe, parts.monitor = await cluster_probe(args)
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
    with existing_results(results) as store:
        levels = [lv for r in run_ids for lv in store.levels(r)]
    sys.stdout.write("\n" + comparison_markdown(levels) + "\n" + markdown(advise(levels)))
