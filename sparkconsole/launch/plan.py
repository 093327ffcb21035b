"""Recipe × topology × nodes → the exact commands each node runs, in order, shown before anything runs.

Plans hold argv lists (rendered with shlex.join, so every value reaching a remote shell is quoted). Secrets
are passed by reference: `-e HF_TOKEN` reads the value from the docker client's environment on the node, or
`HF_TOKEN="$(cat -- FILE)"` reads it from a file on the node; a plan never holds a secret's value.

Every server runs in the same container (launch/container.py: the runner's flags, the node's caches, the
recipe's mods); each topology has a planner of its own (launch/topologies.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..config import ClusterConfig, NodeConfig
from ..errors import UserError
from ..recipes import ROUTER_CHOICES, TOPOLOGIES, Readiness, Recipe
from ..recipes.modrefs import locate_mods
from ..recipes.overrides import SHAPE, LaunchFacts, for_launch
from ..recipes.trust import untrusted_items
from ..runtimes import Runtime, from_command, generate_command, runtime_for
from . import runtime_cmd
from .container import ContainerSpec
from .mods import load_mods
from .planning import PlanBuilder, default_workload
from .steps import Plan
from .topologies import plan_cluster, plan_disagg, plan_solo, plan_two_solo

# Plan options taken out of overrides; every other override key is a placeholder value.
OPTION_KEYS = {"nodes", "extra_args", "backend", "router", "drop_caches", "eth_if", "ib_if", "master_port",
               "router_dir", "apply_mods", "non_privileged", "no_cache_dirs", "cluster_addresses",
               # several workloads on one cluster (placement/, launch/workloads.py): the launch's name, its
               # containers' names and its router's port where they differ from the recipe's, each server's claim
               "workload", "container_names", "router_port", "claims"}
WORKLOAD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def select_nodes(topology: str, cluster: ClusterConfig, wanted: Sequence[str] | None,
                 count: int | None = None) -> list[NodeConfig]:
    """The nodes a topology uses: the named ones, else the head first and then the others in file order.
    `count`: how many a cluster launch needs (its tensor × pipeline parallel size), default 2."""
    need = {"solo": 1, "cluster-tp2": count or 2, "2x-solo": 2, "disagg": 2}[topology]
    if wanted:
        out = []
        for name in wanted:
            try:
                out.append(cluster.node(name))
            except KeyError:
                raise UserError(f"no node named {name[:40]!r} in the cluster file", file=cluster.source,
                                field="nodes", fix="name one of: " + ", ".join(n.name for n in cluster.nodes)) from None
        if len(set(n.name for n in out)) != len(out):
            raise UserError("a node is named twice", field="--node", fix="name each node once")
        if topology == "solo" and len(out) != 1:
            raise UserError(f"solo runs on one node, {len(out)} named", field="--node", fix="name one node")
        if topology in ("2x-solo", "disagg") and len(out) != 2:
            raise UserError(f"{topology} runs on two nodes, {len(out)} named", field="--node", fix="name two nodes")
        if topology == "cluster-tp2" and len(out) < 2:
            raise UserError("cluster-tp2 needs at least two nodes", field="--node", fix="name two nodes")
        if topology == "cluster-tp2" and count and len(out) != count:
            raise UserError(f"the recipe's parallelism needs {count} nodes, {len(out)} named", field="--node",
                            fix=f"name {count} nodes, or change tensor_parallel / pipeline_parallel with --set")
        return out
    ordered = [cluster.head, *[n for n in cluster.nodes if n.name != cluster.head.name]]
    if len(ordered) < need:
        if topology == "cluster-tp2" and count:
            raise UserError(f"the recipe runs on {need} nodes (tensor × pipeline parallel), the cluster file has "
                            f"{len(ordered)}", file=cluster.source, field="nodes",
                            fix=f"add nodes to the cluster file, or choose another split with --set "
                                f"tensor_parallel=… (a model sized for {need} nodes may not fit on fewer)")
        raise UserError(f"{topology} needs {need} nodes, the cluster file has {len(ordered)}", file=cluster.source,
                        field="nodes", fix="add a node to the cluster file, or use --topology solo")
    return ordered[:need]


def cluster_split(params: Mapping[str, Any], named: int | None, explicit: bool = False) -> tuple[int, int, int, str | None]:
    """(tensor, pipeline, nodes, note) of a cluster launch. The recipe's own parallelism decides how many nodes
    it runs on — a recipe written for 4 Sparks is never squeezed onto 2. A recipe that sets none (TP×PP of 1)
    takes the topology's: tensor parallel over the named nodes, or two; the plan says so."""
    try:
        tp = int(params.get("tensor_parallel") or 1)
        pp = int(params.get("pipeline_parallel") or 1)
    except (TypeError, ValueError):
        raise UserError("tensor_parallel and pipeline_parallel must be whole numbers", field="defaults",
                        fix="write e.g. tensor_parallel: 2") from None
    if tp < 1 or pp < 1:
        raise UserError(f"tensor_parallel {tp} × pipeline_parallel {pp}", field="defaults", fix="use sizes ≥ 1")
    if tp * pp >= 2:
        return tp, pp, tp * pp, None
    if explicit:      # asked for one GPU's worth on a cluster: planned as asked, preflight says why it cannot run
        return tp, pp, named or 2, None
    n = named or 2
    return n, 1, n, (f"the recipe sets no parallelism above 1: tensor_parallel {n} spreads it over the "
                     f"{n} nodes of the cluster launch")


def make_plan(recipe: Recipe, topology: str, cluster: ClusterConfig, overrides: Mapping[str, Any] | None = None) -> Plan:
    """Every command for every node, in order (head first). Raises UserError for what cannot be planned."""
    overrides = dict(overrides or {})
    recipe, runtime, notes = with_runtime(recipe)
    if topology in TOPOLOGIES:       # the runtime's own limits first: they are why, whatever the recipe lists
        runtime.refuse_topology(topology, recipe.source)
    _check_topology(recipe, topology)
    options = {k: overrides.pop(k) for k in list(overrides) if k in OPTION_KEYS}
    workload = options.get("workload")
    if workload is not None and not WORKLOAD_RE.match(str(workload)):
        raise UserError(f"bad workload name {str(workload)[:40]!r}", field="--name",
                        fix="use letters, digits, '-', '_' or '.' (at most 63), e.g. --name coder")
    split_note = None
    if topology == "cluster-tp2":
        tp, pp, count, split_note = cluster_split(
            _asked(recipe, topology, overrides), len(options["nodes"]) if options.get("nodes") else None,
            explicit=any(overrides.get(k) is not None for k in ("tensor_parallel", "pipeline_parallel")))
        _check_node_range(recipe, count)
    split = (tp, pp, count) if topology == "cluster-tp2" else (1, 1, 1)
    recipe, applied = _for_launch(recipe, topology, split, overrides)
    if topology == "cluster-tp2":
        nodes = select_nodes(topology, cluster, options.get("nodes"), count)
        # a cluster runs the recipe's own split over as many nodes (cluster_split)
        params = {**_asked(recipe, topology, overrides), "tensor_parallel": tp, "pipeline_parallel": pp}
    else:
        nodes = select_nodes(topology, cluster, options.get("nodes"))
        # Single-node servers run with TP=1, as run-recipe.sh --solo does (--set can still ask otherwise).
        params = {**recipe.defaults, "tensor_parallel": 1, **recipe.topology_defaults.get(topology, {})}
        params.update({k: v for k, v in overrides.items() if v is not None})
    params.setdefault("host", "0.0.0.0")
    backend = options.get("backend") or recipe.cluster.backend
    if backend not in ("mp", "ray"):
        raise UserError(f"unknown backend {str(backend)[:20]!r}", field="--backend", fix="use mp or ray")
    router_choice = options.get("router") or recipe.router.default
    if router_choice not in ROUTER_CHOICES:
        raise UserError(f"unknown router {str(router_choice)[:30]!r}", field="--router",
                        fix=f"use one of: {', '.join(ROUTER_CHOICES)}")
    runtime_cmd.check(runtime, topology, backend, router_choice if topology == "2x-solo" else None, recipe.source)
    master_port = int(options.get("master_port") or cluster.master_port or recipe.cluster.master_port)
    refs = locate_mods(recipe, options.get("apply_mods") or ())
    container = ContainerSpec(recipe, topology, recipe.container,
                              privileged=recipe.container_settings.privileged and not options.get("non_privileged"),
                              cache_dirs=recipe.container_settings.cache_dirs and not options.get("no_cache_dirs"),
                              mods=load_mods(refs, recipe.source), pre_exec=recipe.pre_exec,
                              workload=str(workload or default_workload(recipe)),
                              ranks=len(nodes) if topology == "cluster-tp2" else None)
    b = PlanBuilder(recipe, topology, cluster, nodes, params, overrides, options, container,
                    notes=[n for n in (*notes, split_note, *applied) if n], runtime=runtime)
    if topology == "solo":
        endpoint, router = plan_solo(b)
    elif topology == "2x-solo":
        endpoint, router = plan_two_solo(b, router_choice)
    elif topology == "disagg":
        endpoint, router = plan_disagg(b)
    else:
        endpoint, router = plan_cluster(b, backend, master_port)
    plan = b.build(endpoint, router, backend if topology == "cluster-tp2" else None)
    return replace(plan, untrusted=untrusted_items(recipe, refs),
                   readiness=recipe.readiness or (Readiness() if recipe.v2 else None))


def _asked(recipe: Recipe, topology: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    return {**recipe.defaults, **recipe.topology_defaults.get(topology, {}),
            **{k: v for k, v in overrides.items() if v is not None}}


def _for_launch(recipe: Recipe, topology: str, split: tuple[int, int, int],
                overrides: Mapping[str, Any]) -> tuple[Recipe, list[str]]:
    """The recipe with the `overrides:` entries that match this launch applied (its tensor and pipeline split and
    node count as planned), and a note for each entry."""
    if not recipe.overrides:
        return recipe, []
    asked = _asked(recipe, topology, overrides)
    shape = {}
    for short, key in SHAPE.items():
        try:
            shape[short] = int(asked.get(key) or 1)
        except (TypeError, ValueError):
            shape[short] = 1
    shape.update(tp=split[0], pp=split[1])
    return for_launch(recipe, LaunchFacts(nodes=split[2], runtime=recipe.runtime, shape=shape, config=asked))


def with_runtime(recipe: Recipe) -> tuple[Recipe, Runtime, list[str]]:
    """The runtime the recipe runs (sparkconsole/runtimes.py; any other refused in one line naming it), and the
    recipe with a serve command: SGLang's and llama.cpp's generated from `defaults` when it has none (vLLM's is the
    reader's, recipes/generate.py)."""
    runtime = runtime_for(recipe.runtime, recipe.command, source=recipe.source)
    notes: list[str] = []
    if runtime.name != recipe.runtime and from_command(recipe.command):
        notes.append(f"the command starts {runtime.title}: planned as {runtime.title}")
    if not recipe.command.strip():
        recipe = replace(recipe, command=generate_command(runtime, recipe.model, dict(recipe.defaults),
                                                          source=recipe.source), command_generated=True)
        notes.append(f"the recipe has no command: {runtime.title}'s generated from its defaults")
    return recipe, runtime, notes


def _check_node_range(recipe: Recipe, count: int) -> None:
    hi = recipe.max_nodes
    if count < recipe.min_nodes or (hi is not None and count > hi):
        span = f"{recipe.min_nodes}" if hi == recipe.min_nodes else f"{recipe.min_nodes}–{hi if hi else 'any'}"
        raise UserError(f"recipe {recipe.key!r} runs on {span} nodes; this launch would use {count} "
                        "(tensor_parallel × pipeline_parallel)", file=recipe.source, field="min_nodes",
                        fix=f"pass --set tensor_parallel={max(recipe.min_nodes, 2)}, or choose a recipe for "
                            f"{count} nodes")


def _check_topology(recipe: Recipe, topology: str) -> None:
    if topology not in TOPOLOGIES:
        raise UserError(f"unknown topology {topology[:30]!r}", field="--topology", fix=f"use one of: {', '.join(TOPOLOGIES)}")
    if recipe.cluster_only and topology in ("solo", "2x-solo", "disagg"):
        # The recipe's own words, no more: cluster_only may be about memory, or about a model only tested over
        # nodes; the file does not say which.
        raise UserError(f"recipe {recipe.key!r} requires cluster mode (it sets cluster_only: true)",
                        file=recipe.source, field="cluster_only", fix="use --topology cluster-tp2")
    if recipe.solo_only and topology == "cluster-tp2":
        raise UserError(f"recipe {recipe.key!r} is solo only", file=recipe.source, field="solo_only",
                        fix="use --topology solo or 2x-solo")
    if topology not in recipe.topologies:
        raise UserError(f"recipe {recipe.key!r} does not support topology {topology}", file=recipe.source,
                        field="sparkconsole.topologies",
                        fix=f"use one of: {', '.join(recipe.topologies)}, or add {topology} to sparkconsole.topologies")
