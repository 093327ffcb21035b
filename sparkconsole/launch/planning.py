"""What every topology's planner shares while it builds a plan: the recipe's values for this launch, the one
container spec, and the steps, services and listening ports gathered so far (launch/topologies.py adds to them,
launch/plan.py makes one and turns it into a Plan)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import ClusterConfig, NodeConfig
from ..errors import UserError
from . import gate
from .argv import command_argv, served_model
from .container import ContainerSpec
from .recipe import Recipe
from .steps import Plan, Service, Step, url_host


def _iface(value: Any, node: str) -> str | None:
    if isinstance(value, Mapping):
        got = value.get(node)
        return str(got) if got is not None else None
    return str(value) if value is not None else None


def node_iface(options: Mapping[str, Any], recipe: Recipe, node: NodeConfig, key: str) -> str | None:
    """--eth-if/--ib-if (one for all, or per node), else the node's own setting in the cluster file, else the
    recipe's."""
    return _iface(options.get(key), node.name) or getattr(node, key, None) or getattr(recipe.cluster, key)


@dataclass
class PlanBuilder:
    recipe: Recipe
    topology: str
    cluster: ClusterConfig
    nodes: list[NodeConfig]
    params: dict[str, Any]                      # placeholder values of this launch
    overrides: Mapping[str, Any]                # the operator's placeholder values (ports decide with them)
    options: Mapping[str, Any]                  # plan options (plan.OPTION_KEYS)
    container: ContainerSpec
    steps: list[Step] = field(default_factory=list)
    services: list[Service] = field(default_factory=list)
    server_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    server_env: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    listens: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _unreleased: list[tuple[NodeConfig, str]] = field(default_factory=list)

    # --- what a node's server is called, where it listens, which link it uses --------------------------------
    @property
    def extra_args(self) -> tuple[str, ...]:
        return tuple(self.options.get("extra_args") or ())

    def cname(self, node: NodeConfig) -> str:
        return self.recipe.container_settings.name or node.container

    def node_port(self, node: NodeConfig, explicit: int | None = None) -> int:
        """Where a server listens: a topology's own port (disagg's), else --port, else the recipe's port, as the
        runner serves it; only a recipe that names none takes the cluster file's vllm_port."""
        if explicit is not None:
            return explicit
        for source in (self.overrides, self.recipe.topology_defaults.get(self.topology, {}), self.recipe.defaults):
            if source.get("port") is not None:
                try:
                    return int(source["port"])
                except (TypeError, ValueError):
                    raise UserError(f"port {str(source['port'])[:20]!r} is not a number", file=self.recipe.source,
                                    field="defaults.port", fix="write a port number, e.g. 8000") from None
        return node.vllm_port

    def server_params(self, node: NodeConfig, port: int) -> dict[str, Any]:
        # node_address: a recipe can bind to the node's own address ({node_address}) instead of 0.0.0.0
        return {"node_address": node.address, **self.params, "port": port}

    def iface(self, node: NodeConfig, key: str) -> str | None:
        return node_iface(self.options, self.recipe, node, key)

    def link_address(self, node: NodeConfig) -> str:
        """The node's address on the link between the nodes (discovered on its cluster interface), else the one
        sparkconsole reaches it at over SSH."""
        return (self.options.get("cluster_addresses") or {}).get(node.name) or node.address

    def listen(self, node: NodeConfig, port: int | str | None, address: str | None = None) -> None:
        key = (address or node.address, int(port)) if port is not None else None
        if key is not None and key not in self.listens.setdefault(node.name, []):
            self.listens[node.name].append(key)

    # --- steps --------------------------------------------------------------------------------------------
    def start_container(self, node: NodeConfig, role: str, env: Sequence[tuple[str, str]], params: Mapping[str, Any],
                        command: Sequence[str], svc: Service, what: str, mounts: Sequence[str] = ()) -> None:
        """Prepare the node, start its container (gated on the mods), apply the mods; vLLM starts at release."""
        name = self.cname(node)
        self.steps += self.container.prepare(node, name, drop_caches=bool(self.options.get("drop_caches")))
        full_env = (*self.recipe.env.items(), *env, *node.vllm_env)
        self.steps.append(Step(node.name, what, self.container.run_argv(node, role, name, full_env, params, svc.url,
                                                                      command, mounts),
                               secrets=self.recipe.secrets, service=svc.key))
        self.steps += self.container.after_start(node, name, env)
        self._unreleased.append((node, name))
        self.services.append(svc)
        self.server_env[svc.key] = tuple(full_env)

    def start_server(self, node: NodeConfig, role: str, env: Sequence[tuple[str, str]], port: int,
                     argv_extra: Sequence[str] = (), url: bool = True, drain_gate: bool = False) -> Service:
        """One vLLM server; `drain_gate`: behind a router with no worker API, it carries the drain gate."""
        p = self.server_params(node, port)
        if drain_gate:
            argv_extra = [*argv_extra, *gate.MIDDLEWARE_ARGS]
        argv, shell = command_argv(self.recipe, p, self.extra_args, multi_node=self.topology == "cluster-tp2")
        if shell:
            argv = ["bash", "-c", argv[2] + (" " + shlex.join(argv_extra) if argv_extra else "")]
        else:
            argv = [*argv, *argv_extra]
        svc = Service(key=f"{node.name}/{role}", node=node.name, container=self.cname(node), role=role,
                      url=f"http://{url_host(node.address)}:{port}" if url else None,
                      model=served_model(self.recipe, argv), drain_gate=drain_gate)
        if drain_gate:
            self.steps.append(gate.write_step(node.name))
        self.start_container(node, role, env, p, gate.wrap(argv) if drain_gate else argv, svc,
                             f"start vLLM {role} ({self.container.image})", (gate.mount(),) if drain_gate else ())
        self.server_args[svc.key] = tuple(argv)
        if url:
            self.listen(node, port)
        return svc

    def release(self) -> None:
        """vLLM starts in every container started so far, now that each has its mods (nothing without mods)."""
        for node, name in self._unreleased:
            self.steps += self.container.release(node, name)
        self._unreleased.clear()

    def build(self, endpoint: str | None, router: str | None, backend: str | None) -> Plan:
        self.release()
        r = self.recipe
        return Plan(recipe=r.key, recipe_name=r.name, topology=self.topology, nodes=tuple(n.name for n in self.nodes),
                    steps=tuple(self.steps), services=tuple(self.services), endpoint=endpoint, router=router,
                    backend=backend, image=self.container.image, params=self.params, server_args=self.server_args,
                    notes=tuple(self.notes), server_env=self.server_env,
                    listens={k: tuple(v) for k, v in self.listens.items()},
                    cpu_build=dict(r.env).get("VLLM_TARGET_DEVICE") == "cpu" or r.container_settings.gpus is None,
                    mods=tuple(m.name for m in self.container.mods))
