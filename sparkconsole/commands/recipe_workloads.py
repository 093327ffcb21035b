"""Several workloads on one cluster, for `sparkconsole recipe`: `fit` (where a set of recipes goes, and why), a
launch placed beside what runs, status / restart / stop of one workload by name, and the gateway kept to what
serves. The logic is below (placement/, launch/beside.py, launch/workloads.py, launch/gateway.py); this module
reads the nodes, prints, and refuses in one line.

    sparkconsole recipe fit gpt-oss-120b llama-3.1-8b qwen3-embedding-0.6b [--offline] [--pack]
    sparkconsole recipe fit tiny-testbed tiny-testbed --name chat --name coder -T solo
    sparkconsole recipe launch llama-3.1-8b --name coder --yes       (placed beside what runs; its own port)
    sparkconsole recipe status coder ; sparkconsole recipe restart coder --yes ; sparkconsole recipe stop coder --yes
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:
    from ..config import ClusterConfig
    from ..nodes.launches import LaunchGroup
    from ..nodes.transport import Transport
    from ..recipes import Recipe


def add_fit_parser(sub: Any, topologies: Any) -> None:
    fp = sub.add_parser("fit", help="where a set of recipes goes on the nodes' memory, and why",
                        description="Place each recipe (solo unless -T) on the nodes against each node's unified "
                                    "memory: MemTotal, the reserve, each model's estimate and claim, what runs now "
                                    "(measured) and MemAvailable, the room left after each placement.")
    fp.add_argument("recipes", nargs="*", metavar="NAME", help="recipe names or .yaml paths")
    fp.add_argument("--topology", "-T", action="append", choices=topologies, metavar="TOPOLOGY", dest="topologies",
                    help="the topology of each recipe in order (one for all; default solo)")
    fp.add_argument("--name", action="append", dest="names", metavar="NAME",
                    help="each workload's name in order (default: the recipe's key)")
    fp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                    help="placeholder value for every recipe, e.g. --set max_model_len=8192")
    fp.add_argument("--pack", action="store_true", help="fill the fullest node that fits first (default: spread)")
    fp.add_argument("--offline", action="store_true", help="read no node: GB10 nodes, nothing running")


def asks_from(args: argparse.Namespace) -> list[Any]:
    from ..launch.planning import default_workload
    from ..placement.fit import Ask
    from ..recipes import find_recipe
    from .recipe import overrides_from_sets

    if not args.recipes:
        raise UserError("fit needs at least one recipe", field="NAME",
                        fix="name the recipes to place: sparkconsole recipe fit gpt-oss-120b llama-3.1-8b")
    topos = list(args.topologies or [])
    names = list(args.names or [])
    for what, given, one_for_all in (("--topology", topos, True), ("--name", names, False)):
        if given and len(given) != len(args.recipes) and not (one_for_all and len(given) == 1):
            raise UserError(f"{len(given)} {what} for {len(args.recipes)} recipes", field=what,
                            fix=f"give one {what} per recipe, in their order"
                                + (f" (or one {what} for all)" if one_for_all else ""))
    sets = overrides_from_sets(args.sets)
    asks = []
    for i, key in enumerate(args.recipes):
        recipe = find_recipe(key)
        topo = topos[i] if len(topos) > 1 else (topos[0] if topos else "solo")
        if topo not in recipe.topologies:
            raise UserError(f"recipe {recipe.key} does not run as {topo}", file=recipe.source,
                            field="sparkconsole.topologies", fix=f"use one of: {', '.join(recipe.topologies)}")
        name = names[i] if names else default_workload(recipe)
        asks.append(Ask(name, recipe, topo, {**sets, "workload": name}))
    return asks


async def fit_main(args: argparse.Namespace, cluster: ClusterConfig) -> int:
    from ..launch.beside import Readings, estimator_for_all, place, start_monitor
    from ..launch.plan import make_plan
    from ..placement.budget import offline_budget
    from ..placement.fit import fit

    asks = asks_from(args)
    if args.offline:
        budgets = {n.name: offline_budget(n.name, headroom_floor_gib=cluster.thresholds.headroom_floor_gib)
                   for n in cluster.nodes}
        placement = fit(asks, cluster, budgets, pack=args.pack, offline=True)
    else:
        monitor = await start_monitor(cluster)
        try:
            planned = [(a.recipe, make_plan(a.recipe, a.topology, cluster, dict(a.overrides))) for a in asks]
            estimator = await estimator_for_all(planned, monitor.nodes)
            placement = place(Readings(cluster, monitor.nodes), asks, pack=args.pack, estimator=estimator)
        finally:
            await monitor.stop()
    print(placement.render())
    return 0


# --- one workload by name ------------------------------------------------------------------------------------

class Target:
    """What `recipe status|restart|stop NAME` acts on: a running workload (its group), or a recipe with nothing
    of it running (planned from the recipe as before)."""

    def __init__(self, group: LaunchGroup | None, recipe: Recipe | None, transports: dict[str, Transport],
                 groups: list[LaunchGroup], missed: list[str]) -> None:
        self.group, self.recipe, self.transports, self.groups, self.missed = group, recipe, transports, groups, missed


async def connect_all(cluster: ClusterConfig) -> dict[str, Transport]:
    from ..nodes.connect import make_transport
    from ..nodes.transport import TransportError
    out = {}
    for n in cluster.nodes:
        t = make_transport(n, cluster.ssh)
        try:
            await t.connect()
        except TransportError:
            continue          # its containers are unknown: named as unread
        out[n.name] = t
    return out


async def find_target(args: argparse.Namespace, cluster: ClusterConfig) -> Target:
    """Reads every node's containers and finds the workload NAME (or --name) names; see Target."""
    from ..launch.workloads import groups_of, not_running, read_nodes, resolve
    from ..recipes import find_recipe

    transports = await connect_all(cluster)
    try:
        read, missed = await read_nodes(cluster, transports)
        groups = groups_of(read)
        asked = getattr(args, "name", None)
        recipe = None
        if asked:
            recipe = find_recipe(args.recipe)
            group = resolve(groups, asked)
            if group is None:
                raise not_running(asked, groups, missed)
            if group.recipe != recipe.key:
                raise UserError(f"workload {asked} runs recipe {group.recipe}, not {recipe.key}", field="--name",
                                fix=f"give its recipe (sparkconsole recipe {args.recipe_command} {group.recipe} "
                                    f"--name {asked}) or its name alone")
            return Target(group, recipe, transports, groups, missed)
        group = resolve(groups, args.recipe)
        if group is None:
            try:
                recipe = find_recipe(args.recipe)
            except UserError:
                raise not_running(args.recipe, groups, missed) from None
            from ..launch.planning import default_workload
            group = resolve(groups, default_workload(recipe), recipe_key=recipe.key, topology=args.topology)
        elif args.recipe_command == "restart":
            recipe = _recipe_of(args, group)
        return Target(group, recipe, transports, groups, missed)
    except BaseException:
        for t in transports.values():
            await t.close()
        raise


def _recipe_of(args: argparse.Namespace, group: LaunchGroup) -> Recipe:
    from ..recipes import find_recipe
    try:
        return find_recipe(group.recipe)
    except UserError:
        raise UserError(f"workload {group.name} runs recipe {group.recipe}, which is not found here", field="recipe",
                        fix=f"give its file: sparkconsole recipe {args.recipe_command} PATH.yaml --name {group.name}"
                        ) from None


async def sync_gateway(cluster: ClusterConfig, transports: dict[str, Transport], *,
                       without: str | None = None) -> None:
    """The gateway (when the cluster file has one) listing what serves now, `without` a workload about to stop."""
    if cluster.gateway is None:
        return
    from ..launch.gateway import keep_current
    from ..nodes.connect import make_transport

    if cluster.head.name not in transports:
        t = make_transport(cluster.head, cluster.ssh)
        await t.connect()
        transports[cluster.head.name] = t
    report = await keep_current(cluster, transports, without=without)
    if report is not None:
        print(report.line(), flush=True)


# --- launch beside what runs ---------------------------------------------------------------------------------

async def place_beside(args: argparse.Namespace, recipe: Recipe, cluster: ClusterConfig, plan: Any,
                       overrides: dict[str, Any], monitor: Any) -> tuple[Any, Any]:
    """The plan placed where the rule puts it beside what runs (its nodes, port and names), and the placement for
    preflight's budget rule (lint_workloads.py). A launch that does not fit is refused here, in one line, before
    anything starts (not overridden by --force: on a GB10 the next step is a frozen host); `lint` reports it."""
    from ..launch.beside import Readings, estimator_for, launch_options, place
    from ..launch.plan import make_plan
    from ..placement.fit import Ask

    readings = Readings(cluster, monitor.nodes)
    ask = Ask(plan.name, recipe, plan.topology, {**overrides, "workload": plan.name})
    try:
        estimator = await estimator_for(recipe, plan, monitor.nodes)
        placement = place(readings, [ask], pack=getattr(args, "pack", False), estimator=estimator)
    except UserError as err:
        if args.recipe_command == "launch":
            raise
        return plan, err
    print(placement.render(), flush=True)
    placed = make_plan(recipe, plan.topology, cluster, {**overrides, **launch_options(placement, ask.name)})
    return placed, placement


async def read_beside(args: argparse.Namespace, recipe: Recipe, cluster: ClusterConfig, plan: Any,
                      overrides: dict[str, Any]) -> tuple[Any, Any, Any]:
    """`lint` and `launch` with the nodes read: every node's tick, the plan placed beside what runs, the facts
    preflight judges (the placement among them). Returns (plan, facts, the monitor: the caller stops it)."""
    from dataclasses import replace

    from ..launch.beside import start_monitor
    from .recipe import gather_facts
    monitor = await start_monitor(cluster)
    try:
        plan, placed = await place_beside(args, recipe, cluster, plan, overrides, monitor)
        facts, monitor = await gather_facts(plan, cluster, recipe, monitor=monitor)
    except BaseException:
        await monitor.stop()
        raise
    return plan, replace(facts, placement=placed), monitor


async def before_start(cluster: ClusterConfig, plan: Any, monitor: Any) -> None:
    """The waits before a launch starts on its nodes: the previous launch there loaded, memory back after a stop."""
    from ..launch.beside import Readings, wait_loaded, wait_recovered
    from ..paths import state_dir
    from ..placement.recovery import StopLog

    def say(line: str) -> None:
        print(line, flush=True)
    await wait_loaded(Readings(cluster, monitor.nodes).groups, plan.nodes, say, skip=plan.name)
    log = StopLog(state_dir(), cluster.source)
    await wait_recovered(monitor.nodes, plan.nodes, log, say)
    for n in plan.nodes:
        log.clear(n)


async def act_on_running(args: argparse.Namespace, cluster: ClusterConfig, target: Target) -> int:
    """status / stop / restart of one running workload, from its containers (a restart from its recipe too)."""
    from ..launch.runner import Runner
    from ..launch.workloads import plan_of
    from .recipe import _confirm, _print_progress

    group = target.group
    assert group is not None
    if args.topology and args.topology != group.topology:
        raise UserError(f"workload {group.name} runs as {group.topology}, not {args.topology}", field="--topology",
                        fix=f"leave -T out, or write -T {group.topology}")
    transports = target.transports
    try:
        runner = Runner(cluster, transports)
        show = _print_progress(args.verbose)
        if args.recipe_command == "status":
            health = await runner.health(plan_of(group))
            print(health.render())
            return 0 if health.ok else 1
        if args.recipe_command == "stop":
            plan = plan_of(group)
            print(f"stop workload {group.name} ({group.recipe} × {group.topology}) on {', '.join(group.nodes)}: "
                  + ", ".join(f"{s.container} on {s.node}" for s in plan.services))
            _confirm(args, f"stop {group.name} on {', '.join(group.nodes)}?")
            await _record_stop(cluster, group)
            await sync_gateway(cluster, transports, without=group.name)
            await runner.stop(plan, show)
            print(f"stopped {group.name} on {', '.join(group.nodes)}")
            return 0
        return await _restart(args, cluster, target, runner, show)
    finally:
        for t in transports.values():
            await t.close()


async def _restart(args: argparse.Namespace, cluster: ClusterConfig, target: Target, runner: Any, show: Any) -> int:
    from ..launch.plan import make_plan
    from ..launch.rolling import restart, restart_text
    from ..launch.workloads import replan_options
    from .recipe import _confirm, _confirm_trust, overrides_from

    group, recipe = target.group, target.recipe
    assert group is not None and recipe is not None
    overrides = {k: v for k, v in overrides_from(args).items() if k != "workload"}
    if args.router and group.router and args.router != group.router:
        # a restart keeps the router container (it restarts servers): it would wait for a router that never comes
        raise UserError(f"the running launch's router is {group.router}, not {args.router}", field="--router",
                        fix=f"restart with --router {group.router} (or without --router); to change routers, "
                            f"`recipe stop`, then `recipe launch` with --router {args.router}")
    if group.router and not args.router and group.router != recipe.router.default:
        print(f"the running router is {group.router}: restarting the launch as it was made (--router {group.router})")
    plan = make_plan(recipe, group.topology, cluster, {**overrides, **replan_options(group)})
    print(plan.render({n.name: n.address for n in cluster.nodes}))
    print(restart_text(plan, all_at_once=args.all_at_once, drain_timeout=args.drain_timeout))
    plan = _confirm_trust(args, plan)           # what it runs again: mods, pre_exec
    _confirm(args, f"restart {group.name} ({group.recipe} × {group.topology}) on {', '.join(plan.nodes)}?")
    report = await restart(runner, plan, show, drain_timeout=args.drain_timeout, all_at_once=args.all_at_once)
    if report is not None:
        print(report.line())
    print(f"ready again: {plan.endpoint}")
    return 0


async def _record_stop(cluster: ClusterConfig, group: LaunchGroup) -> None:
    """What the stop should give back on each node (placement/recovery.py), read from one tick of its nodes."""
    from dataclasses import replace

    from ..launch.beside import Readings, start_monitor
    from ..paths import state_dir
    from ..placement.recovery import StopLog

    sub = replace(cluster, nodes=tuple(n for n in cluster.nodes if n.name in group.nodes))
    monitor = await start_monitor(sub)
    try:
        from ..launch.beside import record_stop
        record_stop(StopLog(state_dir(), cluster.source), Readings(sub, monitor.nodes), group)
    finally:
        await monitor.stop()
