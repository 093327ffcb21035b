"""What the recipe commands (commands/recipe.py, commands/recipe_workloads.py) read from the command line and the
nodes, and what they print and ask: `--set` overrides, the plan's nodes' facts for preflight, the runner's progress
lines, the confirmations (`--yes`, `--trust`). Like commands/recipe.py, the product is imported inside the
functions."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:
    from ..config import ClusterConfig
    from ..launch import lint as lint_mod
    from ..launch.progress import Progress
    from ..launch.steps import Plan
    from ..recipes import Recipe

FACTS_TIMEOUT_S = 15.0


def _value(text: str) -> Any:
    import yaml

    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return v if isinstance(v, (str, int, float, bool)) else text


def overrides_from_sets(sets: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in sets:
        key, sep, val = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UserError(f"bad --set {item[:40]!r}", field="--set", fix="write --set name=value")
        out[key.strip()] = _value(val)
    return out


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    out = overrides_from_sets(args.sets)
    for k in ("port", "host", "tensor_parallel", "gpu_memory_utilization", "max_model_len", "max_num_batched_tokens"):
        if getattr(args, k, None) is not None:
            out[k] = getattr(args, k)
    extra = list(getattr(args, "extra", None) or [])
    for k, v in (("nodes", args.nodes), ("extra_args", extra), ("router", args.router), ("backend", args.backend),
                 ("eth_if", args.eth_if), ("ib_if", args.ib_if), ("master_port", args.master_port),
                 ("drop_caches", args.drop_caches or None), ("apply_mods", getattr(args, "apply_mods", None)),
                 ("non_privileged", getattr(args, "non_privileged", None)),
                 ("no_cache_dirs", getattr(args, "no_cache_dirs", None)), ("workload", getattr(args, "name", None))):
        if v:
            out[k] = v
    return out


def _print_progress(verbose: bool) -> Callable[[Progress], None]:
    def show(ev: Progress) -> None:
        if ev.stage == "log" and not verbose:
            return
        print(f"{ev.node:>12}  {ev.stage:<8} {ev.message}", flush=True)
    return show


async def gather_facts(plan: Plan, cluster: ClusterConfig, recipe: Recipe,
                       monitor: Any = None) -> tuple[lint_mod.Facts, Any]:
    """Read the plan's nodes: one telemetry tick each (memory, guards, GPUs) and the image ID. Returns the
    facts and the running monitor, whose connections the runner then reuses (caller stops it). `monitor`: one
    already started over the cluster (a launch beside what runs read every node first)."""
    from ..config import ClusterConfig
    from ..launch import lint as lint_mod
    from ..nodes.monitor import ClusterMonitor
    from ..placement.modelinfo import read_node

    if monitor is None:
        sub = ClusterConfig(nodes=tuple(n for n in cluster.nodes if n.name in plan.nodes), endpoints=(),
                            thresholds=cluster.thresholds, ssh=cluster.ssh, agent_interval_s=cluster.agent_interval_s,
                            source=cluster.source, simulated=cluster.simulated)
        monitor = ClusterMonitor(sub, history=4)
        await monitor.start()
        await monitor.wait_first_ticks(FACTS_TIMEOUT_S)
    used = {n: nm for n, nm in monitor.nodes.items() if n in plan.nodes}
    facts = lint_mod.facts_from_monitors(used, headroom_floor_gib=cluster.thresholds.headroom_floor_gib)
    image_ids: dict[str, str | None] = {}
    for name, nm in used.items():
        if nm.transport is None:
            continue
        try:
            env = "".join(f"{k}={shlex.quote(v)} " for k, v in nm.config.env)
            res = await nm.transport.run(env + shlex.join(["docker", "image", "inspect", "-f", "{{.Id}}", plan.image]),
                                         timeout=30)
            image_ids[name] = (res.stdout.strip() or None) if res.rc == 0 else None
        except Exception:  # noqa: BLE001 — an unreadable node shows up as an unknown guard, not a crash
            continue
    # The model as each node's Hugging Face cache has it (the memory fit), and whether every node has it at all.
    info, missing = None, []
    source = lint_mod.plan_model(plan)
    if cluster.simulated:
        source = None           # a simulated node serves any model: its weights are nowhere to look for
    for name in plan.nodes:
        mon = monitor.nodes.get(name)
        if mon is None or mon.transport is None or not source:
            continue
        # the node's own environment in front (hf_home: where its cache is)
        got, absent = await read_node(mon.transport, source, getattr(recipe, "model_revision", None),
                                      env=mon.config.env)
        if absent:
            missing.append(name)
        elif info is None:
            info = got
    from ..launch.probe import probe_nodes
    busy, unreach = await probe_nodes(plan, cluster, {n: nm.transport for n, nm in used.items()
                                                      if nm.transport is not None})
    return replace(facts, image_ids=image_ids, model_info=info, busy_ports=busy, unreachable=unreach,
                   model_missing=tuple(missing)), monitor


def _confirm(args: argparse.Namespace, question: str) -> None:
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise UserError("this changes the nodes and there is no terminal to confirm on", field="--yes",
                        fix="add --yes to run it headless")
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise UserError("not confirmed", fix="answer y, or pass --yes")


def _confirm_trust(args: argparse.Namespace, plan: Plan) -> Plan:
    """What the plan runs as root on someone else's word (its 'needs confirmation' lines): --trust, or asked."""
    if not plan.untrusted or plan.trusted:
        return plan
    if not args.trust:
        if not sys.stdin.isatty():
            raise UserError(f"{len(plan.untrusted)} item(s) need confirmation, first: {plan.untrusted[0]}",
                            field="--trust", fix="read them in the plan above, then pass --trust to run them")
        answer = input(f"run the {len(plan.untrusted)} item(s) above marked 'needs confirmation'? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            raise UserError("not confirmed", field="--trust", fix="answer y, or pass --trust")
    return replace(plan, trusted=True)
