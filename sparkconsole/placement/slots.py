"""The ports and container names a workload takes on its nodes, beside the workloads already there.

Two workloads on one node cannot share a container name or a listening port. A workload keeps what its recipe
asks for where that is free: its port (`defaults.port`, else the node's `vllm_port`), its router's port, and its
container name (the recipe's or the node's, with the workload's name added when it is not the recipe's own). What
another workload already holds moves it: the next port free on every node of the plan (a vllm-router also takes the
port above its own for its metrics), the container name with the workload's name added. A port the operator gave
(`--port`) never moves: taken, it is refused in one line naming whose it is, and so is a workload name that runs
already or that two workloads of one set share, and so is a container name the recipe itself gives
(`sparkconsole.container.name`) that another holds.

Pure: what runs comes in as `Taken` per node (built from the agents' container lists and the launches' labels).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import ClusterConfig
from ..errors import UserError

PORT_TRIES = 200


@dataclass
class Taken:
    """What one node's workloads hold: ports (with whose) and container names (with whose)."""
    ports: dict[int, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)


def taken_on(nodes: Iterable[Any], groups: Iterable[Any]) -> dict[str, Taken]:
    """node → what is held there: every container the node's Docker lists (running or not: a stopped one still
    holds its name), and the ports the launches serve on (their labels' URLs; a vllm-router's metrics port)."""
    out: dict[str, Taken] = {}
    for n in nodes:
        t = out.setdefault(str(n.name), Taken())
        for c in getattr(n, "containers", ()) or ():
            t.names.setdefault(c.name, f"container {c.name}")
    for g in groups:
        for m in g.members:
            t = out.setdefault(m.node, Taken())
            t.names[m.container] = g.name
            if m.port is not None and m.running:
                t.ports[m.port] = g.name
                if m.role == "router" and m.router == "vllm-router":
                    t.ports[m.port + 1] = f"{g.name} (its router's metrics)"
    return out


def check_names(names: Sequence[str], running: Iterable[str] = ()) -> None:
    """A workload name given twice in one set, or one that runs already, in one line."""
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise UserError(f"two workloads named {n!r}: each needs its own containers and port", field="--name",
                            fix="give each workload its own name: --name A --name B (in the order of the recipes)")
        seen.add(n)
    for n in names:
        if n in set(running):
            raise UserError(f"a workload named {n!r} runs already", field="--name",
                            fix=f"give this one another name (--name {n}-2), or act on the running one: "
                                f"sparkconsole recipe restart|stop {n}")


def slots(recipe: Any, topology: str, cluster: ClusterConfig, overrides: Mapping[str, Any],
          taken: Mapping[str, Taken]) -> dict[str, Any]:
    """Plan options that give this workload its own port, router port and container names on its nodes (empty
    when what it asks for is free). Raises UserError for a port the operator gave that another holds."""
    from ..launch.plan import make_plan

    opts: dict[str, Any] = {}
    plan = make_plan(recipe, topology, cluster, dict(overrides))
    nodes = list(plan.nodes)
    servers = [s for s in plan.services if s.role != "router" and s.url]
    router = next((s for s in plan.services if s.role == "router"), None)
    server_ports = {int(s.url.rsplit(":", 1)[1]) for s in servers if s.url}
    if len(server_ports) == 1 and topology != "disagg":
        (port,) = server_ports
        owner = _holder(port, nodes, taken)
        if owner is not None:
            if overrides.get("port") is not None:
                raise UserError(f"port {port} is taken on {owner[0]} by {owner[1]}", field="--port",
                                fix="leave --port out (a free port is chosen) or give a free one")
            opts["port"] = _free(port, nodes, taken)
    if router is not None and router.url:
        rport = int(router.url.rsplit(":", 1)[1])
        span = 2 if plan.router == "vllm-router" else 1
        if any(_holder(rport + i, [router.node], taken) for i in range(span)) or \
                (opts.get("port") is not None and opts["port"] in range(rport, rport + span)):
            opts["router_port"] = _free(rport, [router.node], taken, span=span, avoid={opts.get("port")})
    names = {}
    asked_name = recipe.container_settings.name
    for s in plan.services:
        if s.role == "router":
            continue
        holder = taken.get(s.node, Taken()).names.get(s.container)
        if holder is not None and s.container == asked_name:
            raise UserError(f"container {s.container} (the recipe's sparkconsole.container.name) is taken on "
                            f"{s.node} by {holder}", file=recipe.source, field="sparkconsole.container.name",
                            fix="give this workload its own name (--name): its containers are named after it")
        if holder is not None:
            names[s.node] = f"{s.container}_{plan.name}" if not s.container.endswith(f"_{plan.name}") \
                else f"{s.container}_2"
            if names[s.node] in taken.get(s.node, Taken()).names:
                raise UserError(f"container {s.container} and {names[s.node]} are both in use on {s.node}",
                                field="--name", fix="give the workload another name with --name")
    if names:
        opts["container_names"] = names
    return opts


def _holder(port: int, nodes: Sequence[str], taken: Mapping[str, Taken]) -> tuple[str, str] | None:
    for n in nodes:
        owner = taken.get(n, Taken()).ports.get(port)
        if owner is not None:
            return n, owner
    return None


def _free(start: int, nodes: Sequence[str], taken: Mapping[str, Taken], *, span: int = 1,
          avoid: Iterable[int | None] = ()) -> int:
    avoid_set = {a for a in avoid if a is not None}
    for p in range(start + 1, min(65536 - span, start + PORT_TRIES)):
        if all(_holder(p + i, nodes, taken) is None and p + i not in avoid_set for i in range(span)):
            return p
    raise UserError(f"no free port within {PORT_TRIES} above {start} on {', '.join(nodes)}", field="--port",
                    fix="give a free port with --port")


def hold(taken: dict[str, Taken], plan: Any) -> None:
    """Mark a placed plan's ports and containers as held (the next workload of a set goes beside it)."""
    for node, listens in plan.listens.items():
        t = taken.setdefault(node, Taken())
        for _, port in listens:
            t.ports.setdefault(port, plan.name)
    for s in plan.services:
        taken.setdefault(s.node, Taken()).names.setdefault(s.container, plan.name)
