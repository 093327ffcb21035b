"""The link interfaces of a node, discovered over its transport (issue 18, item 5).

As spark-vllm-docker's autodiscover does: `ibdev2netdev`'s Up ports give the RDMA devices (ib_if, comma-joined,
for NCCL_IB_HCA) and, among their network devices, the ones with an IPv4 address are the Ethernet candidates
(eth_if: the first whose name has no capital P — each ConnectX-7 port of a Spark has two names, enp1s0f1np1 and
enP2p1s0f1np1, and the lower-case one is the one the playbooks use — else the first). Where there is no RDMA
device (no ibdev2netdev, nothing Up, as on the test bed), the interface that routes to the peer's address
(`ip -o route get PEER`) is the link, and ib_if stays None.

Pure parsers plus one async `discover(transport, peer_address)`; the cluster file or the flags override
what it finds (the plan's business, launch/plan.py).
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:      # types only: the parsers stay importable without asyncssh
    from ..config import ClusterConfig, NodeConfig
    from ..nodes.transport import Transport
    from ..recipes import Recipe

_IBDEV_RE = re.compile(r"^(\S+)\s+port\s+(\d+)\s+==>\s+(\S+)\s+\((\w+)\)")
_SECTION = "----sparkconsole-ifaces----"


@dataclass(frozen=True)
class IbPort:
    device: str          # the RDMA device, e.g. rocep1s0f1 (what NCCL_IB_HCA names)
    port: int
    netdev: str          # its network device, e.g. enp1s0f1np1
    up: bool


def parse_ibdev2netdev(text: str) -> list[IbPort]:
    """`ibdev2netdev` lines (`rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)`); other lines are skipped."""
    out = []
    for line in text.splitlines():
        m = _IBDEV_RE.match(line.strip())
        if m:
            out.append(IbPort(m.group(1), int(m.group(2)), m.group(3), m.group(4).lower() == "up"))
    return out


def parse_ipv4_addrs(text: str) -> dict[str, list[str]]:
    """`ip -o -4 addr show` → interface → its IPv4 addresses (CIDR), in order."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        words = line.split()
        # "4: eth0    inet 192.0.2.2/24 brd … scope global eth0\ …"
        if len(words) >= 4 and words[2] == "inet":
            out.setdefault(words[1].split("@", 1)[0], []).append(words[3])
    return out


def parse_route_get(text: str) -> str | None:
    """`ip -o route get ADDR` → the device the route leaves by (`… dev lo src …`), None if there is none."""
    words = text.split()
    for i, w in enumerate(words[:-1]):
        if w == "dev":
            return words[i + 1]
    return None


def choose(ports: list[IbPort], addrs: dict[str, list[str]]) -> tuple[str | None, str | None]:
    """(eth_if, ib_if) from the Up RDMA ports, as autodiscover chooses them; (None, None) when none is Up."""
    up = [p for p in ports if p.up]
    ib_if = ",".join(dict.fromkeys(p.device for p in up)) or None
    candidates = [p.netdev for p in up if addrs.get(p.netdev)]
    eth_if = next((c for c in candidates if "P" not in c), candidates[0] if candidates else None)
    return eth_if, ib_if


def probe_command(peer_address: str) -> str:
    """One shell command printing the three outputs, separated; a missing ibdev2netdev prints nothing."""
    return " ; ".join([
        "command -v ibdev2netdev >/dev/null 2>&1 && ibdev2netdev 2>/dev/null",
        f"echo {_SECTION}",
        "ip -o -4 addr show 2>/dev/null",
        f"echo {_SECTION}",
        f"ip -o route get {shlex.quote(peer_address)} 2>&1",
    ])


def parse_probe(text: str) -> tuple[str | None, str | None, str]:
    """The probe's output → (eth_if, ib_if, how): how says where each came from, for the plan."""
    parts = text.split(_SECTION)
    if len(parts) != 3:
        raise ValueError("unexpected probe output")
    ibdev, addrs, route = (p.strip("\n") for p in parts)
    ports = parse_ibdev2netdev(ibdev)
    eth_if, ib_if = choose(ports, parse_ipv4_addrs(addrs))
    if eth_if and ib_if:
        return eth_if, ib_if, "ibdev2netdev (Up ports; the one with an address for Ethernet)"
    dev = parse_route_get(route)
    if ib_if:
        return dev, ib_if, "ibdev2netdev (Up ports; no Up port has an address: Ethernet from the route to the peer)"
    return dev, None, "route to the peer (no RDMA port Up)"


async def discover(transport: Transport, peer_address: str) -> tuple[str, str | None, str]:
    """(eth_if, ib_if, how) of the node behind `transport`, for the link to `peer_address`. A node that cannot be
    read, or an address that is not one, is a one-line UserError."""
    try:
        ipaddress.ip_address(peer_address)
    except ValueError:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$", peer_address or ""):
            raise UserError(f"bad peer address {str(peer_address)[:60]!r}", field="address",
                            fix="write an IP address or a host name") from None
    node = getattr(getattr(transport, "node", None), "name", "node")
    from ..nodes.transport import TransportError  # lazy: keeps the parsers importable without asyncssh
    try:
        res = await transport.run(["sh", "-c", probe_command(peer_address)], timeout=20)
    except TransportError as exc:
        raise UserError(f"{node}: cannot discover the link interfaces ({exc})",
                        fix="check that the node is reachable, or set eth_if/ib_if in the cluster file") from None
    try:
        eth_if, ib_if, how = parse_probe(res.stdout)
    except ValueError:
        raise UserError(f"{node}: cannot discover the link interfaces (no shell output)",
                        fix="set eth_if/ib_if in the cluster file or with --eth-if/--ib-if") from None
    if eth_if is None:
        raise UserError(f"{node}: no interface routes to {peer_address} and no RDMA port is Up",
                        fix="check the cable and the addresses, or set eth_if/ib_if in the cluster file")
    return eth_if, ib_if, how


def choose_link_address(cidrs: list[str], ssh_address: str) -> str | None:
    """The address a node's ranks should use on its cluster interface: the one sparkconsole reaches it at when
    that address is on the interface's networks (the operator already uses the link), else the interface's
    first address (the runner's choice: the cluster link, not the management LAN). None: no IPv4 address."""
    try:
        ssh_ip = ipaddress.ip_address(ssh_address)
    except ValueError:
        ssh_ip = None
    nets = []
    for c in cidrs:
        try:
            nets.append(ipaddress.ip_interface(c))
        except ValueError:
            continue
    if ssh_ip is not None and any(ssh_ip in n.network for n in nets):
        return ssh_address
    return str(nets[0].ip) if nets else None


async def link_address(transport: Transport, iface: str, ssh_address: str) -> str | None:
    """The node's address on `iface` (choose_link_address), read with `ip -o -4 addr show dev IFACE`."""
    from ..nodes.transport import TransportError
    try:
        res = await transport.run(["ip", "-o", "-4", "addr", "show", "dev", iface], timeout=20)
    except TransportError:
        return None
    return choose_link_address(parse_ipv4_addrs(res.stdout).get(iface, []), ssh_address) if res.rc == 0 else None


async def plan_links(recipe: Recipe, topology: str, cluster: ClusterConfig, overrides: dict[str, Any],
                     connect: Callable[[NodeConfig], Awaitable[Transport]]) -> tuple[dict[str, Any], list[str]]:
    """What a plan across nodes needs to know of the link between them, read from the nodes it uses:
    - for a cluster launch, the link interfaces nobody wrote down (no --eth-if, none in the cluster file or the
      recipe), discovered towards its peer (the head for a worker, the first worker for the head);
    - for a cluster or disaggregated launch, each node's address on its link interface (`cluster_addresses`),
      which the ranks, the master and the NIXL side channel use instead of the SSH address.
    Returns (overrides with `eth_if`/`ib_if`/`cluster_addresses` added, a note per finding). `connect(node)`
    gives a connected transport."""
    from .plan import make_plan
    from .planning import node_iface
    if topology not in ("cluster-tp2", "disagg"):
        return overrides, []
    probe = make_plan(recipe, topology, cluster, {**overrides, "eth_if": overrides.get("eth_if") or "lo"})
    nodes = [cluster.node(n) for n in probe.nodes]
    from ..nodes.transport import TransportError
    transports: dict[str, Transport] = {}

    async def transport(n: NodeConfig) -> Transport:
        if n.name not in transports:
            try:
                transports[n.name] = await connect(n)
            except TransportError as exc:
                raise UserError(f"{n.name}: cannot read its link interfaces ({exc})",
                                fix="check that the node is reachable, or pass --offline to plan without asking "
                                    "it (set eth_if/ib_if in the cluster file)") from None
        return transports[n.name]
    out, notes = dict(overrides), []
    eth: dict[str, str] = {}
    if topology == "cluster-tp2" and not overrides.get("eth_if") and not recipe.cluster.eth_if:
        eth = {n.name: n.eth_if for n in nodes if n.eth_if}
        ib: dict[str, str] = {}
        for n in [n for n in nodes if not n.eth_if]:
            peer = nodes[1] if n.name == nodes[0].name else nodes[0]
            e, i, how = await discover(await transport(n), peer.address)
            eth[n.name] = e
            if i and not n.ib_if and not overrides.get("ib_if") and not recipe.cluster.ib_if:
                ib[n.name] = i
            notes.append(f"{n.name}: eth_if {e}" + (f", ib_if {i}" if i else "") + f" discovered ({how})")
        if len(eth) == len(nodes) and notes:
            out["eth_if"] = eth
        if ib:
            out["ib_if"] = ib
    addresses: dict[str, str] = {}
    for n in nodes:
        iface = eth.get(n.name) or node_iface(overrides, recipe, n, "eth_if")
        if not iface:
            continue
        try:
            addr = await link_address(await transport(n), iface, n.address)
        except UserError as err:
            # only the addresses are missing: the plan still works on the SSH addresses, and says so
            notes.append(f"{n.name}: link address not read ({err.problem}); its ranks use {n.address}")
            continue
        if addr and addr != n.address:
            addresses[n.name] = addr
            notes.append(f"{n.name}: cluster link address {addr} on {iface} (SSH reaches it at {n.address})")
    if addresses:
        out["cluster_addresses"] = addresses
    return out, notes
