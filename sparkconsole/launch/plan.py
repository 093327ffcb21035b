"""Recipe × topology × nodes → the exact commands each node runs, in order, shown before anything runs.

Plans hold argv lists (rendered with shlex.join, so every value reaching a remote shell is quoted). Secrets
are passed by reference: `-e HF_TOKEN` reads the value from the docker client's environment on the node, or
`HF_TOKEN="$(cat -- FILE)"` reads it from a file on the node; a plan never holds a secret's value.

Topologies:
- solo:        one vLLM container on one node (`--node`, default the head).
- cluster-tp2: one vLLM instance across N nodes (default 2). Backend mp (default): vLLM's own multi-node
               launch, `--nnodes N --node-rank R --master-addr HEAD --master-port P`, `--headless` on workers,
               as spark-vllm-docker's launch-cluster.sh does; backend ray: `ray start` on each node, then
               `vllm serve … --distributed-executor-backend ray` on the head.
- 2x-solo:     one server per node plus a router on the head: vllm-router (default), or a LiteLLM proxy with
               simple-shuffle / least-busy to reproduce the published study.
- disagg:      prefill on the first node, decode on the second, NixlConnector KV transfer, and
               `vllm-router --vllm-pd-disaggregation` in front.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..config import ClusterConfig, NodeConfig
from ..errors import UserError
from .recipe import ROUTER_CHOICES, TOPOLOGIES, Recipe, RouterImpl, SecretRef, fill

SHELL_OPERATORS = {"&&", "||", ";", "|", ">", ">>", "<", "&"}
# `ray status` lists each live node as " 1 node_<id>" under "Active:"
RAY_NODE_LINE = r"^\s*1 node_[0-9a-f]+"
RAY_JOIN_TIMEOUT_S = 120.0
# A server started by `docker exec` (vLLM on a Ray cluster) is not the container's main process: its end is
# written to the container log as this line and its exit code.
EXIT_MARK = "sparkconsole: vLLM exited with code"
# Added first-token latency measured on this project's test bed (docs/testbed notes): shown in the plan.
ROUTER_OVERHEAD_NOTE = {
    "vllm-router": "vllm-router added about 0.5 ms to first token on the test bed",
    "litellm": "LiteLLM proxy added about 12 ms to first token on the test bed (single event loop, ~1,500 chunks/s)",
}
# Plan options taken out of overrides; every other override key is a placeholder value.
# LiteLLM releases from a supply-chain attack (seed 001): refused when planned, linted and launched.
COMPROMISED_LITELLM = ("1.82.7", "1.82.8")


def compromised_versions(impl: RouterImpl, *, litellm: bool) -> list[str]:
    """The compromised LiteLLM versions a router pin names (its version or its image tag)."""
    if not litellm and "litellm" not in (impl.image or "").lower():
        return []
    tag = (impl.image or "").rsplit("/", 1)[-1].partition(":")[2]
    found = {impl.version or "", *re.findall(r"\d+\.\d+\.\d+", tag)}
    return sorted(v for v in found if v in COMPROMISED_LITELLM)


OPTION_KEYS = {"nodes", "extra_args", "backend", "router", "drop_caches", "eth_if", "ib_if", "master_port",
               "router_dir"}


@dataclass(frozen=True)
class Step:
    node: str
    what: str                                   # what it is, in words
    argv: tuple[str, ...]
    change: bool = True                         # changes the node: confirmed and written to the audit log
    input: bytes | None = None                  # stdin (a config file's text)
    secrets: tuple[SecretRef, ...] = ()         # read on the node at run time, by reference
    tolerate: tuple[str, ...] = ()              # stderr text that still counts as success
    service: str | None = None                  # the service this step starts
    expect: tuple[str, int] | None = None       # (regex, n): success needs n stdout lines matching it…
    retry_s: float = 0.0                        # …tried again each second for this long

    def shell(self) -> str:
        """The command line as the node's shell gets it: argv quoted, file secrets read there."""
        prefix = []
        for s in self.secrets:
            if s.source.startswith("file:"):
                path = s.source[5:]
                quoted = '"$HOME"/' + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)
                prefix.append(f'{s.name}="$(cat -- {quoted})"')
        return " ".join([*prefix, shlex.join(self.argv)])


@dataclass(frozen=True)
class Service:
    """Something a plan starts and the runner follows: a vLLM server, a headless worker, or a router."""
    key: str                                    # unique in the plan, e.g. "spark1/server"
    node: str
    container: str
    role: str                                   # server | worker | router | prefill | decode
    url: str | None                             # base URL answering health and /v1/models; None: headless
    model: str | None = None                    # served model name expected in /v1/models
    health_path: str = "/health"
    models_path: str | None = "/v1/models"

    @property
    def logs_argv(self) -> tuple[str, ...]:
        return ("docker", "logs", "-f", "--tail", "200", self.container)

    @property
    def state_argv(self) -> tuple[str, ...]:
        return ("docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}",
                self.container)

    def stop_steps(self) -> tuple[Step, ...]:
        return (Step(self.node, f"stop {self.role} container {self.container}",
                     ("docker", "stop", "-t", "30", self.container), tolerate=("No such container",)),
                Step(self.node, f"remove container {self.container}", ("docker", "rm", self.container),
                     tolerate=("No such container", "is already in progress")))

    def restart_step(self) -> Step:
        return Step(self.node, f"restart {self.role} container {self.container}",
                    ("docker", "restart", "-t", "30", self.container))


@dataclass(frozen=True)
class Plan:
    recipe: str                                 # recipe key
    recipe_name: str
    topology: str
    nodes: tuple[str, ...]
    steps: tuple[Step, ...]
    services: tuple[Service, ...]
    endpoint: str | None                        # the URL clients use
    router: str | None = None                   # vllm-router | simple-shuffle | least-busy
    backend: str | None = None                  # mp | ray (cluster)
    image: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    server_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # service key → vLLM argv
    notes: tuple[str, ...] = ()
    server_env: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)  # service key → its env
    listens: Mapping[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)     # node → (address, port)
    cpu_build: bool = False                     # vLLM's CPU platform (VLLM_TARGET_DEVICE=cpu, or no --gpus)

    def for_node(self, node: str) -> list[Step]:
        return [s for s in self.steps if s.node == node]

    def service(self, key: str) -> Service:
        return next(s for s in self.services if s.key == key)

    @property
    def restartable_in_place(self) -> bool:
        # A tensor-parallel group must come up together; single-node servers can restart one by one.
        return self.topology != "cluster-tp2"

    def render(self, addresses: Mapping[str, str] | None = None) -> str:
        from .. import secrets as _secrets
        lines = [f"Plan: {self.recipe} ({self.recipe_name}) × {self.topology} on {', '.join(self.nodes)}"]
        if self.endpoint:
            lines.append(f"Endpoint: {self.endpoint}")
        order = {id(s): i + 1 for i, s in enumerate(self.steps)}   # numbers give the execution order
        for node in self.nodes:
            steps = self.for_node(node)
            if not steps:
                continue
            addr = f" {addresses[node]}" if addresses and node in addresses else ""
            lines.append(f"[{node}{addr}]")
            for s in steps:
                lines.append(f"  {order[id(s)]}. {s.what}")
                lines.append(f"     $ {_secrets.redact(s.shell())}")
                if s.input is not None:
                    lines.append("     (stdin: " + _secrets.redact(s.input.decode("utf-8", "replace")).strip()
                                 .replace("\n", "\n             ") + ")")
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)


# --- building ----------------------------------------------------------------------------------------------

def _url_host(address: str) -> str:
    try:
        if ipaddress.ip_address(address).version == 6:
            return f"[{address}]"
    except ValueError:
        pass
    return address


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


def command_argv(recipe: Recipe, params: Mapping[str, Any], extra_args: Sequence[str] = (), *,
                 multi_node: bool = False) -> tuple[list[str], bool]:
    """The recipe's command as argv: the template split into words first, then each word's placeholders
    filled, so a value can never become several arguments. The executor flag is the topology's business where
    it must be: a multi-node launch drops any (it adds ray, or mp's default serves), a one-node launch drops
    only `ray` (it would need a Ray cluster nobody started) and keeps `uni` or `mp`. Returns (argv, shell):
    shell when the command uses shell operators and runs under `bash -c`, its values then quoted for that
    shell."""
    recipe.render_command(params)            # names a missing placeholder with the file and line
    # The runner writes the command into a bash script: read it as bash does (comments dropped, a line that
    # does not end in a backslash ends the command). One command → argv; several → the shell path below.
    from .bashread import bash_command_lines
    commands = [text for _, text in bash_command_lines(recipe.command)]
    template = "\n".join(commands)
    if len(commands) > 1:
        quoted = {k: shlex.quote(str(_plain(v))) for k, v in params.items()}
        text = template.format(**quoted)
        return ["bash", "-c", " ".join([text, *map(shlex.quote, extra_args)])], True
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise UserError(f"the command cannot be split into arguments ({exc})", file=recipe.source,
                        line=recipe.command_line, field="command", fix="balance the quotes in the command") from None
    if not words:
        raise UserError("the command is empty", file=recipe.source, line=recipe.command_line, field="command",
                        fix="write the vllm serve command")
    if any(w in SHELL_OPERATORS for w in words):
        quoted = {k: shlex.quote(str(_plain(v))) for k, v in params.items()}
        text = template.format(**quoted)
        return ["bash", "-c", " ".join([text, *map(shlex.quote, extra_args)])], True
    values = {k: _plain(v) for k, v in params.items()}
    argv = [w.format(**values) for w in words]
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--distributed-executor-backend" or a.startswith("--distributed-executor-backend="):
            value = a.partition("=")[2] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
            if multi_node or value == "ray":
                i += 1 if "=" in a else 2
                continue
        out.append(a)
        i += 1
    return [*out, *extra_args], False


def _plain(v: Any) -> Any:
    if isinstance(v, bool):
        return "true" if v else "false"
    return v


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The last value of a flag written `--flag V` or `--flag=V` (vLLM: last one wins)."""
    found = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                found = argv[i + 1]
            elif a.startswith(n + "="):
                found = a[len(n) + 1:]
    return found


def has_flag(argv: Sequence[str], *names: str) -> bool:
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in argv)


def served_model(recipe: Recipe, argv: Sequence[str]) -> str | None:
    name = flag_value(argv, "--served-model-name")
    if name:
        return name
    for i, a in enumerate(argv[:-1]):
        if a == "serve" and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return flag_value(argv, "--model") or recipe.model


def _iface(value: Any, node: str) -> str | None:
    if isinstance(value, Mapping):
        return value.get(node)
    return value


# Where router configs go on the head node. Not a valid Python package name on purpose: a directory called
# "sparkconsole" in /tmp would shadow the real package for any script run from /tmp.
DEFAULT_ROUTER_DIR = "/tmp/sparkconsole-router"


def _node_iface(options: Mapping[str, Any], recipe_value: str | None, node: NodeConfig, key: str) -> str | None:
    """--eth-if/--ib-if, else the node's own setting in the cluster file (when it has one), else the recipe's."""
    return (_iface(options.get(key), node.name) or getattr(node, key, None) or recipe_value)


def _docker_run(recipe: Recipe, topology: str, role: str, node: NodeConfig, name: str,
                env: Sequence[tuple[str, str]], params: Mapping[str, Any], image: str,
                secrets: Sequence[SecretRef]) -> list[str]:
    cs = recipe.container_settings
    # The labels let the console group one launch's containers across nodes (launch/members.py), also where
    # several "nodes" share one Docker engine, as on the test bed.
    argv = ["docker", "run", "-d", "--name", name,
            "--label", f"sparkconsole.recipe={recipe.key}", "--label", f"sparkconsole.topology={topology}",
            "--label", f"sparkconsole.role={role}", "--label", f"sparkconsole.node={node.name}",
            "--network", "host"]
    if cs.gpus:
        argv += ["--gpus", cs.gpus]
    if cs.ipc_host:
        argv.append("--ipc=host")
    elif cs.shm_size:
        argv += ["--shm-size", cs.shm_size]
    if cs.init:
        argv.append("--init")
    if cs.memory:
        # memory-swap equal to memory: no swap inside the container either (seed 004: swap on UMA spirals)
        argv += ["--memory", cs.memory, "--memory-swap", cs.memory]
    for v in cs.volumes:
        argv += ["-v", fill(v, params, recipe.source, None, "sparkconsole.container.volumes")]
    for t in cs.tmpfs:
        argv += ["--tmpfs", t]
    for k, v in env:
        argv += ["-e", f"{k}={v}"]
    for s in secrets:
        argv += ["-e", s.name]
    argv += ["--entrypoint=", image]
    return argv


def make_plan(recipe: Recipe, topology: str, cluster: ClusterConfig, overrides: Mapping[str, Any] | None = None) -> Plan:
    """Every command for every node, in order (head first). Raises UserError for what cannot be planned."""
    overrides = dict(overrides or {})
    if topology not in TOPOLOGIES:
        raise UserError(f"unknown topology {topology[:30]!r}", field="--topology", fix=f"use one of: {', '.join(TOPOLOGIES)}")
    if recipe.cluster_only and topology in ("solo", "2x-solo", "disagg"):
        raise UserError(f"recipe {recipe.key!r} requires cluster mode (the model is too large for one node)",
                        file=recipe.source, field="cluster_only", fix="use --topology cluster-tp2")
    if recipe.solo_only and topology == "cluster-tp2":
        raise UserError(f"recipe {recipe.key!r} is solo only", file=recipe.source, field="solo_only",
                        fix="use --topology solo or 2x-solo")
    if topology not in recipe.topologies:
        raise UserError(f"recipe {recipe.key!r} does not support topology {topology}", file=recipe.source,
                        field="sparkconsole.topologies",
                        fix=f"use one of: {', '.join(recipe.topologies)}, or add {topology} to sparkconsole.topologies")
    options = {k: overrides.pop(k) for k in list(overrides) if k in OPTION_KEYS}
    asked = {**recipe.defaults, **recipe.topology_defaults.get(topology, {}),
             **{k: v for k, v in overrides.items() if v is not None}}
    split_note = None
    if topology == "cluster-tp2":
        tp_, pp_, count, split_note = cluster_split(
            asked, len(options["nodes"]) if options.get("nodes") else None,
            explicit=any(overrides.get(k) is not None for k in ("tensor_parallel", "pipeline_parallel")))
        nodes = select_nodes(topology, cluster, options.get("nodes"), count)
    else:
        nodes = select_nodes(topology, cluster, options.get("nodes"))
    extra_args = tuple(options.get("extra_args") or ())
    backend = options.get("backend") or recipe.cluster.backend
    if backend not in ("mp", "ray"):
        raise UserError(f"unknown backend {str(backend)[:20]!r}", field="--backend", fix="use mp or ray")
    router_choice = options.get("router") or recipe.router.default
    if router_choice not in ROUTER_CHOICES:
        raise UserError(f"unknown router {str(router_choice)[:30]!r}", field="--router", fix=f"use one of: {', '.join(ROUTER_CHOICES)}")
    master_port = int(options.get("master_port") or recipe.cluster.master_port)
    image = recipe.container

    # Single-node servers run with TP=1, as run-recipe.sh --solo does (--set can still ask otherwise); a cluster
    # runs the recipe's own split over as many nodes (cluster_split).
    if topology == "cluster-tp2":
        params = {**asked, "tensor_parallel": tp_, "pipeline_parallel": pp_}
    else:
        params = {**recipe.defaults, "tensor_parallel": 1, **recipe.topology_defaults.get(topology, {})}
        params.update({k: v for k, v in overrides.items() if v is not None})
    params.setdefault("host", "0.0.0.0")

    steps: list[Step] = []
    services: list[Service] = []
    server_args: dict[str, tuple[str, ...]] = {}
    server_env: dict[str, tuple[tuple[str, str], ...]] = {}
    listens: dict[str, list[tuple[str, int]]] = {}
    notes: list[str] = [split_note] if split_note else []

    def listen(node: NodeConfig, port: int | str | None) -> None:
        if port is not None and (node.address, int(port)) not in listens.setdefault(node.name, []):
            listens[node.name].append((node.address, int(port)))
    secrets = recipe.secrets
    base_name = recipe.container_settings.name

    def cname(node: NodeConfig) -> str:
        return base_name or node.container

    def node_port(node: NodeConfig, explicit: int | None = None) -> int:
        """Where a server listens: a topology's own port (disagg's), else --port, else the recipe's port, as the
        runner serves it; only a recipe that names none takes the cluster file's vllm_port."""
        if explicit is not None:
            return explicit
        for source in (overrides, recipe.topology_defaults.get(topology, {}), recipe.defaults):
            if source.get("port") is not None:
                try:
                    return int(source["port"])
                except (TypeError, ValueError):
                    raise UserError(f"port {str(source['port'])[:20]!r} is not a number", file=recipe.source,
                                    field="defaults.port", fix="write a port number, e.g. 8000") from None
        return node.vllm_port

    def server_params(node: NodeConfig, port: int) -> dict[str, Any]:
        # node_address: a recipe can bind to the node's own address ({node_address}) instead of 0.0.0.0
        return {"node_address": node.address, **params, "port": port}

    def pre_steps(node: NodeConfig, name: str) -> None:
        if options.get("drop_caches"):
            steps.append(Step(node.name, "drop the page cache before the model load (seed 004)",
                              ("sh", "-c", 'sync; if [ "$(id -u)" = 0 ]; then echo 3 > /proc/sys/vm/drop_caches; '
                                           'else sudo -n sh -c "echo 3 > /proc/sys/vm/drop_caches"; fi')))
        # `docker rm` refuses a running container: a launch never replaces a server someone else left running.
        steps.append(Step(node.name, f"remove a stopped leftover container {name} (refused if it is running)",
                          ("docker", "rm", name), tolerate=("No such container",)))

    def start_server(node: NodeConfig, role: str, env: list[tuple[str, str]], port: int,
                     argv_extra: Sequence[str] = (), url: bool = True) -> Service:
        name = cname(node)
        p = server_params(node, port)
        argv, _shell = command_argv(recipe, p, extra_args, multi_node=topology == "cluster-tp2")
        if _shell:
            argv = ["bash", "-c", argv[2] + (" " + shlex.join(argv_extra) if argv_extra else "")]
        else:
            argv = [*argv, *argv_extra]
        full_env = [*recipe.env.items(), *env, *node.vllm_env]
        pre_steps(node, name)
        svc = Service(key=f"{node.name}/{role}", node=node.name, container=name, role=role,
                      url=f"http://{_url_host(node.address)}:{port}" if url else None,
                      model=served_model(recipe, argv))
        steps.append(Step(node.name, f"start vLLM {role} ({image})",
                          tuple(_docker_run(recipe, topology, role, node, name, full_env, p, image, secrets) + argv),
                          secrets=secrets, service=svc.key))
        services.append(svc)
        server_args[svc.key] = tuple(argv)
        server_env[svc.key] = tuple(full_env)
        if url:
            listen(node, port)
        return svc

    endpoint: str | None = None
    router_used: str | None = None
    if topology == "solo":
        node = nodes[0]
        svc = start_server(node, "server", [], node_port(node))
        endpoint = svc.url
    elif topology == "2x-solo":
        servers = [start_server(n, "server", [], node_port(n)) for n in nodes]
        router_used = router_choice
        endpoint = _add_router(recipe, topology, router_choice, nodes[0], servers, steps, services, notes, params,
                               options.get("router_dir") or DEFAULT_ROUTER_DIR, listens)
    elif topology == "disagg":
        prefill, decode = nodes
        servers = []
        for node, role, port in ((prefill, "prefill", recipe.disagg.prefill_port),
                                 (decode, "decode", recipe.disagg.decode_port)):
            # kv_both is deprecated in vLLM 0.32: each side says which way its KV cache goes.
            kv_cfg = {"kv_connector": recipe.disagg.connector,
                      "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"}
            if recipe.disagg.kv_buffer_device:
                kv_cfg["kv_buffer_device"] = recipe.disagg.kv_buffer_device
            kv = json.dumps(kv_cfg, separators=(",", ":"))
            env = [("VLLM_NIXL_SIDE_CHANNEL_HOST", node.address),
                   ("VLLM_NIXL_SIDE_CHANNEL_PORT", str(recipe.disagg.side_channel_port))]
            eth = _node_iface(options, recipe.cluster.eth_if, node, "eth_if")
            if eth:
                env.append(("UCX_NET_DEVICES", eth))
            probe, _ = command_argv(recipe, server_params(node, node_port(node, port)), extra_args)
            extra = [] if has_flag(probe, "--kv-transfer-config") else ["--kv-transfer-config", kv]
            servers.append(start_server(node, role, env, node_port(node, port), extra))
            listen(node, recipe.disagg.side_channel_port)
        router_used = "vllm-router"
        endpoint = _add_router(recipe, topology, "vllm-router", prefill, servers, steps, services, notes, params,
                               options.get("router_dir") or DEFAULT_ROUTER_DIR, listens, disagg=True)
    else:  # cluster-tp2
        head = nodes[0]
        port = node_port(head)
        tp, pp = int(params.get("tensor_parallel", 1)), int(params.get("pipeline_parallel", 1) or 1)
        if tp * pp != len(nodes):
            notes.append(f"tensor_parallel {tp} × pipeline_parallel {pp} ≠ {len(nodes)} nodes of one GPU each")
        ifaces = {}
        for n in nodes:
            eth = _node_iface(options, recipe.cluster.eth_if, n, "eth_if")
            if not eth:
                raise UserError("a cluster launch needs the network interface that links the nodes", file=recipe.source,
                                field="sparkconsole.cluster.eth_if",
                                fix="set sparkconsole.cluster.eth_if in the recipe (e.g. enp1s0f0np0) or pass --eth-if")
            ifaces[n.name] = (eth, _node_iface(options, recipe.cluster.ib_if, n, "ib_if"))

        def node_env(n: NodeConfig) -> list[tuple[str, str]]:
            eth, ib = ifaces[n.name]
            # As spark-vllm-docker's launch-cluster.sh sets them: pin every library to the node-to-node link.
            env = [("VLLM_HOST_IP", n.address), ("NCCL_SOCKET_IFNAME", eth), ("GLOO_SOCKET_IFNAME", eth),
                   ("TP_SOCKET_IFNAME", eth), ("UCX_NET_DEVICES", eth), ("OMPI_MCA_btl_tcp_if_include", eth),
                   ("NCCL_IGNORE_CPU_AFFINITY", "1")]
            if ib:
                env += [("NCCL_IB_HCA", ib), ("NCCL_IB_DISABLE", "0")]
            if backend == "ray":
                env += [("RAY_NODE_IP_ADDRESS", n.address), ("RAY_OVERRIDE_NODE_IP_ADDRESS", n.address),
                        ("RAY_memory_monitor_refresh_ms", "0")]
            return env

        listen(head, master_port)
        if backend == "mp":
            for rank, n in enumerate(nodes):
                mn = ["--nnodes", str(len(nodes)), "--node-rank", str(rank), "--master-addr", head.address,
                      "--master-port", str(master_port)]
                if rank > 0:
                    mn.append("--headless")
                svc = start_server(n, "server" if rank == 0 else "worker", node_env(n), port, mn, url=rank == 0)
                if rank == 0:
                    endpoint = svc.url
        else:
            argv, shell = command_argv(recipe, server_params(head, port), extra_args, multi_node=True)
            ray_cli = [fill(w, params, recipe.source, None, "sparkconsole.cluster.ray") for w in recipe.cluster.ray]
            for rank, n in enumerate(nodes):
                name = cname(n)
                pre_steps(n, name)
                ray = ([*ray_cli, "start", "--block", "--head", "--port", str(master_port)] if rank == 0 else
                       [*ray_cli, "start", "--block", "--address", f"{_url_host(head.address)}:{master_port}"])
                ray += ["--node-ip-address", n.address, "--disable-usage-stats"]
                role = "server" if rank == 0 else "worker"
                # The head's container is the server: it answers once vLLM (started below) is up.
                svc = Service(key=f"{n.name}/{role}", node=n.name, container=name, role=role,
                              url=f"http://{_url_host(head.address)}:{port}" if rank == 0 else None,
                              model=served_model(recipe, argv) if rank == 0 else None)
                env = (*recipe.env.items(), *node_env(n), *n.vllm_env)
                steps.append(Step(n.name, f"start the container with a Ray {'head' if rank == 0 else 'worker'}",
                                  tuple(_docker_run(recipe, topology, role, n, name, env, server_params(n, port),
                                                    image, secrets) + ray),
                                  secrets=secrets, service=svc.key))
                services.append(svc)
                server_env[svc.key] = env
            # vLLM places its ranks on the Ray cluster as it finds it: wait until every node has joined.
            steps.append(Step(head.name, f"wait until the Ray cluster has {len(nodes)} nodes",
                              ("docker", "exec", cname(head), *ray_cli, "status"), change=False,
                              expect=(RAY_NODE_LINE, len(nodes)), retry_s=RAY_JOIN_TIMEOUT_S))
            text = argv[2] if shell else shlex.join(argv)
            text += " --distributed-executor-backend ray"
            # Output goes to the container's own stdout so `docker logs` follows the server. The container's
            # main process is the Ray node, which outlives a vLLM that dies: the exit line is what tells the
            # runner (runner.EXIT_MARK).
            steps.append(Step(head.name, "start vLLM on the Ray cluster (executor ray)",
                              ("docker", "exec", "-d", cname(head), "bash", "-c",
                               f"{text} >> /proc/1/fd/1 2>&1; echo \"{EXIT_MARK} $?\" >> /proc/1/fd/1")))
            server_args[f"{head.name}/server"] = (*argv, "--distributed-executor-backend", "ray")
            endpoint = services[0].url
            listen(head, port)

    return Plan(recipe=recipe.key, recipe_name=recipe.name, topology=topology, nodes=tuple(n.name for n in nodes),
                steps=tuple(steps), services=tuple(services), endpoint=endpoint, router=router_used,
                backend=backend if topology == "cluster-tp2" else None, image=image, params=params,
                server_args=server_args, notes=tuple(notes), server_env=server_env,
                listens={k: tuple(v) for k, v in listens.items()},
                cpu_build=dict(recipe.env).get("VLLM_TARGET_DEVICE") == "cpu" or recipe.container_settings.gpus is None)


def _add_router(recipe: Recipe, topology: str, choice: str, head: NodeConfig, servers: list[Service],
                steps: list[Step], services: list[Service], notes: list[str], params: Mapping[str, Any],
                router_dir: str, listens: dict[str, list[tuple[str, int]]], disagg: bool = False) -> str:
    port = recipe.router.port
    name = f"{head.container if not recipe.container_settings.name else recipe.container_settings.name}_router"
    url = f"http://{_url_host(head.address)}:{port}"
    model = servers[0].model
    impl: RouterImpl
    steps.append(Step(head.name, f"remove a stopped leftover router container {name} (refused if it is running)",
                      ("docker", "rm", name), tolerate=("No such container",)))
    if choice == "vllm-router":
        impl = recipe.router.vllm_router
        if compromised_versions(impl, litellm=False):
            raise UserError("the router image is a compromised LiteLLM release (seed 001)", file=recipe.source,
                            field="sparkconsole.router.vllm_router", fix="use a vllm-router image")
        args = [*[fill(c, params, recipe.source, None, "sparkconsole.router.vllm_router.command") for c in impl.command],
                "--host", "0.0.0.0", "--port", str(port)]
        if disagg:
            prefill, decode = servers
            args += ["--vllm-pd-disaggregation", "--prefill", str(prefill.url), "--decode", str(decode.url)]
            if recipe.disagg.connector == "NixlConnector":
                args += ["--kv-connector", "nixl"]
        else:
            args += ["--worker-urls", *[str(s.url) for s in servers], "--policy", impl.policy or "round_robin"]
        health = "/health"
        env: list[tuple[str, str]] = []
        mounts: list[str] = []
        secrets: tuple[SecretRef, ...] = ()
        notes.append(ROUTER_OVERHEAD_NOTE["vllm-router"])
    else:
        impl = recipe.router.litellm
        bad = compromised_versions(impl, litellm=True)
        if bad:
            raise UserError(f"LiteLLM {bad[0]} is a compromised release (supply-chain attack, seed 001)",
                            file=recipe.source, field="sparkconsole.router.litellm",
                            fix="pin a known-good LiteLLM, e.g. version 1.106.2")
        cfg_path = f"{router_dir.rstrip('/')}/{name}.yaml"
        cfg = litellm_config(model or "model", servers, choice)
        steps.append(Step(head.name, f"write the LiteLLM config ({choice}) to {cfg_path}",
                          ("sh", "-c", 'umask 077 && mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "sh", cfg_path),
                          input=cfg.encode()))
        args = [*[fill(c, params, recipe.source, None, "sparkconsole.router.litellm.command") for c in impl.command],
                "--config", "/etc/litellm/config.yaml", "--host", "0.0.0.0", "--port", str(port)]
        health = "/health/liveliness"
        # Offline start (no price-map download); the master key comes from the node, by reference.
        env = [("LITELLM_LOCAL_MODEL_COST_MAP", "True")]
        mounts = [f"{cfg_path}:/etc/litellm/config.yaml:ro"]
        secrets = (SecretRef("LITELLM_MASTER_KEY"),)
        notes.append(ROUTER_OVERHEAD_NOTE["litellm"])
    argv = ["docker", "run", "-d", "--name", name, "--label", f"sparkconsole.recipe={recipe.key}",
            "--label", f"sparkconsole.topology={topology}", "--label", "sparkconsole.role=router",
            "--label", f"sparkconsole.node={head.name}", "--network", "host", "--init"]
    for v in [*mounts, *impl.volumes]:
        argv += ["-v", fill(v, params, recipe.source, None, "sparkconsole.router.volumes")]
    for k, v in env:
        argv += ["-e", f"{k}={v}"]
    for s in secrets:
        argv += ["-e", s.name]
    if not impl.image:
        raise UserError(f"no image for the {choice} router", file=recipe.source, field="sparkconsole.router",
                        fix="set the router's image in the recipe's sparkconsole.router section")
    argv += ["--entrypoint=", impl.image, *args]
    key = f"{head.name}/router"
    steps.append(Step(head.name, f"start the router ({choice}, {impl.image})", tuple(argv), secrets=secrets, service=key))
    listens.setdefault(head.name, []).append((head.address, port))
    services.append(Service(key=key, node=head.name, container=name, role="router", url=url, model=model,
                            health_path=health, models_path=None if choice != "vllm-router" else "/v1/models"))
    return url


def litellm_config(model: str, servers: Sequence[Service], strategy: str) -> str:
    """LiteLLM proxy config: one deployment per backend under one model name, the routing strategy chosen."""
    import yaml
    doc = {
        "model_list": [{"model_name": model,
                        "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": f"{s.url}/v1"}}
                       for s in servers],
        "router_settings": {"routing_strategy": strategy},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }
    return yaml.safe_dump(doc, sort_keys=False)
