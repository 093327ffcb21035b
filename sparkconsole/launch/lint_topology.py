"""Preflight rules for launches that span nodes (cluster, disaggregated) or share a machine's cores.

Each rule is a failure met while making those topologies serve for real on the test bed (docs/TESTBED.md,
"Multi-node and disaggregation"): refused here, before anything starts, with the fix in one line. Pure, like
lint.py: what the nodes said comes in through Facts (boot ids, ports in use, peers reachable; see probe.py).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ..config import NodeConfig
from .findings import Facts, Finding, pp, tp
from .steps import Plan

SRC_RAY_CPU = ("sparkconsole's test bed (docs/TESTBED.md), vLLM 0.32 CPU: --distributed-executor-backend ray dies with \"current platform cpu does "
               "not support ray\" (the CPU platform has no Ray device key)")
SRC_BIND = ("sparkconsole's test bed (docs/TESTBED.md), vLLM 0.32 CPU: two ranks on one machine without VLLM_CPU_OMP_THREADS_BIND die on \"Not "
            "enough allowed NUMA nodes\"; with a core each (\"0\", \"1\") they serve")
SRC_SIDE_CHANNEL = ("vLLM NixlConnector: the decode side connects to the prefill side's VLLM_NIXL_SIDE_CHANNEL_HOST; "
                    "a loopback host there is the decode node itself")
SRC_SAME_ADDRESS = "a multi-node launch binds the same ports on every node: two nodes at one address collide"
SRC_PORTS = "a port already bound on a node makes vLLM, Ray or the router exit at start-up (Address already in use)"
SRC_REACH = ("vLLM multi-node: the worker connects to --master-addr, decode to prefill's side channel; a peer the "
             "node cannot reach hangs the launch until its timeout")

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback or ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _finding(*args: Any, **kwargs: Any) -> Finding:
    return Finding(*args, **kwargs)


def ray_on_cpu(plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    if plan.backend != "ray" or not plan.cpu_build:
        return []
    return [_finding("ray_on_cpu", "refuse", "the Ray executor on vLLM's CPU build", SRC_RAY_CPU,
                     "launch with --backend mp (vLLM's own multi-node launch)")]


def _host_of(node: NodeConfig, facts: Facts) -> str:
    """Which machine a node is: its boot id where the agent sent one; loopback addresses are this machine."""
    boot = facts.boot_ids.get(node.name)
    if boot:
        return boot
    return "this machine" if _is_loopback(node.address) else node.address


def cpu_threads_bind(plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    """A CPU build binds each rank's OpenMP threads to a NUMA node of its own unless told the cores: ranks that
    share a machine (one server with TP>1, or several "nodes" on one host) need VLLM_CPU_OMP_THREADS_BIND."""
    if not plan.cpu_build:
        return []
    by_name = {n.name: n for n in nodes}
    out = []
    per_host: dict[str, list[tuple[str, str | None]]] = {}
    for key, env in plan.server_env.items():
        node = plan.service(key).node
        bind = dict(env).get("VLLM_CPU_OMP_THREADS_BIND")
        argv = plan.server_args.get(key, ())
        local_ranks = tp(argv) * pp(argv) if plan.topology != "cluster-tp2" else 1
        if local_ranks > 1 and (bind is None or bind == "auto" or len(bind.split("|")) < local_ranks):
            out.append(_finding("cpu_threads_bind", "refuse",
                                f"{local_ranks} CPU ranks in one server without a core list each", SRC_BIND,
                                "set VLLM_CPU_OMP_THREADS_BIND to one core list per rank, e.g. \"0|1\"", node))
        if node in by_name:
            per_host.setdefault(_host_of(by_name[node], facts), []).append((node, bind))
    for host, ranks in per_host.items():
        if len(ranks) < 2:
            continue
        binds = [b for _, b in ranks]
        if any(b in (None, "", "auto") for b in binds) or len(set(binds)) < len(binds):
            names = ", ".join(n for n, _ in ranks)
            out.append(_finding("cpu_threads_bind", "refuse",
                                f"{names} run CPU ranks on one machine ({host[:36]}) without cores of their own",
                                SRC_BIND, "give each node its cores in the cluster file: "
                                "vllm_env: {VLLM_CPU_OMP_THREADS_BIND: \"0\"} on one, \"1\" on the other"))
    return out


def side_channel_host(plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    if plan.topology != "disagg":
        return []
    by_name = {n.name: n for n in nodes}
    out = []
    for key, env in plan.server_env.items():
        node = by_name.get(plan.service(key).node)
        host = dict(env).get("VLLM_NIXL_SIDE_CHANNEL_HOST")
        if node is None or host is None:
            continue
        if _is_loopback(host) and host != node.address:
            out.append(_finding("nixl_side_channel", "refuse",
                                f"VLLM_NIXL_SIDE_CHANNEL_HOST is {host}: the peer would connect to itself",
                                SRC_SIDE_CHANNEL, f"remove it from the recipe's env (the plan sets each node's "
                                f"own address, here {node.address})", node.name))
    return out


def shared_address(plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    if len(plan.nodes) < 2:
        return []
    seen: dict[str, str] = {}
    out = []
    for n in nodes:
        if n.address in seen:
            out.append(_finding("same_address", "refuse", f"{seen[n.address]} and {n.name} have one address, "
                                f"{n.address}", SRC_SAME_ADDRESS, "give each node its own address", n.name))
        seen.setdefault(n.address, n.name)
    return out


def ports_in_use(plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    out = []
    for node, busy in facts.busy_ports.items():
        if node not in plan.nodes:
            continue
        for addr, port, why in busy:
            out.append(_finding("port_in_use", "refuse", f"{addr}:{port} is already in use ({why})", SRC_PORTS,
                                "stop what holds it (ss -ltnp), or choose another port (--port, --master-port, "
                                "the recipe's router port)", node))
    return out


def peers_unreachable(plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    out = []
    for node, failed in facts.unreachable.items():
        if node not in plan.nodes:
            continue
        for peer, addr, why in failed:
            out.append(_finding("peer_unreachable", "refuse", f"cannot reach {peer} at {addr} ({why})", SRC_REACH,
                                f"check the link between {node} and {peer} (addresses in the cluster file, "
                                "routes, firewall)", node))
    return out


RULES = (ray_on_cpu, cpu_threads_bind, side_channel_host, shared_address, ports_in_use, peers_unreachable)
