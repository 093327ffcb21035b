"""`sparkconsole recipe list|plan|lint|launch|status|stop|restart`: recipes headless.

    sparkconsole recipe list [WORDS] [--all]       (every registry's too; WORDS searches them all)
    sparkconsole recipe registry add URL [--name N] | list | update [NAME] | rm NAME
    sparkconsole recipe plan gpt-oss-120b --topology 2x-solo --router simple-shuffle
    sparkconsole recipe lint deepseek-v4-flash --topology cluster-tp2
    sparkconsole recipe launch tiny-testbed --topology solo --yes [--force] [--drop-caches] [-- EXTRA VLLM ARGS]
    (everything after `--` is appended to the vLLM command verbatim, as with run-recipe.sh)
    sparkconsole recipe status tiny-testbed --topology cluster-tp2      (exit code 1 unless it serves)
    sparkconsole recipe stop tiny-testbed --topology solo --yes
    sparkconsole recipe restart tiny-testbed --topology solo --yes
    sparkconsole recipe restart tiny-testbed -T 2x-solo --yes [--all-at-once] [--drain-timeout 120]
    (behind a router: one server at a time, out of the router, drained, restarted, back in; --all-at-once: together)
    sparkconsole recipe plan tiny-testbed -T 2x-solo --restart      (the restart's steps per server)
    sparkconsole recipe fit gpt-oss-120b llama-3.1-8b [--offline] [--pack]    (where each goes, and why)
    sparkconsole recipe launch llama-3.1-8b --name coder --yes     (beside what runs: its own port and containers)
    sparkconsole recipe status|restart|stop coder                  (one workload by name; never another)

Changes to nodes need `--yes` when there is no terminal to ask on; `--force` overrides preflight refusals
(except compromised router releases, which are always refused).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from . import LazyChoices
from .recipe_io import _confirm, _confirm_trust, _print_progress, overrides_from

if TYPE_CHECKING:      # the product is imported inside the functions: `recipe plan --bad` answers at once
    from ..config import ClusterConfig, NodeConfig
    from ..launch.steps import Plan
    from ..nodes.transport import Transport
    from ..recipes import Recipe

TOPOLOGIES = LazyChoices("sparkconsole.recipes", "TOPOLOGIES")
ROUTER_CHOICES = LazyChoices("sparkconsole.recipes", "ROUTER_CHOICES")



class _ExtraArgsParser(argparse.ArgumentParser):
    """Takes everything after `--` as extra vLLM arguments (run-recipe.sh's syntax), before argparse sees it:
    a `nargs="*"` positional cannot collect them once options sit between it and the `--`."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        args = list(sys.argv[1:] if args is None else args)
        extra: list[str] = []
        if "--" in args:
            i = args.index("--")
            args, extra = args[:i], args[i + 1:]
        ns, rest = super().parse_known_args(args, namespace)
        ns.extra = extra
        return ns, rest


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("recipe", help="list, plan, lint, launch, stop and restart model recipes",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="recipe_command", metavar="ACTION", parser_class=_ExtraArgsParser)
    sub.required = True
    ls = sub.add_parser("list", help="local and bundled recipes, and every fetched registry's")
    ls.add_argument("words", nargs="*", metavar="WORDS", help="only recipes whose name, model, description or "
                    "registry holds every word")
    ls.add_argument("--all", action="store_true", help="also the registries' hidden sections (e.g. experimental)")
    ls.set_defaults(func=run)
    from .registry import register as register_registry
    register_registry(sub)
    from .recipe_workloads import add_fit_parser
    add_fit_parser(sub, TOPOLOGIES)
    sub.choices["fit"].set_defaults(func=run)
    for name, helptext in (("plan", "show the exact per-node commands, run nothing"),
                           ("lint", "preflight checks (reads the nodes unless --offline)"),
                           ("launch", "lint, confirm, run the plan and wait until it serves"),
                           ("status", "is the launch serving? every member on every node, one verdict"),
                           ("stop", "stop and remove the recipe's containers on every node"),
                           ("restart", "restart the recipe's servers and wait until they serve")):
        sp = sub.add_parser(name, help=helptext, description=helptext,
                            epilog="Arguments after -- are appended to the vLLM command verbatim, as with "
                                   "run-recipe.sh: sparkconsole recipe plan NAME -- --seed 42")
        _add_plan_arguments(sp)
        _add_action_arguments(sp, name)
        sp.set_defaults(func=run)


def _add_plan_arguments(sp: argparse.ArgumentParser) -> None:
    """What every action that plans takes: the recipe, where and how it runs, and whether to ask."""
    sp.add_argument("recipe", help="recipe name (see `recipe list`) or a path to a .yaml file; status, restart "
                                   "and stop also take a running workload's name")
    sp.add_argument("--name", help="the workload's name: launch it under this name (several may run from one "
                                   "recipe); act on the one of this name (default: the recipe's key)")
    sp.add_argument("--topology", "-T", choices=TOPOLOGIES, metavar="TOPOLOGY",
                    help="%(choices)s (default: the recipe's first topology)")
    sp.add_argument("--node", "-n", action="append", dest="nodes", metavar="NAME",
                    help="node(s) to use, head first (repeat); default: head, then file order")
    sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                    help="placeholder value, e.g. --set max_model_len=8192 (repeat)")
    sp.add_argument("--port", type=int)
    sp.add_argument("--host")
    sp.add_argument("--tensor-parallel", "--tp", type=int, dest="tensor_parallel")
    sp.add_argument("--gpu-memory-utilization", "--gpu-mem", type=float, dest="gpu_memory_utilization")
    sp.add_argument("--max-model-len", type=int, dest="max_model_len")
    sp.add_argument("--max-num-batched-tokens", type=int, dest="max_num_batched_tokens")
    sp.add_argument("--router", choices=ROUTER_CHOICES, metavar="ROUTER",
                    help="2x-solo router: %(choices)s (default: the recipe's)")
    sp.add_argument("--backend", choices=("mp", "ray"), help="cluster launch: vLLM's own (mp) or Ray")
    sp.add_argument("--eth-if", help="interface linking the nodes (NCCL/GLOO/UCX)")
    sp.add_argument("--ib-if", help="RDMA device for NCCL_IB_HCA")
    sp.add_argument("--master-port", type=int)
    sp.add_argument("--drop-caches", action="store_true", help="drop the page cache before the load, so it sees the memory really free")
    sp.add_argument("--apply-mod", action="append", default=[], dest="apply_mods", metavar="PATH",
                    help="a mod (directory or .zip holding run.sh) applied after the recipe's own (repeat)")
    sp.add_argument("--non-privileged", action="store_true",
                    help="no --privileged: IPC_LOCK and /dev/infiniband only, as the runner's --non-privileged")
    sp.add_argument("--no-cache-dirs", action="store_true",
                    help="do not mount the node's compile caches (vLLM, FlashInfer, Triton, TileLang)")
    sp.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    sp.add_argument("--trust", action="store_true", help="run the pre_exec commands and mods the plan lists "
                    "under 'needs confirmation' without asking (a registry not marked trusted, a mod from "
                    "outside the recipe's checkout)")
    sp.add_argument("--force", action="store_true", help="launch although preflight refuses")
    sp.add_argument("--offline", action="store_true", help="do not read the nodes for preflight facts")


def _add_action_arguments(sp: argparse.ArgumentParser, name: str) -> None:
    """What only some actions take (and --verbose, where help has always listed it)."""
    if name in ("lint", "launch"):
        sp.add_argument("--explain", action="store_true",
                        help="print each finding's evidence (published runs, public threads) under it")
    if name == "lint":
        sp.add_argument("--demo", action="store_true",
                        help="judge against the demo's two simulated GB10 nodes (SIMULATED), as `sparkconsole "
                             "demo` starts them: spark1 hardened, spark2 an untouched install")
    sp.add_argument("--verbose", "-v", action="store_true", help="also print server log lines while waiting")
    if name == "launch":
        sp.add_argument("--pack", action="store_true",
                        help="place it on the fullest node it fits (default: the node with the most room)")
    if name in ("plan", "restart"):
        if name == "plan":
            sp.add_argument("--restart", action="store_true",
                            help="print the restart's steps per server (drain, stop, start, healthy, back in)")
        sp.add_argument("--all-at-once", action="store_true",
                        help="restart every server together (default behind a router: one at a time)")
        sp.add_argument("--drain-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="wait at most this long for a server's requests to finish before it is stopped "
                             "(0: no drain; default %(default)g)")


def load_cluster_for(args: argparse.Namespace) -> ClusterConfig:
    demo: ClusterConfig | None = getattr(args, "demo_cluster", None)
    if demo is not None:
        return demo
    from ..clusterfile import cluster_for
    return cluster_for(args)


def _list(args: argparse.Namespace) -> int:
    from ..recipes.catalog import catalog, search

    entries = catalog(include_hidden=args.all)
    if args.words:
        entries = search(entries, " ".join(args.words))
    if not entries:
        print("no recipes found" + (f" for {' '.join(args.words)!r}" if args.words else ""))
        return 0
    w = max(len(e.key) for e in entries)
    t = max(len(e.topologies) for e in entries)
    for e in entries:
        name = f"ERROR {e.error}" if e.error else e.name
        runtime = "" if e.runtime == "vllm" else f" [{e.runtime}]"
        print(f"{e.key:<{w}}  {e.topologies:<{t}}  {name}{runtime}")
        print(f"{'':<{w}}  {'':<{t}}  {e.registry}: {e.path}")
    return 0


async def _act(args: argparse.Namespace, recipe: Recipe, cluster: ClusterConfig, plan: Plan,
               overrides: dict[str, Any]) -> int:
    from ..launch import lint as lint_mod

    action = args.recipe_command
    if action == "status":
        return await _status(cluster, plan)
    monitor = None
    facts = lint_mod.Facts(headroom_floor_gib=cluster.thresholds.headroom_floor_gib)
    try:
        if action in ("lint", "launch") and not args.offline:
            from .recipe_workloads import read_beside
            plan, facts, monitor = await read_beside(args, recipe, cluster, plan, overrides)
        if action in ("lint", "launch"):
            refused = _preflight(args, recipe, plan, cluster, facts)
            if action == "lint":
                return 1 if refused else 0
        print(plan.render({n.name: n.address for n in cluster.nodes}))
        if action == "restart":
            from ..launch.rolling import restart_text
            print(restart_text(plan, all_at_once=args.all_at_once, drain_timeout=args.drain_timeout))
        if action in ("launch", "restart"):          # what they run again: mods, pre_exec
            plan = _confirm_trust(args, plan)
        _confirm(args, f"{action} {plan.recipe} as {plan.topology} on {', '.join(plan.nodes)}?")
        return await _run_action(args, cluster, plan, monitor)
    finally:
        if monitor is not None:
            await monitor.stop()


async def _status(cluster: ClusterConfig, plan: Plan) -> int:
    """`recipe status`: each member's health, read over the nodes that answer (the others' members: unreachable)."""
    from ..launch.runner import Runner
    from ..nodes.connect import make_transport
    from ..nodes.transport import TransportError
    transports = {}
    for name in plan.nodes:
        t = make_transport(cluster.node(name), cluster.ssh)
        try:
            await t.connect()
        except TransportError:
            continue
        transports[name] = t
    try:
        health = await Runner(cluster, transports).health(plan)
    finally:
        for t in transports.values():
            await t.close()
    print(health.render())
    return 0 if health.ok else 1


def _preflight(args: argparse.Namespace, recipe: Recipe, plan: Plan, cluster: ClusterConfig, facts: Any) -> bool:
    """The memory fit and preflight's findings (facts None: on paper, no node read), printed; True when they
    refuse. A launch they refuse is a one-line UserError naming the first refusal; `lint` prints its count."""
    from ..launch import lint as lint_mod
    from ..placement.estimate import render as render_fit
    for line in render_fit(lint_mod.memory_estimates(recipe, plan, facts or lint_mod.Facts())):
        print(line)
    findings = lint_mod.preflight(recipe, plan.topology, cluster.nodes, facts, plan=plan)
    for f in findings:
        print(f.line(explain=args.explain))
    blocking = lint_mod.refusals(findings, force=args.force)
    if args.recipe_command == "lint":
        print(f"preflight: {len(findings)} finding(s), {len(lint_mod.refusals(findings))} refusing")
        return bool(blocking)
    if blocking:
        first = blocking[0]
        raise UserError(f"preflight refuses the launch: {first.rule}: {first.message}"
                        + (f" (+{len(blocking) - 1} more)" if len(blocking) > 1 else ""),
                        fix=(first.fix or "see the findings above")
                        + ("" if first.severity == "block" else "; or pass --force"))
    return False


async def _run_action(args: argparse.Namespace, cluster: ClusterConfig, plan: Plan, monitor: Any) -> int:
    """Launch, restart or stop the confirmed plan over the nodes' transports (the preflight monitor's, else new)."""
    from ..launch.runner import Runner
    from ..nodes.connect import make_transport
    transports = {}
    if monitor is not None:
        transports = {n: nm.transport for n, nm in monitor.nodes.items() if nm.transport is not None}
    for name in plan.nodes:
        if name not in transports:
            t = make_transport(cluster.node(name), cluster.ssh)
            await t.connect()
            transports[name] = t
    runner = Runner(cluster, transports)
    show = _print_progress(args.verbose)
    action = args.recipe_command
    if action == "launch":
        if monitor is not None:
            from .recipe_workloads import before_start
            await before_start(cluster, plan, monitor)
        ready = await runner.launch(plan, show)
        print(f"ready: {plan.endpoint} ({', '.join(f'{k} {v:g} s' for k, v in ready.items())})")
        from .recipe_workloads import sync_gateway
        await sync_gateway(cluster, transports)
    elif action == "restart":
        from ..launch.rolling import restart
        report = await restart(runner, plan, show, drain_timeout=args.drain_timeout, all_at_once=args.all_at_once)
        if report is not None:
            print(report.line())
        print(f"ready again: {plan.endpoint}")
    else:
        await runner.stop(plan, show)
        print(f"stopped {plan.recipe} on {', '.join(plan.nodes)}")
    return 0


async def _memory_fit(recipe: Recipe, plan: Plan, *, offline: bool) -> list[str]:
    """The plan's memory fit in words, on paper: the recipe's metadata (or sparkconsole's figures for a bundled
    recipe's model), else the Hub when online and not `--offline`. `recipe lint` and `launch` read each node's own
    Hugging Face cache first (gather_facts)."""
    from ..launch import lint as lint_mod
    from ..placement import modelinfo
    from ..placement.estimate import estimate_plan, render

    source = lint_mod.plan_model(plan)
    hub = None
    if source and not offline and all(e.weights_b is None for e in estimate_plan(recipe, plan, {})):
        hub = await modelinfo.read_hub(source, getattr(recipe, "model_revision", None))
    return render(estimate_plan(recipe, plan, {}, hub=hub))


async def _as_the_router_runs(args: argparse.Namespace, recipe: Recipe, cluster: ClusterConfig, plan: Plan,
                              overrides: dict[str, Any]) -> Plan:
    """A 2x-solo restart planned with the router that runs (a restart keeps the router container and restarts the
    servers: with another router named it would wait for one that never comes)."""
    from ..launch.plan import make_plan
    runs = await _running_router(cluster, plan)
    if not runs or runs == plan.router:
        return plan
    if args.router:
        raise UserError(f"the running launch's router is {runs}, not {args.router}", field="--router",
                        fix=f"restart with --router {runs} (or without --router); to change routers, "
                            f"`recipe stop`, then `recipe launch` with --router {args.router}")
    print(f"the running router is {runs}: restarting the launch as it was made (--router {runs})")
    return make_plan(recipe, plan.topology, cluster, {**overrides, "router": runs})


async def _running_router(cluster: ClusterConfig, plan: Plan) -> str | None:
    """The router a running 2x-solo launch has, read on its head node (None when unreachable or not running)."""
    from ..launch.rolling import router_of, running_router
    from ..nodes.connect import make_transport
    from ..nodes.transport import TransportError

    router = router_of(plan)
    if router is None:
        return None
    t = make_transport(cluster.node(router.node), cluster.ssh)
    try:
        await t.connect()
        return await running_router(t, plan)
    except TransportError:
        return None
    finally:
        await t.close()


async def _discover_links(recipe: Recipe, topology: str, cluster: ClusterConfig,
                          overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Link interfaces nobody wrote down, read from the nodes (launch/ifaces.py), as spark-vllm-docker does."""
    from ..launch.ifaces import plan_links
    from ..nodes.connect import make_transport
    opened: list[Transport] = []

    async def connect(node: NodeConfig) -> Transport:
        t = make_transport(node, cluster.ssh)
        await t.connect()
        opened.append(t)
        return t
    try:
        return await plan_links(recipe, topology, cluster, overrides, connect)
    finally:
        for t in opened:
            await t.close()


def run(args: argparse.Namespace) -> int | Coroutine[Any, Any, int]:
    """`recipe list` answers at once; every other action is one coroutine (cli.py runs it in one event loop)."""
    if args.recipe_command == "list":
        return _list(args)
    if args.recipe_command == "registry":
        from .registry import run as run_registry
        return run_registry(args)
    if getattr(args, "demo", False):
        return _on_the_demo(args)
    return _main(args)


async def _on_the_demo(args: argparse.Namespace) -> int:
    """`recipe lint --demo`: the demo's simulated nodes started (no model served), judged as live nodes are, then
    stopped. Everything it says is about SIMULATED nodes."""
    from ..sim.cluster import SimCluster
    if args.offline:
        raise UserError("--demo reads the simulated nodes", field="--offline", fix="give one of --demo, --offline")
    sim = SimCluster()
    try:
        await sim.start_nodes()
        print("SIMULATED: the demo's nodes (spark1 hardened, spark2 an untouched install), no model served",
              file=sys.stderr, flush=True)
        args.demo_cluster = sim.cluster
        return await _main(args)
    finally:
        await sim.stop()


async def _main(args: argparse.Namespace) -> int:
    from ..launch.plan import make_plan
    from ..recipes import find_recipe

    if args.recipe_command == "fit":
        from .recipe_workloads import fit_main
        return await fit_main(args, load_cluster_for(args))
    if getattr(args, "drain_timeout", 0) < 0:
        raise UserError(f"--drain-timeout {args.drain_timeout:g} is negative", field="--drain-timeout",
                        fix="give the seconds to wait for requests to finish (0: no drain)")
    if args.recipe_command in ("status", "stop", "restart"):
        from .recipe_workloads import act_on_running, find_target
        cluster = load_cluster_for(args)
        target = await find_target(args, cluster)
        if target.group is not None:
            return await act_on_running(args, cluster, target)
        for t in target.transports.values():
            await t.close()
    recipe = find_recipe(args.recipe)
    cluster = load_cluster_for(args)
    topology = args.topology or recipe.topologies[0]
    found: list[str]
    overrides, found = overrides_from(args), []
    if topology in ("cluster-tp2", "disagg") and not args.offline:
        overrides, found = await _discover_links(recipe, topology, cluster, overrides)
    plan = make_plan(recipe, topology, cluster, overrides)
    if found:
        from dataclasses import replace as _replace
        plan = _replace(plan, notes=(*plan.notes, *found))
    if args.recipe_command == "plan":
        for w in recipe.warnings:
            print(f"warning: {w}")
        print(plan.render({n.name: n.address for n in cluster.nodes}))
        for line in await _memory_fit(recipe, plan, offline=args.offline):
            print(line)
        if args.restart:
            from ..launch.rolling import restart_text
            print(restart_text(plan, all_at_once=args.all_at_once, drain_timeout=args.drain_timeout))
        return 0
    if args.recipe_command == "restart" and topology == "2x-solo":
        plan = await _as_the_router_runs(args, recipe, cluster, plan, overrides)
    if args.recipe_command == "lint" and args.offline:
        return 1 if _preflight(args, recipe, plan, cluster, None) else 0
    return await _act(args, recipe, cluster, plan, overrides)
