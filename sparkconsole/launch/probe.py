"""What a multi-node launch needs from each node before it starts, asked over the node's own connection.

- the ports the plan will listen on there (vLLM, the master port, NIXL's side channel, the router): free?
- the peers the node must reach (a worker its head, decode its prefill): does a TCP connection open? The peer's
  SSH port is the one known to listen before anything is launched, so it stands for "this link works".

One `python3 -c` per node (python3 is what the agent runs on, so it is there), its input a JSON argument,
quoted. Results feed lint.Facts (busy_ports, unreachable) and the rules in lint_topology.py.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Mapping
from typing import Any

from ..config import ClusterConfig
from .steps import Plan

PROBE_TIMEOUT_S = 20.0
CONNECT_TIMEOUT_S = 3.0

_PROBE = r"""
import json, socket, sys
spec = json.loads(sys.argv[1])
busy, unreach = [], []
for host, port in spec["bind"]:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    except OSError as e:
        busy.append([host, port, e.strerror or str(e)])
    finally:
        s.close()
for peer, host, port in spec["connect"]:
    try:
        socket.create_connection((host, port), spec["timeout"]).close()
    except OSError as e:
        unreach.append([peer, "%s:%d" % (host, port), e.strerror or str(e) or type(e).__name__])
print(json.dumps({"busy": busy, "unreach": unreach}))
"""


def peers(plan: Plan, cluster: ClusterConfig) -> dict[str, list[tuple[str, str, int]]]:
    """node → (peer name, address, port) it must reach: every other node reaches the first (the head, the
    prefill side), the first reaches the others (replies, NIXL's notifications)."""
    if len(plan.nodes) < 2 or plan.topology not in ("cluster-tp2", "disagg"):
        return {}
    nodes = [cluster.node(n) for n in plan.nodes]
    out: dict[str, list[tuple[str, str, int]]] = {}
    for n in nodes:
        for p in nodes:
            if p.name != n.name and (p.name == nodes[0].name or n.name == nodes[0].name) and not p.local:
                out.setdefault(n.name, []).append((p.name, p.address, p.ssh.port))
    return out


def probe_argv(bind: list[tuple[str, int]], connect: list[tuple[str, str, int]]) -> str:
    spec = {"bind": [list(b) for b in bind], "connect": [list(c) for c in connect], "timeout": CONNECT_TIMEOUT_S}
    return shlex.join(["python3", "-c", _PROBE, json.dumps(spec)])


async def probe_nodes(plan: Plan, cluster: ClusterConfig, transports: Mapping[str, Any]
                      ) -> tuple[dict[str, list[tuple[str, int, str]]], dict[str, list[tuple[str, str, str]]]]:
    """(busy_ports, unreachable) for lint.Facts; a node that cannot be asked is simply left out."""
    want = peers(plan, cluster)

    async def one(name: str) -> tuple[str, dict[str, Any] | None]:
        t = transports.get(name)
        if t is None:
            return name, None
        env = "".join(f"{k}={shlex.quote(v)} " for k, v in cluster.node(name).env)
        try:
            res = await t.run(env + probe_argv(list(plan.listens.get(name, ())), want.get(name, [])),
                              timeout=PROBE_TIMEOUT_S)
            return name, json.loads(res.stdout.strip().splitlines()[-1]) if res.rc == 0 else None
        except Exception:  # noqa: BLE001 — an unreadable node leaves its rules unchecked, it does not stop preflight
            return name, None

    busy: dict[str, list[tuple[str, int, str]]] = {}
    unreach: dict[str, list[tuple[str, str, str]]] = {}
    for name, got in await asyncio.gather(*(one(n) for n in plan.nodes)):
        if not got:
            continue
        if got.get("busy"):
            busy[name] = [(str(h), int(p), str(w)) for h, p, w in got["busy"]]
        if got.get("unreach"):
            unreach[name] = [(str(p), str(a), str(w)) for p, a, w in got["unreach"]]
    return busy, unreach
