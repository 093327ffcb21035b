"""`sparkconsole demo`: a simulated two-node GB10 cluster serving a model, and the console on it.

    sparkconsole demo [--speed F] [--topology 2x-solo|solo|cluster-tp2|none] [--router NAME] [--load C]
    sparkconsole demo --headless [--duration S]      # start everything, print the endpoints as JSON

spark1 (127.0.0.2) and spark2 (127.0.0.3) run the real agent over the local transport against simulated
GPUs, /proc trees and docker; the model is started through each node's docker shim with the commands a
recipe plan sends. Everything lives in a temporary directory removed at exit. Every figure shown is in
simulated time; `--speed F` runs that clock F times faster than real time.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from ..errors import UserError
from . import LazyChoices

if TYPE_CHECKING:      # the simulator is imported in run(): `demo --bad` and `--help` answer at once
    from ..sim.cluster import SimCluster

TOPOLOGIES = LazyChoices("sparkconsole.sim.cluster", "TOPOLOGIES")
ROUTERS = LazyChoices("sparkconsole.sim.cluster", "ROUTERS")

# Demo-only: weights "load" this much faster than the simulated disk would, so numbers appear at once.
DEMO_LOAD_SPEEDUP = 20.0
# The model starts once a node reading is on screen, or after this long whatever the console is doing.
NODES_FIRST_MAX_S = 5.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="a simulated two-node GB10 cluster with a model served, in the console",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    if not 0.01 <= args.speed <= 1000:
        raise UserError(f"speed {args.speed} out of range", field="--speed", fix="give 0.01 to 1000 (1 = real time)")
    if args.duration is not None and args.duration <= 0:
        raise UserError(f"duration {args.duration} must be positive", field="--duration", fix="give seconds, e.g. 30")
    if not 0 <= args.load <= 256:
        raise UserError(f"load {args.load} out of range", field="--load", fix="give 0 to 256 concurrent requests")


def describe(sim: SimCluster) -> dict:
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

    from ..sim.cluster import Serving, SimCluster

    _check(args)
    sim = SimCluster(speed=args.speed, serving=Serving(topology=args.topology, router=args.router),
                     load_speedup=DEMO_LOAD_SPEEDUP)
    tasks: list[asyncio.Task] = []
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
        if args.load and sim.cluster.endpoints:
            tasks.append(asyncio.create_task(sim.run_load(concurrency=args.load, seconds=None)))
        print(json.dumps(describe(sim)), flush=True)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), args.duration)
        return 0
    finally:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await sim.stop()


async def _bring_up(sim: SimCluster, args: argparse.Namespace, say, after=None) -> None:
    """The topology, then the load, behind an already running console; `say(line, style)` reports each step.
    `after`: awaited first (the nodes on screen), so the model's processes do not compete with the first frame
    and the first readings for the machine's cores."""
    if after is not None:
        await after
    try:
        await sim.serve(progress=lambda line: say(line, "cyan"))
    except UserError as err:
        say(f"simulated serving failed: {err}", "red")
        return
    if args.load and sim.cluster.endpoints:
        say(f"load: {args.load} streaming requests kept in flight", "cyan")
        await sim.run_load(concurrency=args.load, seconds=None)


class _Notes:
    """Bring-up lines into the console's event log; lines from before the first frame wait for it."""

    def __init__(self, app) -> None:
        self.app = app
        self.pending: list[tuple[str, str]] = []
        self._flusher = None

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


async def _nodes_shown(app) -> None:
    """Until the console has drawn its first frame and holds a reading of a node (or NODES_FIRST_MAX_S)."""
    import asyncio

    deadline = time.monotonic() + NODES_FIRST_MAX_S
    while time.monotonic() < deadline:
        mon = app.monitor
        if app.first_frame_at is not None and mon is not None and any(nm.last for nm in mon.nodes.values()):
            return
        await asyncio.sleep(0.05)


def console_app(sim: SimCluster, args: argparse.Namespace, tasks: list):
    """The console on a cluster whose nodes are up (sim.start_nodes()): the bring-up of the model, router and
    load is added to `tasks`; it starts once a node reading is on screen, each endpoint is polled once it serves."""
    import asyncio

    from ..tui.app import SparkConsoleApp

    def staged(cluster):
        from ..sim.staged import StagedServing
        return StagedServing(cluster, sim.ready)

    app = SparkConsoleApp(sim.cluster, simulated=True, sim=sim, serving_factory=staged)
    tasks.append(asyncio.create_task(_bring_up(sim, args, _Notes(app).say, _nodes_shown(app))))
    return app


async def _console(sim: SimCluster, args: argparse.Namespace, tasks: list) -> int:
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
