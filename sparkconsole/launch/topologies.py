"""One small planner per topology, each adding its servers (and router) to a PlanBuilder; every server runs in
the same container (launch/container.py). Returns (endpoint, router) for the plan.

- solo:        one vLLM container on one node.
- 2x-solo:     one server per node plus a router on the head (launch/routers.py).
- disagg:      prefill on the first node, decode on the second, NixlConnector KV transfer, vllm-router PD mode.
- cluster-tp2: one instance across N nodes. mp: the runtime's own multi-node launch (launch/runtime_cmd.py: vLLM's
               `--nnodes N --node-rank R --master-addr HEAD --master-port P`, `--headless` on workers, as
               launch-cluster.sh does; SGLang's `--dist-init-addr HEAD:P`); ray (vLLM only): `ray start` in each
               node's container, then `vllm serve … --distributed-executor-backend ray`.
The runtime's own refusals (llama.cpp on one node, no Ray for SGLang) come first (plan.py → runtime_cmd.check).
"""

from __future__ import annotations

import json
import shlex

from ..config import NodeConfig
from ..errors import UserError
from ..recipes import fill
from ..runtimes import VLLM
from .argv import has_flag, served_model
from .planning import PlanBuilder
from .routers import add_router
from .runtime_cmd import multi_node_args
from .steps import EXIT_MARK, RAY_JOIN_TIMEOUT_S, RAY_NODE_LINE, Service, Step, url_host


def plan_solo(b: PlanBuilder) -> tuple[str | None, str | None]:
    node = b.nodes[0]
    svc = b.start_server(node, "server", [], b.node_port(node))
    b.release()
    return svc.url, None


def plan_two_solo(b: PlanBuilder, router: str) -> tuple[str | None, str | None]:
    # vllm-router takes a server out through its worker API; behind LiteLLM each server carries the drain gate
    gated = router != "vllm-router"
    servers = [b.start_server(n, "server", [], b.node_port(n), drain_gate=gated) for n in b.nodes]
    b.release()
    return add_router(b, router, b.nodes[0], servers), router


def plan_disagg(b: PlanBuilder) -> tuple[str | None, str | None]:
    r = b.recipe
    servers = []
    for node, role, port in ((b.nodes[0], "prefill", r.disagg.prefill_port), (b.nodes[1], "decode", r.disagg.decode_port)):
        # kv_both is deprecated in vLLM 0.32: each side says which way its KV cache goes.
        kv_cfg = {"kv_connector": r.disagg.connector, "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"}
        if r.disagg.kv_buffer_device:
            kv_cfg["kv_buffer_device"] = r.disagg.kv_buffer_device
        kv = json.dumps(kv_cfg, separators=(",", ":"))
        side = b.link_address(node)
        env = [("VLLM_NIXL_SIDE_CHANNEL_HOST", side), ("VLLM_NIXL_SIDE_CHANNEL_PORT", str(r.disagg.side_channel_port))]
        eth = b.iface(node, "eth_if")
        if eth:
            env.append(("UCX_NET_DEVICES", eth))
        port = b.node_port(node, port)
        probe, _ = b.server_command(node, port)
        extra = [] if has_flag(probe, "--kv-transfer-config") else ["--kv-transfer-config", kv]
        servers.append(b.start_server(node, role, env, port, extra))
        b.listen(node, r.disagg.side_channel_port, side)
    b.release()
    return add_router(b, "vllm-router", b.nodes[0], servers, disagg=True), "vllm-router"


def _link_env(b: PlanBuilder, n: NodeConfig, ifaces: dict[str, tuple[str, str | None]], backend: str) -> list[tuple[str, str]]:
    eth, ib = ifaces[n.name]
    addr = b.link_address(n)
    # As spark-vllm-docker's launch-cluster.sh sets them: pin every library to the node-to-node link (vLLM's own
    # address variable only where vLLM runs).
    env = [*([("VLLM_HOST_IP", addr)] if b.runtime.name == VLLM else []), ("NCCL_SOCKET_IFNAME", eth),
           ("GLOO_SOCKET_IFNAME", eth), ("TP_SOCKET_IFNAME", eth), ("UCX_NET_DEVICES", eth),
           ("OMPI_MCA_btl_tcp_if_include", eth)]
    if ib:
        env += [("NCCL_IB_HCA", ib), ("NCCL_IB_DISABLE", "0")]
    if backend == "ray":
        env += [("RAY_NODE_IP_ADDRESS", addr), ("RAY_OVERRIDE_NODE_IP_ADDRESS", addr),
                ("RAY_memory_monitor_refresh_ms", "0")]
    return env


def plan_cluster(b: PlanBuilder, backend: str, master_port: int) -> tuple[str | None, str | None]:
    head = b.nodes[0]
    port = b.node_port(head)
    tp, pp = int(b.params.get("tensor_parallel", 1)), int(b.params.get("pipeline_parallel", 1) or 1)
    if tp * pp != len(b.nodes):
        b.note(f"tensor_parallel {tp} × pipeline_parallel {pp} ≠ {len(b.nodes)} nodes of one GPU each")
    ifaces = {}
    for n in b.nodes:
        eth = b.iface(n, "eth_if")
        if not eth:
            raise UserError("a cluster launch needs the network interface that links the nodes", file=b.recipe.source,
                            field="sparkconsole.cluster.eth_if",
                            fix="set sparkconsole.cluster.eth_if in the recipe (e.g. enp1s0f0np0) or pass --eth-if")
        ifaces[n.name] = (eth, b.iface(n, "ib_if"))
    moved = [f"{n.name} {b.link_address(n)} on {ifaces[n.name][0]}" for n in b.nodes if b.link_address(n) != n.address]
    if moved:
        b.note(f"{b.runtime.title}'s ranks meet on the cluster link's addresses: " + ", ".join(moved))
    master = b.link_address(head)
    b.listen(head, master_port, master)
    if backend == "ray":
        return _plan_ray(b, ifaces, port, master_port)
    endpoint = None
    for rank, n in enumerate(b.nodes):
        mn = multi_node_args(b.runtime, rank, len(b.nodes), master, master_port)
        svc = b.start_server(n, "server" if rank == 0 else "worker", _link_env(b, n, ifaces, "mp"), port, mn,
                             url=rank == 0)
        endpoint = endpoint or svc.url
    b.release()
    return endpoint, None


def _plan_ray(b: PlanBuilder, ifaces: dict[str, tuple[str, str | None]], port: int,
              master_port: int) -> tuple[str | None, str | None]:
    head, r = b.nodes[0], b.recipe
    argv, shell = b.server_command(head, port, multi_node=True)
    ray_cli = [fill(w, b.params, r.source, None, "sparkconsole.cluster.ray") for w in r.cluster.ray]
    master = b.link_address(head)
    for rank, n in enumerate(b.nodes):
        ray = ([*ray_cli, "start", "--block", "--head", "--port", str(master_port)] if rank == 0 else
               [*ray_cli, "start", "--block", "--address", f"{url_host(master)}:{master_port}"])
        ray += ["--node-ip-address", b.link_address(n), "--disable-usage-stats"]
        role = "server" if rank == 0 else "worker"
        # The head's container is the server: it answers once vLLM (started below) is up.
        svc = Service(key=f"{n.name}/{role}", node=n.name, container=b.cname(n), role=role,
                      url=f"http://{url_host(head.address)}:{port}" if rank == 0 else None,
                      model=served_model(r, argv) if rank == 0 else None)
        b.start_container(n, role, _link_env(b, n, ifaces, "ray"), b.server_params(n, port), ray, svc,
                          f"start the container with a Ray {'head' if rank == 0 else 'worker'}")
    b.release()
    # vLLM places its ranks on the Ray cluster as it finds it: wait until every node has joined.
    b.add_step(Step(head.name, f"wait until the Ray cluster has {len(b.nodes)} nodes",
                    ("docker", "exec", b.cname(head), *ray_cli, "status"), change=False,
                    expect=(RAY_NODE_LINE, len(b.nodes)), retry_s=RAY_JOIN_TIMEOUT_S))
    text = argv[2] if shell else shlex.join(argv)
    text += " --distributed-executor-backend ray"
    # Output goes to the container's own stdout so `docker logs` follows the server. The container's main
    # process is the Ray node, which outlives a vLLM that dies: the exit line is what tells the runner.
    b.add_step(Step(head.name, "start vLLM on the Ray cluster (executor ray)",
                    ("docker", "exec", "-d", b.cname(head), "bash", "-c",
                     f"{text} >> /proc/1/fd/1 2>&1; echo \"{EXIT_MARK} $?\" >> /proc/1/fd/1")))
    b.record_server(f"{head.name}/server", (*argv, "--distributed-executor-backend", "ray"))
    b.listen(head, port)
    return b.services[0].url, None
