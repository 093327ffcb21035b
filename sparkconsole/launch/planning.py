"""What every topology's planner shares while it builds a plan: the recipe's values for this launch, the one
container spec, and the steps, services and listening ports gathered so far (launch/topologies.py adds to them,
launch/plan.py makes one and turns it into a Plan)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import ClusterConfig, NodeConfig
from ..errors import UserError
from ..recipes import Recipe
from ..recipes.envtemplate import render_env
from ..runtimes import RUNTIMES, VLLM, Runtime
from . import gate
from .argv import command_argv, has_flag, served_model
from .container import ContainerSpec
from .steps import Plan, Service, Step, url_host


def _iface(value: Any, node: str) -> str | None:
    if isinstance(value, Mapping):
        got = value.get(node)
        return str(got) if got is not None else None
    return str(value) if value is not None else None


def default_workload(recipe: Recipe) -> str:
    """A launch's name when none is given: its recipe's key, made a valid name (a registry's `@reg/name` becomes
    `reg-name`: the name goes into container names and labels)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", recipe.key).strip("-_.")[:63]
    return name or "workload"


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
    runtime: Runtime = RUNTIMES[VLLM]           # whose command every server runs (sparkconsole/runtimes.py)
    _unreleased: list[tuple[NodeConfig, str]] = field(default_factory=list)

    # --- what a node's server is called, where it listens, which link it uses --------------------------------
    @property
    def extra_args(self) -> tuple[str, ...]:
        return tuple(self.options.get("extra_args") or ())

    @property
    def workload(self) -> str:
        """The launch's name: `--name`, else the recipe's key (plan.OPTION_KEYS `workload`)."""
        return str(self.options.get("workload") or default_workload(self.recipe))

    def cname(self, node: NodeConfig) -> str:
        """The container's name on `node`: the one a running workload has (re-planned from its labels), else the
        recipe's or the node's, with the workload's name added when it is not the recipe's own: two workloads of
        one recipe, or of two recipes naming the same container, run side by side."""
        named = (self.options.get("container_names") or {}).get(node.name)
        if named:
            return str(named)
        base = self.recipe.container_settings.name or node.container
        return base if self.workload == default_workload(self.recipe) else f"{base}_{self.workload}"

    def router_port(self) -> int:
        """The router's port: `router_port` (a second routed workload beside a first), else the recipe's."""
        return int(self.options.get("router_port") or self.recipe.router.port)

    def claim(self, node: NodeConfig) -> int | None:
        """The memory the server on `node` claims (the launch's estimate), carried as a label for the budget."""
        got = (self.options.get("claims") or {}).get(node.name)
        return int(got) if got is not None else None

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
    def add_step(self, step: Step) -> None:
        """A step of the topology's own (waiting for the Ray cluster, a command run in a started container)."""
        self.steps.append(step)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def add_service(self, svc: Service) -> None:
        """A service that is not a vLLM server (a router): readiness waits for it, a stop removes it."""
        self.services.append(svc)

    def server_command(self, node: NodeConfig, port: int, *, multi_node: bool = False) -> tuple[list[str], bool]:
        """The recipe's command for a server on `node`, as argv (see argv.command_argv), in this plan's runtime."""
        return command_argv(self.recipe, self.server_params(node, port), self.extra_args, multi_node=multi_node,
                            runtime=self.runtime.name)

    def record_server(self, key: str, argv: Sequence[str]) -> None:
        """The argv a server runs, as preflight and the memory estimate read it (plan.server_args)."""
        self.server_args[key] = tuple(argv)

    def start_container(self, node: NodeConfig, role: str, env: Sequence[tuple[str, str]], params: Mapping[str, Any],
                        command: Sequence[str], svc: Service, what: str, mounts: Sequence[str] = (),
                        tmpfs: Sequence[str] = ()) -> None:
        """Prepare the node, start its container (gated on the mods), apply the mods; vLLM starts at release."""
        name = self.cname(node)
        self.steps += self.container.prepare(node, name, drop_caches=bool(self.options.get("drop_caches")))
        full_env = (*self.recipe_env(node, params).items(), *env, *node.vllm_env)
        self.steps.append(Step(node.name, what, self.container.run_argv(node, role, name, full_env, params, svc.url,
                                                                      command, mounts, tmpfs, model=svc.model,
                                                                      claim_b=self.claim(node)),
                               secrets=self.recipe.secrets, service=svc.key))
        self.steps += self.container.after_start(node, name, env)
        self._unreleased.append((node, name))
        self.services.append(svc)
        self.server_env[svc.key] = tuple(full_env)

    def recipe_env(self, node: NodeConfig, params: Mapping[str, Any]) -> dict[str, str]:
        """The recipe's env on this node: a v2 recipe's {config.x} and {launch.x} filled (recipes/envtemplate.py),
        after sparkrun's NODE_IP (the node's address on the cluster link), which v2 commands read."""
        if not self.recipe.v2:
            return dict(self.recipe.env)
        launch = {"num_nodes": len(self.nodes), "node_rank": self.nodes.index(node) if node in self.nodes else 0,
                  "node_host": self.link_address(node), "cluster_id": f"{self.recipe.key}:{self.topology}",
                  "model_revision": self.recipe.model_revision}
        return {"NODE_IP": self.link_address(node),
                **render_env(self.recipe.env, self.recipe.template_values(params), launch, self.recipe.source)}

    def start_server(self, node: NodeConfig, role: str, env: Sequence[tuple[str, str]], port: int,
                     argv_extra: Sequence[str] = (), url: bool = True, drain_gate: bool = False) -> Service:
        """One server of the plan's runtime; `drain_gate`: behind a router with no worker API, it carries vLLM's
        drain gate."""
        p = self.server_params(node, port)
        if drain_gate:
            argv_extra = [*argv_extra, *gate.MIDDLEWARE_ARGS]
        argv, shell = self.server_command(node, port, multi_node=self.topology == "cluster-tp2")
        if shell:
            argv = ["bash", "-c", argv[2] + (" " + shlex.join(argv_extra) if argv_extra else "")]
        else:
            argv = [*argv, *argv_extra]
            if self.runtime.name != VLLM and not has_flag(argv, "--port"):
                # The server listens where its runtime does by default, not where the plan would have put it.
                port = self.runtime.default_port
                self.note(f"the command names no --port: {self.runtime.title} listens on its default {port}")
        svc = Service(key=f"{node.name}/{role}", node=node.name, container=self.cname(node), role=role,
                      url=f"http://{url_host(node.address)}:{port}" if url else None,
                      model=served_model(self.recipe, argv, self.runtime), drain_gate=drain_gate,
                      health_path=self.runtime.health_path, models_path=self.runtime.models_path)
        if drain_gate:
            self.steps.append(gate.write_step(node.name))
        self.start_container(node, role, env, p, gate.wrap(argv) if drain_gate else argv, svc,
                             f"start {self.runtime.title} {role} ({self.container.image})",
                             (gate.mount(),) if drain_gate else (), (gate.tmpfs(),) if drain_gate else ())
        self.record_server(svc.key, argv)
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
                    cpu_build=self.runtime.name == VLLM and (dict(r.env).get("VLLM_TARGET_DEVICE") == "cpu"
                                                             or r.container_settings.gpus is None),
                    mods=tuple(m.name for m in self.container.mods),
                    mod_origins=tuple(m.origin for m in self.container.mods), pre_exec=len(self.container.pre_exec),
                    runtime=self.runtime.name, workload=self.workload)
