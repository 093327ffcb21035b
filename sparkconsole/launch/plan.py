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

import json
import shlex
from typing import Any, Mapping, Sequence

from ..config import ClusterConfig, NodeConfig
from ..errors import UserError
from .argv import command_argv, has_flag, served_model
from .recipe import ROUTER_CHOICES, TOPOLOGIES, Recipe, SecretRef, fill
from .routers import DEFAULT_ROUTER_DIR, add_router
from .steps import EXIT_MARK, RAY_JOIN_TIMEOUT_S, RAY_NODE_LINE, Plan, Service, Step, launch_labels, url_host

# Plan options taken out of overrides; every other override key is a placeholder value.
OPTION_KEYS = {"nodes", "extra_args", "backend", "router", "drop_caches", "eth_if", "ib_if", "master_port",
               "router_dir"}


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


def _iface(value: Any, node: str) -> str | None:
    if isinstance(value, Mapping):
        return value.get(node)
    return value


def _node_iface(options: Mapping[str, Any], recipe_value: str | None, node: NodeConfig, key: str) -> str | None:
    """--eth-if/--ib-if, else the node's own setting in the cluster file (when it has one), else the recipe's."""
    return (_iface(options.get(key), node.name) or getattr(node, key, None) or recipe_value)


def _docker_run(recipe: Recipe, topology: str, role: str, node: NodeConfig, name: str,
                env: Sequence[tuple[str, str]], params: Mapping[str, Any], image: str,
                secrets: Sequence[SecretRef], url: str | None) -> list[str]:
    cs = recipe.container_settings
    argv = ["docker", "run", "-d", "--name", name, *launch_labels(recipe, topology, role, node, url),
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
                      url=f"http://{url_host(node.address)}:{port}" if url else None,
                      model=served_model(recipe, argv))
        steps.append(Step(node.name, f"start vLLM {role} ({image})",
                          tuple(_docker_run(recipe, topology, role, node, name, full_env, p, image, secrets, svc.url)
                                + argv),
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
        endpoint = add_router(recipe, topology, router_choice, nodes[0], servers, steps, services, notes, params,
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
        endpoint = add_router(recipe, topology, "vllm-router", prefill, servers, steps, services, notes, params,
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
                       [*ray_cli, "start", "--block", "--address", f"{url_host(head.address)}:{master_port}"])
                ray += ["--node-ip-address", n.address, "--disable-usage-stats"]
                role = "server" if rank == 0 else "worker"
                # The head's container is the server: it answers once vLLM (started below) is up.
                svc = Service(key=f"{n.name}/{role}", node=n.name, container=name, role=role,
                              url=f"http://{url_host(head.address)}:{port}" if rank == 0 else None,
                              model=served_model(recipe, argv) if rank == 0 else None)
                env = (*recipe.env.items(), *node_env(n), *n.vllm_env)
                steps.append(Step(n.name, f"start the container with a Ray {'head' if rank == 0 else 'worker'}",
                                  tuple(_docker_run(recipe, topology, role, n, name, env, server_params(n, port),
                                                    image, secrets, svc.url) + ray),
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
