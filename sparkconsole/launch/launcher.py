"""RecipeLauncher: launch a recipe in a topology through the recipe runner, hand back the URL to benchmark, stop it.

    launcher = RecipeLauncher(cluster)                 # a ClusterConfig (a cluster file, or a simulated cluster)
    url = await launcher.launch("gpt-oss-120b", "2x-solo-least-busy")   # plan, preflight, run, wait until ready
    await launcher.stop()                              # stop what that launch started (or release(): leave it up)
    await launcher.close()                             # end the node monitor and connections it opened

It is `bench.matrix.Launcher` by shape (duck-typed: launch knows nothing of the bench). Each launch is the same
path an operator's `sparkconsole recipe launch` takes: load the recipe, make_plan(recipe, topology, cluster,
overrides), preflight with facts read from the nodes (one telemetry tick each, image IDs), then Runner.launch
over the nodes' transports and readiness of every service. The URL is the router for 2x-solo and disagg, the
head's server for solo and cluster-tp2 (the plan's endpoint).

Matrix topology names carry the router: `2x-solo-shuffle` / `2x-solo-simple-shuffle`, `2x-solo-least-busy` and
`2x-solo-vllm-router` are the launch topology "2x-solo" with that router; `2x-solo` alone takes the recipe's.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..config import ClusterConfig, NodeConfig
from ..errors import UserError
from ..recipes import Recipe, find_recipe
from . import lint
from .ifaces import plan_links
from .plan import make_plan
from .probe import probe_nodes
from .progress import Progress
from .runner import READY_TIMEOUT_S, Runner
from .steps import Plan

FACTS_TIMEOUT_S = 15.0
SETTLE_TIMEOUT_S = 60.0      # the longest a preflight waits for a stopped server's memory to come back
SETTLE_WINDOW_S = 3.0
SETTLED_GIB = 1.0            # memory rising by less than this over SETTLE_WINDOW_S has come back

# matrix name -> (launch topology, plan options)
TOPOLOGY_NAMES: dict[str, tuple[str, dict[str, Any]]] = {
    "solo": ("solo", {}),
    "cluster-tp2": ("cluster-tp2", {}),
    "2x-solo": ("2x-solo", {}),
    "2x-solo-shuffle": ("2x-solo", {"router": "simple-shuffle"}),
    "2x-solo-simple-shuffle": ("2x-solo", {"router": "simple-shuffle"}),
    "2x-solo-least-busy": ("2x-solo", {"router": "least-busy"}),
    "2x-solo-vllm-router": ("2x-solo", {"router": "vllm-router"}),
    "disagg": ("disagg", {}),
}
# Preflight rules a matrix topology asks for by its very name: measuring least-busy over identical backends is
# the point of `2x-solo-least-busy` (the published study), so that refusal is shown as a warning there.
CHOSEN_BY_NAME: dict[str, frozenset[str]] = {"2x-solo-least-busy": frozenset({"least_busy_identical"})}


def resolve_topology(name: str) -> tuple[str, dict[str, Any]]:
    """A matrix topology name -> (launch topology, plan options such as the router)."""
    try:
        topo, opts = TOPOLOGY_NAMES[name]
    except KeyError:
        raise UserError(f"unknown topology {name[:40]!r}", field="--topologies",
                        fix="use any of: " + ", ".join(TOPOLOGY_NAMES)) from None
    return topo, dict(opts)


class RecipeLauncher:
    """Launches one recipe × topology at a time on `cluster` through the real runner; see the module doc.

    `monitor`: a started ClusterMonitor over the same cluster (bench's thermal probe), reused for facts and its
    connections; without one the launcher starts its own on the first launch and ends it in close().
    `overrides`: plan overrides for every launch (placeholders, `nodes`, `router_dir`, …); a topology's own
    router choice wins over an override's. `force`: launch although preflight refuses (never a blocking rule).
    `trust`: run what the plan lists under "needs confirmation" (recipes/trust.py), as `--trust` says.
    """

    def __init__(self, cluster: ClusterConfig, *, monitor: Any = None, overrides: Mapping[str, Any] | None = None,
                 force: bool = False, trust: bool = False, preflight: bool = True, ready_timeout: float = READY_TIMEOUT_S,
                 poll_interval: float = 1.0, on_progress: Callable[[Progress], Any] | None = None,
                 on_finding: Callable[[lint.Finding], Any] | None = None,
                 transport_factory: Callable[..., Any] | None = None) -> None:
        self.cluster = cluster
        self.overrides = dict(overrides or {})
        self.force = force
        self.trust = trust
        self.preflight = preflight
        self.ready_timeout = ready_timeout
        self.poll_interval = poll_interval
        self.on_progress = on_progress
        self.on_finding = on_finding
        self._factory = transport_factory
        self._monitor = monitor
        self._own_monitor = False
        self._own_transports: dict[str, Any] = {}
        self._recipes: dict[str, Recipe] = {}
        self._running: tuple[Runner, Plan] | None = None
        self._stopped: set[str] = set()            # nodes the last stop freed memory on, until it has settled
        self.plan: Plan | None = None               # the last plan launched (kept after stop, for reports)
        self.findings: list[lint.Finding] = []      # the last preflight's findings

    # --- Launcher protocol -------------------------------------------------------------------------------
    async def launch(self, recipe: str, topology: str) -> str:
        r = self._recipe(recipe)
        topo, opts = resolve_topology(topology)
        overrides, found = await plan_links(r, topo, self.cluster, {**self.overrides, **opts}, self._connect)
        plan = make_plan(r, topo, self.cluster, overrides)
        if self.trust and plan.untrusted:
            plan = replace(plan, trusted=True)
        if found:
            plan = replace(plan, notes=(*plan.notes, *found))
            for note in found:
                if self.on_progress is not None:
                    self.on_progress(Progress(note.split(":")[0], "info", note))
        if plan.endpoint is None:
            raise UserError(f"the {topology} plan of {r.key} has no endpoint to benchmark",
                            fix="use a topology whose plan serves HTTP")
        monitor = await self._ensure_monitor() if self.preflight else None
        if self.preflight:
            await self._check(r, plan, topology, monitor)
        runner = Runner(self.cluster, await self._transports(plan), ready_timeout=self.ready_timeout,
                        poll_interval=self.poll_interval)
        self.plan = plan
        await runner.launch(plan, self.on_progress)          # cleans up after itself when it fails
        self._running = (runner, plan)
        return plan.endpoint

    @property
    def kv_metrics(self) -> tuple[str, ...]:
        """/metrics of the running launch's servers that receive a KV cache (disagg: decode)."""
        return () if self._running is None else self._running[1].kv_metrics

    async def stop(self) -> None:
        if self._running is None:
            return
        runner, plan = self._running
        self._running = None
        self._stopped = set(plan.nodes)
        await runner.stop(plan, self.on_progress)

    def release(self) -> None:
        """Leave the running launch serving (bench matrix --keep-last): close() no longer stops it."""
        self._running = None

    async def close(self) -> None:
        """Stop a launch still running, then end the monitor and the connections this launcher opened."""
        try:
            await self.stop()
        finally:
            for t in self._own_transports.values():
                with contextlib.suppress(Exception):  # closing is best effort
                    await t.close()
            self._own_transports.clear()
            if self._own_monitor and self._monitor is not None:
                await self._monitor.stop()
                self._monitor = None

    async def __aenter__(self) -> RecipeLauncher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- steps -------------------------------------------------------------------------------------------
    def _recipe(self, name: str) -> Recipe:
        if name not in self._recipes:
            self._recipes[name] = find_recipe(name)
        return self._recipes[name]

    async def _ensure_monitor(self) -> Any:
        if self._monitor is None:
            from ..nodes.monitor import ClusterMonitor
            kwargs = {"transport_factory": self._factory} if self._factory else {}
            self._monitor = ClusterMonitor(self.cluster, history=4, **kwargs)
            self._own_monitor = True
            await self._monitor.start()
        await self._monitor.wait_first_ticks(FACTS_TIMEOUT_S)
        return self._monitor

    async def _fresh_ticks(self, monitor: Any, names: list[str], since: float) -> None:
        """Until each node has ticked after `since` (or is down): memory read before the previous topology's
        stop would still count its server."""
        deadline = time.monotonic() + FACTS_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(nm.last is not None and nm.last.received > since or nm.state.value == "DOWN"
                   for n, nm in monitor.nodes.items() if n in names):
                return
            await asyncio.sleep(0.05)

    async def _settled_memory(self, monitor: Any, names: list[str]) -> None:
        """Until memory has stopped coming back on the nodes the previous topology's stop freed it on: a stopped
        server's tens of GiB return over seconds (its processes end, the node's next samples), and a preflight
        that reads them half-way refuses the next topology for memory it is about to have. Settled: less than
        SETTLED_GIB more over the last SETTLE_WINDOW_S of samples."""
        def headroom() -> dict[str, float]:
            return {n: nm.last.mem.headroom_gib for n, nm in monitor.nodes.items()
                    if n in names and nm.last is not None and nm.last.mem is not None
                    and nm.last.mem.headroom_gib is not None}
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        seen: list[tuple[float, dict[str, float]]] = []
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)           # a node that is DOWN has no fresh tick to wait for
            await self._fresh_ticks(monitor, names, time.time())
            now = time.monotonic()
            seen.append((now, headroom()))
            old = [h for t, h in seen if now - t >= SETTLE_WINDOW_S]
            if old and all(v - old[-1].get(n, 0.0) < SETTLED_GIB for n, v in seen[-1][1].items()):
                return

    async def _facts(self, plan: Plan, monitor: Any) -> lint.Facts:
        settle = [n for n in plan.nodes if n in self._stopped]
        self._stopped -= set(settle)
        if settle:
            await self._settled_memory(monitor, settle)
        await self._fresh_ticks(monitor, list(plan.nodes), time.time())
        used = {n: nm for n, nm in monitor.nodes.items() if n in plan.nodes}
        facts = lint.facts_from_monitors(used, headroom_floor_gib=self.cluster.thresholds.headroom_floor_gib)
        image_ids: dict[str, str | None] = {}
        for name, nm in used.items():
            if nm.transport is None or not nm.transport.connected:
                continue
            env = "".join(f"{k}={shlex.quote(v)} " for k, v in nm.config.env)
            try:
                res = await nm.transport.run(env + shlex.join(["docker", "image", "inspect", "-f", "{{.Id}}",
                                                               plan.image]), timeout=30)
            except Exception:  # noqa: BLE001 — an unreadable node leaves the image rule unchecked for it
                continue
            image_ids[name] = (res.stdout.strip() or None) if res.rc == 0 else None
        busy, unreach = await probe_nodes(plan, self.cluster, {n: nm.transport for n, nm in used.items()
                                                               if nm.transport is not None and nm.transport.connected})
        return replace(facts, image_ids=image_ids, busy_ports=busy, unreachable=unreach)

    async def _check(self, recipe: Recipe, plan: Plan, topology: str, monitor: Any) -> None:
        facts = await self._facts(plan, monitor)
        chosen = CHOSEN_BY_NAME.get(topology, frozenset())
        findings = [replace(f, severity="warn", message=f"{f.message} (measured on purpose: {topology})")
                    if f.rule in chosen and f.severity == "refuse" else f
                    for f in lint.preflight(recipe, plan.topology, self.cluster.nodes, facts, plan=plan)]
        self.findings = findings
        if self.on_finding is not None:
            for f in findings:
                self.on_finding(f)
        blocking = lint.refusals(findings, force=self.force)
        if blocking:
            first = blocking[0]
            where = f" on {first.node}" if first.node else ""
            raise UserError(f"preflight refuses {recipe.key} as {topology}{where}: {first.rule}: {first.message}"
                            + (f" (+{len(blocking) - 1} more)" if len(blocking) > 1 else ""),
                            fix=(first.fix or "see `sparkconsole recipe lint`")
                            + ("" if first.severity == "block" else "; or pass --force"))

    async def _connect(self, node: NodeConfig) -> Any:
        """A connected transport to `node`: the monitor's where it has one, else one of our own."""
        nm = self._monitor.nodes.get(node.name) if self._monitor is not None else None
        t = getattr(nm, "transport", None)
        if t is not None and t.connected:
            return t
        own = self._own_transports.get(node.name)
        if own is None or not own.connected:
            from ..nodes.connect import make_transport
            own = (self._factory or make_transport)(node, self.cluster.ssh)
            await own.connect()
            self._own_transports[node.name] = own
        return own

    async def _transports(self, plan: Plan) -> dict[str, Any]:
        """The monitor's live connections where it has them; otherwise one of our own per node."""
        return {name: await self._connect(self.cluster.node(name)) for name in plan.nodes}


__all__ = ["RecipeLauncher", "TOPOLOGY_NAMES", "resolve_topology"]
