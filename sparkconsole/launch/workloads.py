"""The workloads running on a cluster, read from the nodes' Docker, and one of them planned again from its labels:
`recipe status|restart|stop NAME` act on one workload by name and never touch another.

Several workloads may run from one recipe (each launched with its own `--name`), on one node or several. Each is
found by its containers' labels (nodes/launches.py), and planned again with what it was launched with: its nodes
(head first), its port, its router and the router's port, its containers' names. The plan of its recipe alone
would name the recipe's container and port, which on a node running several workloads may be another's.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ..config import ClusterConfig
from ..errors import UserError
from ..nodes.launches import LABEL, VLLM_ROLES, LaunchGroup, find_workload, launch_groups
from ..nodes.samples import ContainerInfo
from .steps import Plan, Service

READ_TIMEOUT_S = 30.0
# every container a launch started, as `docker inspect` describes it (labels, state): one command per node
LIST_CMD = (f"ids=$(docker ps -aq --filter label={LABEL}recipe) || exit $?; "
            'if [ -z "$ids" ]; then echo "[]"; else docker inspect $ids; fi')


class NodeContainers:
    """One node's containers, shaped as launch_groups reads a node monitor."""

    def __init__(self, name: str, containers: Sequence[ContainerInfo]) -> None:
        self.name, self.containers = name, tuple(containers)


def parse_inspect(text: str) -> list[ContainerInfo]:
    """`docker inspect` JSON → the agent's ContainerInfo (name, state, exit code, OOM flag, sparkconsole labels)."""
    try:
        docs = json.loads(text or "[]")
    except ValueError:
        return []
    out = []
    for d in docs if isinstance(docs, list) else []:
        if not isinstance(d, dict):
            continue
        st = d.get("State") or {}
        labels = {k: v for k, v in ((d.get("Config") or {}).get("Labels") or {}).items()
                  if isinstance(k, str) and k.startswith(LABEL) and isinstance(v, str)}
        out.append(ContainerInfo.from_json({"name": str(d.get("Name") or "?").lstrip("/"), "state": st.get("Status"),
                                            "exit_code": st.get("ExitCode"), "oom_killed": st.get("OOMKilled"),
                                            "labels": labels}))
    return out


async def read_nodes(cluster: ClusterConfig, transports: Mapping[str, Any]) -> tuple[list[NodeContainers], list[str]]:
    """Each reachable node's labelled containers; and the nodes that could not be read (left out)."""
    def prefix(node: str) -> str:
        return "".join(f"{k}={shlex.quote(v)} " for k, v in cluster.node(node).env)

    async def one(name: str) -> NodeContainers | None:
        t = transports.get(name)
        if t is None:
            return None
        try:
            res = await t.run(prefix(name) + "sh -c " + shlex.quote(LIST_CMD), timeout=READ_TIMEOUT_S)
        except Exception:  # noqa: BLE001 — an unreadable node is named as such, it does not stop the command
            return None
        return NodeContainers(name, parse_inspect(res.stdout)) if res.rc == 0 else None

    got = await asyncio.gather(*(one(n.name) for n in cluster.nodes))
    read = [g for g in got if g is not None]
    missed = [n.name for n, g in zip(cluster.nodes, got, strict=True) if g is None]
    return read, missed


def replan_options(group: LaunchGroup) -> dict[str, Any]:
    """The plan options that plan a running workload again as it was launched (see the module's docstring)."""
    out: dict[str, Any] = {}
    if group.workload:
        out["workload"] = group.workload
    # the head first: where the router runs (2x-solo, disagg), prefill (disagg), the serving rank (cluster)
    head = next((m.node for role in ("router", "prefill", "server") for m in group.members
                 if m.role == role and (m.url or role != "server")), None)
    order = list(dict.fromkeys([*([head] if head else []), *(m.node for m in group.members)]))
    if order:
        out["nodes"] = order
    ports = {m.port for m in group.members if m.role == "server" and m.url}
    if len(ports) == 1 and None not in ports:
        out["port"] = ports.pop()
    router = next((m for m in group.members if m.role == "router"), None)
    if router is not None:
        if router.router:
            out["router"] = router.router
        if router.port is not None:
            out["router_port"] = router.port
    names = {m.node: m.container for m in group.members if m.role != "router"}
    if names:
        out["container_names"] = names
    return out


def running_options(group: LaunchGroup) -> dict[str, Any]:
    """The options the console's r / s plan a running launch with: what replan_options gives, without the
    nodes of an unnamed launch (planned as its recipe places it, as before workloads had names)."""
    out = replan_options(group)
    if not group.workload:
        out.pop("nodes", None)
        out.pop("container_names", None)
    return out


def resolve(groups: Sequence[LaunchGroup], name: str, *, recipe_key: str | None = None,
            topology: str | None = None) -> LaunchGroup | None:
    """The workload `name` names: a running workload of that name, else (a recipe given) the one workload running
    from that recipe (and topology). Several from one recipe: refused, naming them."""
    g = find_workload(groups, name)
    if g is not None:
        return g
    if recipe_key is None:
        return None
    mine = [g for g in groups if g.recipe == recipe_key and (topology is None or g.topology == topology)]
    if len(mine) > 1:
        names = ", ".join(g.name for g in mine)
        raise UserError(f"{len(mine)} workloads run from recipe {recipe_key}: {names}", field="--name",
                        fix=f"name the one to act on: --name {mine[0].name} (or give its name instead of the recipe)")
    return mine[0] if mine else None


def not_running(name: str, groups: Sequence[LaunchGroup], missed: Sequence[str] = ()) -> UserError:
    running = ", ".join(sorted(g.name for g in groups)) or "none"
    unread = f" ({', '.join(missed)} not read)" if missed else ""
    return UserError(f"no workload named {name!r} is running{unread}", field="--name",
                     fix=f"name a running one ({running}), or launch it: sparkconsole recipe launch RECIPE --name {name}")


def groups_of(nodes: Sequence[NodeContainers]) -> list[LaunchGroup]:
    """The workloads on the nodes read (nodes/launches.py groups)."""
    return launch_groups(nodes)


def plan_of(group: LaunchGroup) -> Plan:
    """A running workload as a plan of its containers alone (no steps): what `recipe status` judges and `recipe
    stop` stops, recipe file or not."""
    services = []
    for m in group.members:
        litellm = m.role == "router" and m.router not in (None, "vllm-router")
        services.append(Service(key=f"{m.node}/{m.role}", node=m.node, container=m.container, role=m.role,
                                url=m.url, model=m.model if m.role in (*VLLM_ROLES, "router") else None,
                                health_path="/health/liveliness" if litellm else "/health",
                                models_path=None if litellm else "/v1/models"))
    return Plan(recipe=group.recipe, recipe_name=group.recipe, topology=group.topology, nodes=group.nodes, steps=(),
                services=tuple(services), endpoint=group.endpoint, router=group.router, workload=group.name)
