"""`sparkconsole demo`: a simulated two-node GB10 cluster serving a model, and the console on it.

    sparkconsole demo [--speed F] [--topology 2x-solo|solo|cluster-tp2|none] [--router NAME] [--load C]
    sparkconsole demo --headless [--duration S]      # start everything, print the endpoints as JSON
    sparkconsole demo --runaway memory|thermal|link[:NODE]   # and a runaway on one node once the model serves
    sparkconsole demo --topology solo --also llama-3.1-8b    # two models: the 120B and a small one beside it

spark1 (127.0.0.2) and spark2 (127.0.0.3) run the real agent over the local transport against simulated
GPUs, /proc trees and docker; the model is started through each node's docker shim with the commands a
recipe plan sends. Everything lives in a temporary directory removed at exit. Every figure shown is in
simulated time; `--speed F` runs that clock F times faster than real time.

`--runaway KIND[:NODE]` starts a runaway on NODE (default: spark1 for solo, else spark2) {after} seconds
after the model serves: `memory` (the vLLM process's GPU memory grows, its container's cap does not see it, and
the console's guard stops the container before the node freezes), `thermal` (cooling fails, the GPU heats to
shutdown), `link` (the node is cut off). The console warns, then writes the post-mortem.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .. import paths
from ..errors import UserError
from . import LazyChoices

if TYPE_CHECKING:      # the simulator is imported in run(): `demo --bad` and `--help` answer at once
    import asyncio

    from ..config import ClusterConfig
    from ..sim.cluster import Serving, SimCluster
    from ..sim.runaway import Runaway
    from ..sim.staged import StagedServing
    from ..tui.app import SparkConsoleApp

    Say = Callable[[str, str], None]        # (line, style)

TOPOLOGIES = LazyChoices("sparkconsole.sim.cluster", "TOPOLOGIES")
ROUTERS = LazyChoices("sparkconsole.sim.cluster", "ROUTERS")

# Demo-only: weights "load" this much faster than the simulated disk would, so numbers appear at once.
DEMO_LOAD_SPEEDUP = 20.0
# The model starts once a node reading is on screen, or after this long whatever the console is doing.
NODES_FIRST_MAX_S = 5.0
# --runaway starts this long (real seconds) after the model serves.
RUNAWAY_AFTER_S = 5.0
# What the demo serves is this bundled recipe (its containers carry its labels): the recipes screen shows it running.
DEMO_RECIPE = "gpt-oss-120b"
RUNAWAYS = ("memory", "thermal", "link")     # sim/runaway.py KINDS (not imported: `demo --bad` answers at once)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("demo", help="a simulated two-node GB10 cluster with a model served, in the console",
                              description=__doc__.replace("{after}", f"{RUNAWAY_AFTER_S:g}"),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speed", type=float, default=1.0, metavar="F",
                   help="simulated clock speed relative to real time (default 1)")
    p.add_argument("--topology", default="2x-solo", choices=TOPOLOGIES, metavar="TOPOLOGY",
                   help="%(choices)s: what is served at start (default: gpt-oss-120b, 2x solo behind the router)")
    p.add_argument("--router", default="litellm-simple-shuffle", choices=ROUTERS, metavar="ROUTER",
                   help="router in front of 2x-solo: %(choices)s (default litellm-simple-shuffle)")
    p.add_argument("--load", type=int, default=4, metavar="C",
                   help="concurrent streaming requests kept running so the dashboard moves (0: idle; default 4)")
    p.add_argument("--headless", action="store_true", help="no console: print the endpoints as JSON and keep "
                   "running until Ctrl-C or --duration")
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds of real time")
    p.add_argument("--runaway", metavar="KIND[:NODE]",
                   help=f"start a runaway on one node {RUNAWAY_AFTER_S:g} s after the model serves: memory (its GPU "
                   "memory grows until the guard stops it), thermal (it shuts down) or link (it is cut off); NODE "
                   "defaults to spark1 for solo, else spark2")
    p.add_argument("--also", metavar="RECIPE",
                   help="once the model serves, launch this recipe beside it (solo, placed against each node's "
                        "memory budget as `recipe launch` places it), e.g. llama-3.1-8b with --topology solo")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    if not 0.01 <= args.speed <= 1000:
        raise UserError(f"speed {args.speed} out of range", field="--speed", fix="give 0.01 to 1000 (1 = real time)")
    if args.duration is not None and args.duration <= 0:
        raise UserError(f"duration {args.duration} must be positive", field="--duration", fix="give seconds, e.g. 30")
    if not 0 <= args.load <= 256:
        raise UserError(f"load {args.load} out of range", field="--load", fix="give 0 to 256 concurrent requests")
    if args.runaway is not None:
        kind = args.runaway.partition(":")[0]
        if kind not in RUNAWAYS:
            raise UserError(f"unknown runaway {kind!r}", field="--runaway",
                            fix="give memory, thermal or link, optionally :NODE (e.g. memory:spark2)")


def demo_serving(topology: str = "2x-solo", router: str = "litellm-simple-shuffle") -> Serving:
    """What the demo serves: the demo recipe's model, answering to the recipe's served name as well (its plan's
    readiness check and restart look for that name)."""
    from ..recipes import find_recipe
    from ..sim.cluster import Serving
    name = find_recipe(DEMO_RECIPE).defaults.get("served_model_name")
    return Serving(topology=topology, router=router, recipe=DEMO_RECIPE, served_names=(str(name),) if name else ())


def runaway_target(sim: SimCluster, spec: str) -> tuple[str, str]:
    """(kind, node) of --runaway KIND[:NODE]; the node checked against the cluster's."""
    kind, _, node = spec.partition(":")
    names = [n for n, _ in sim.node_specs]
    if not node:
        node = names[0] if sim.serving.topology == "solo" or len(names) < 2 else names[-1]
    if node not in names:
        raise UserError(f"no simulated node {node!r}", field="--runaway", fix="name one of " + ", ".join(names))
    return kind, node


async def start_runaway(sim: SimCluster, kind: str, node: str, say: Callable[[str, str | None], None],
                        after_s: float = RUNAWAY_AFTER_S) -> Runaway:
    """The runaway, `after_s` seconds from now (the model serving); `say(line, outcome)` hears each step (`outcome`
    on the last: frozen, shutdown, cut, or averted when the container was stopped in time). Returns it."""
    import asyncio

    say(f"{kind} runaway on {node} in {after_s:g} s (SIMULATED)", None)
    await asyncio.sleep(after_s)
    started: list[Runaway] = []
    rw = sim.runaway(node, kind, say=lambda line: say(line, started[0].outcome if started else None))
    started.append(rw)
    return rw


async def watch_headless(sim: SimCluster, emit: Callable[[dict[str, Any]], None]) -> Callable[[], Awaitable[None]]:
    """What the console runs below its dashboard — monitor, flight recorder, alerts, the exhaustion warning (and the
    guard, if the cluster asks for it) and post-mortems — for `demo --headless --runaway`: `emit(dict)` gets each
    alert and post-mortem. Returns the coroutine function that stops it."""
    from ..collector.core import Collector
    from ..collector.roles import DEMO, monitor_for

    cluster = sim.cluster
    assert cluster is not None          # the cluster serves (sim.start())
    core = Collector(cluster, DEMO, monitor_for(cluster, attach=False),
                     say=lambda text, sev: emit({"guard": text, "severity": sev}) if "guard" in text else None)
    core.alerts.subscribe(lambda a: emit({"alert": a.key, "severity": a.severity, "active": a.active,
                                          "message": a.message}))
    core.records_to(on_postmortem=lambda pm: emit({"postmortem": pm["node"], "verdict": pm["verdict"],
                                                   "evidence": pm["evidence"]}))
    await core.start()
    return core.stop


def describe(sim: SimCluster) -> dict[str, Any]:
    assert sim.cluster is not None
    return {
        "simulated": True, "speed": sim.speed, "state_dir": str(sim.root),
        "topology": sim.serving.topology, "model": sim.serving.model,
        "nodes": [{"name": n.name, "address": n.address, "role": n.role, "vllm_port": n.vllm_port,
                   "agent_args": list(n.agent_args), "dir": str(sim.node_dir(n.name))} for n in sim.cluster.nodes],
        "endpoints": [{"name": e.name, "url": e.url, "kind": e.kind, "node": e.node} for e in sim.cluster.endpoints],
    }


async def run(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib
    import json
    import signal

    from ..sim.cluster import SimCluster

    _check(args)
    sim = SimCluster(speed=args.speed, serving=demo_serving(args.topology, args.router),
                     load_speedup=DEMO_LOAD_SPEEDUP)
    if args.runaway is not None:
        args.runaway_target = runaway_target(sim, args.runaway)
    tasks: list[asyncio.Task[Any]] = []
    stop_watch: Callable[[], Awaitable[None]] | None = None
    try:
        if not args.headless:
            # Nodes first: they are up in tens of milliseconds and the console shows them at once; the model,
            # the router and the load come up behind the dashboard, each noted as it does.
            await sim.start_nodes()
            return await _console(sim, args, tasks)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await sim.start()           # headless: the endpoints are printed once they serve
        assert sim.cluster is not None
        if args.load and sim.cluster.endpoints:
            tasks.append(asyncio.create_task(sim.run_load(concurrency=args.load, seconds=None)))
        info = describe(sim)
        if args.runaway is not None:
            kind, node = args.runaway_target
            info["runaway"] = {"kind": kind, "node": node, "after_s": RUNAWAY_AFTER_S}
        print(json.dumps(info), flush=True)
        if args.runaway is not None:
            # After the description, one JSON line per step of the runaway, and per alert and post-mortem of the
            # console's own rules watching the cluster.
            def emit(d: dict[str, Any]) -> None:
                print(json.dumps({"simulated": True, "time": round(time.time(), 3), **d}), flush=True)
            stop_watch = await watch_headless(sim, emit)

            def say(line: str, outcome: str | None) -> None:
                emit({"runaway": kind, "node": node, "note": line, "outcome": outcome})
            tasks.append(asyncio.create_task(start_runaway(sim, kind, node, say)))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), args.duration)
        return 0
    finally:
        if stop_watch is not None:
            await stop_watch()
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await sim.stop()


async def _bring_up(sim: SimCluster, args: argparse.Namespace, say: Say,
                    after: Awaitable[None] | None = None) -> None:
    """The topology, then the load, behind an already running console; `say(line, style)` reports each step.
    `after`: awaited first (the nodes on screen), so the model's processes do not compete with the first frame
    and the first readings for the machine's cores. With --runaway, the runaway follows the model."""
    import asyncio

    if after is not None:
        await after
    try:
        await sim.serve(progress=lambda line: say(line, "cyan"))
    except UserError as err:
        say(f"simulated serving failed: {err}", "red")
        return
    jobs: list[Awaitable[object]] = []
    assert sim.cluster is not None          # its nodes are up (sim.start_nodes())
    if args.load and sim.cluster.endpoints:
        say(f"load: {args.load} streaming requests kept in flight", "cyan")
        jobs.append(sim.run_load(concurrency=args.load, seconds=None))
    if getattr(args, "also", None):
        try:
            await launch_also(sim, args.also, lambda line: say(line, "cyan"))
        except UserError as err:
            say(f"{args.also} not launched: {err}", "red")
    if getattr(args, "runaway_target", None):
        kind, node = args.runaway_target
        colour: dict[str | None, str] = {None: "yellow", "averted": "green"}
        jobs.append(start_runaway(sim, kind, node, lambda line, outcome: say(line, colour.get(outcome, "red"))))
    await asyncio.gather(*jobs)


async def launch_also(sim: SimCluster, key: str, say: Callable[[str], None]) -> None:
    """A second workload beside what the demo serves, through the real path: placed against each simulated node's
    budget (placement/), planned with its own port and containers, launched by the recipe runner."""
    from ..launch.beside import Readings, estimator_for, launch_options, place, start_monitor
    from ..launch.plan import make_plan
    from ..launch.runner import Runner
    from ..placement.fit import Ask
    from ..recipes import find_recipe

    assert sim.cluster is not None          # its nodes are up (sim.start_nodes())
    recipe = find_recipe(key)
    monitor = await start_monitor(sim.cluster)
    try:
        readings = Readings(sim.cluster, monitor.nodes)
        ask = Ask(key, recipe, "solo", {"workload": key})
        placement = place(readings, [ask], estimator=await estimator_for(recipe, make_plan(recipe, "solo", sim.cluster,
                                                                                           {"workload": key}),
                                                                        monitor.nodes))
        choice = placement.choice(key)
        say(f"{key}: {choice.reason}; free after it: "
            + ", ".join(f"{n} {v / 2 ** 30:.1f} GiB" for n, v in choice.free_after.items() if v is not None))
        plan = make_plan(recipe, "solo", sim.cluster, {"workload": key, **launch_options(placement, key)})
        transports = {n: nm.transport for n, nm in monitor.nodes.items() if nm.transport is not None}
        await Runner(sim.cluster, transports).launch(plan)
        say(f"{key} serves at {plan.endpoint} as {plan.model}")
    finally:
        await monitor.stop()


class _Notes:
    """Bring-up lines into the console's event log; lines from before the first frame wait for it."""

    def __init__(self, app: SparkConsoleApp) -> None:
        self.app = app
        self.pending: list[tuple[str, str]] = []
        self._flusher: asyncio.Task[None] | None = None

    def say(self, line: str, style: str = "") -> None:
        import asyncio

        if self.app.first_frame_at is not None and not self.pending:
            self._write(line, style)
            return
        self.pending.append((line, style))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        import asyncio

        while self.app.first_frame_at is None:
            await asyncio.sleep(0.05)
        pending, self.pending = self.pending, []
        for line, style in pending:
            self._write(line, style)

    def _write(self, line: str, style: str) -> None:
        self.app.dashboard.events.note(f"sim: {line}", style)
        if style == "red":
            self.app.notify(line, title="simulator", severity="error", timeout=30)


async def _nodes_shown(app: SparkConsoleApp) -> None:
    """Until the console has drawn its first frame and holds a reading of a node (or NODES_FIRST_MAX_S)."""
    import asyncio

    deadline = time.monotonic() + NODES_FIRST_MAX_S
    while time.monotonic() < deadline:
        mon = app.monitor
        if app.first_frame_at is not None and mon is not None and any(nm.last for nm in mon.nodes.values()):
            return
        await asyncio.sleep(0.05)


def console_app(sim: SimCluster, args: argparse.Namespace, tasks: list[asyncio.Task[Any]]) -> SparkConsoleApp:
    """The console on a cluster whose nodes are up (sim.start_nodes()): the bring-up of the model, router and
    load is added to `tasks`; it starts once a node reading is on screen, each endpoint is polled once it serves."""
    import asyncio

    from ..tui import heap
    heap.hold()     # no cycle collection until the console has drawn and settled its heap (tui/heap.py)
    try:
        from ..tui.app import SparkConsoleApp
    except ImportError:
        heap.unhold()
        raise

    def staged(cluster: ClusterConfig) -> StagedServing:
        from ..sim.staged import StagedServing
        return StagedServing(cluster, sim.ready)

    # The demo's state (audit log, collector lock) lives in the simulated cluster's own directory, removed at exit:
    # a simulated launch is never written to the operator's audit log. The flight recorder runs as on a live
    # cluster ([ / ] scrub back through it, post-mortems need it), into a file of its own in the operator's state
    # directory, kept: `sparkconsole postmortem NODE --demo` and `console --at … --demo` read it after the demo.
    assert sim.root is not None and sim.cluster is not None      # its nodes are up (sim.start_nodes())
    from ..recorder.feed import new_demo_recording
    recording = new_demo_recording()
    os.environ[paths.STATE_ENV] = str(sim.root / "state")
    app = SparkConsoleApp(sim.cluster, serving_factory=staged, record=True, recording=str(recording))
    tasks.append(asyncio.create_task(_bring_up(sim, args, _Notes(app).say, _nodes_shown(app))))
    return app


async def _console(sim: SimCluster, args: argparse.Namespace, tasks: list[asyncio.Task[Any]]) -> int:
    import asyncio

    try:
        app = console_app(sim, args, tasks)
    except ImportError:
        tasks.append(asyncio.create_task(_bring_up(sim, args, lambda line, style: print(line, flush=True))))
        return await _print_status(sim, args)
    if args.duration:
        asyncio.get_running_loop().call_later(args.duration, app.exit)
    await app.run_async()
    return int(app.return_code or 0)


async def _print_status(sim: SimCluster, args: argparse.Namespace) -> int:
    """Without the console: one status line per node every few seconds, from the real monitor."""
    import asyncio

    from ..nodes.monitor import ClusterMonitor
    assert sim.cluster is not None          # its nodes are up (sim.start_nodes())
    mon = ClusterMonitor(sim.cluster)
    await mon.start()
    deadline = None if args.duration is None else time.monotonic() + args.duration
    try:
        while deadline is None or time.monotonic() < deadline:
            await asyncio.sleep(2.0)
            for nm in mon.nodes.values():
                t = nm.last
                g = t.gpus[0] if t and t.gpus else None
                mem = t.mem if t else None
                print(f"{nm.name:<8} {nm.state.value:<10} "
                      + (f"{g.temp_c:.0f}°C {g.power_w:.0f} W {g.util_pct:.0f}% {' '.join(g.reasons)}" if g else "no GPU")
                      + (f"  avail {mem.headroom_gib:.1f} GiB" if mem and mem.headroom_gib is not None else ""),
                      flush=True)
    finally:
        await mon.stop()
    return 0
