"""`sparkconsole init`: write sparkconsole.yaml from what the operator already has.

From the `.env` of the spark-vllm-docker checkout in the current directory (dotenv_cluster.py), or from hosts of
the SSH client config (`--from-ssh-config spark1 spark2`, head first). Before writing, each node is asked over
its own connection, as preflight asks it: does it answer, is docker there, and which link interfaces reach its
peer (launch/ifaces.py `discover`, for the interfaces the source did not name). The file is read back as every
command reads it before it is kept; an existing file is kept unless --force.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:      # imported inside the functions: registering must stay cheap
    from ..config import ClusterConfig

DOCKER_PROBE = ("command -v docker >/dev/null 2>&1 || { echo NO-DOCKER; exit 0; }; "
                "v=$(docker version --format '{{.Server.Version}}' 2>&1) && echo \"engine $v\" || "
                "echo \"no-engine $(printf %s \"$v\" | tr '\\n' ' ' | cut -c1-160)\"")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("init", help="write sparkconsole.yaml from a spark-vllm-docker .env or ~/.ssh/config",
                              description=__doc__)
    p.add_argument("--from-ssh-config", nargs="+", metavar="HOST", dest="hosts",
                   help="these Host entries of the SSH client config are the nodes, head first")
    p.add_argument("--ssh-config", metavar="PATH", help="the SSH client config to read (default: ~/.ssh/config)")
    p.add_argument("--output", "-o", metavar="PATH", default="sparkconsole.yaml",
                   help="where to write (default: ./sparkconsole.yaml, the first place every command looks)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.add_argument("--no-probe", dest="probe", action="store_false",
                   help="write without asking the nodes (the file may then be wrong)")
    p.set_defaults(func=run)


def source_cluster(args: argparse.Namespace) -> tuple[ClusterConfig, str]:
    """(ClusterConfig, what it was made from)."""
    from ..config import NAME_RE, ClusterConfig, NodeConfig, SshPolicy, check_address, default_endpoints
    ssh_config = Path(args.ssh_config).expanduser() if args.ssh_config else None
    if args.hosts:
        from ..sshconfig import default_path, lookup
        cfg_path = ssh_config or default_path()
        if not cfg_path.is_file():
            raise UserError("no SSH client config", file=str(cfg_path), field="--from-ssh-config",
                            fix="write Host entries there, or give the file with --ssh-config PATH")
        nodes, known = [], None
        for i, alias in enumerate(args.hosts):
            if alias in args.hosts[:i]:
                raise UserError(f"{alias} is given twice", field="--from-ssh-config", fix="name each host once")
            h = lookup(alias, cfg_path)
            if not h.configured:
                raise UserError(f"no Host entry sets HostName, User, Port or a key for {alias!r}", file=str(cfg_path),
                                field="--from-ssh-config", fix="name a Host of that file (`ssh -G HOST` shows one)")
            if not NAME_RE.match(alias):
                raise UserError(f"{alias!r} cannot be a node name", field="--from-ssh-config",
                                fix="use Host names of letters, digits, '-', '_' or '.'")
            address = check_address(h.address, None, (f"{alias}.HostName",))
            known = known or h.known_hosts
            nodes.append(NodeConfig(name=alias, address=address, ssh=h.ssh, role="head" if i == 0 else "worker"))
        cluster = ClusterConfig(nodes=tuple(nodes), endpoints=default_endpoints(nodes),
                                ssh=SshPolicy(known_hosts=known), source=str(cfg_path))
        return cluster, f"hosts {', '.join(args.hosts)} of {cfg_path}"
    from ..dotenv_cluster import checkout_env, checkout_gap, cluster_from_dotenv
    env = checkout_env(Path.cwd())
    if env is None:
        gap = checkout_gap(Path.cwd())
        raise UserError("nothing to write the cluster file from: "
                        + (gap if gap else "no spark-vllm-docker checkout (.env beside launch-cluster.sh) here"),
                        fix="run it in your spark-vllm-docker checkout, or name your nodes: "
                            "sparkconsole init --from-ssh-config spark1 spark2")
    got = cluster_from_dotenv(env, ssh_config)
    return got.cluster, f"{env.resolve()}" + "".join(f" ({n})" for n in got.notes)


async def probe(cluster: ClusterConfig) -> tuple[ClusterConfig, list[str]]:
    """Each node asked as preflight asks it; returns the cluster with discovered interfaces, and a note a node."""
    from ..launch.ifaces import discover
    from ..nodes.connect import make_transport
    from ..nodes.transport import TransportError
    ts = {n.name: make_transport(n, cluster.ssh) for n in cluster.nodes}
    notes: list[str] = []
    nodes = list(cluster.nodes)
    try:
        async def one(i: int) -> str:
            n = nodes[i]
            t = ts[n.name]
            try:
                res = await t.run(["sh", "-c", DOCKER_PROBE], timeout=20)
            except TransportError as exc:
                raise UserError(f"{n.name} ({n.address}) does not answer over SSH: {exc}", field=f"nodes.{n.name}",
                                fix="check the address and `ssh` to it by hand, or write anyway with --no-probe"
                                ) from None
            out = res.stdout.strip()
            if out == "NO-DOCKER":
                raise UserError(f"{n.name}: docker is not on the PATH of its SSH sessions", field=f"nodes.{n.name}",
                                fix="install Docker there (the runner needs it too), or write anyway with --no-probe")
            # an engine that does not answer is said, not refused: the operator's session may lack its group yet
            docker = (f"docker engine {out.split(' ', 1)[1]}" if out.startswith("engine ")
                      else f"docker present but its engine does not answer ({out.partition(' ')[2].strip()[:120]})")
            note = f"{n.name} ({n.address}): reachable, {docker}"
            if len(nodes) > 1:
                peer = nodes[1] if i == 0 else nodes[0]
                eth, ib, how = await discover(t, peer.address)
                if n.eth_if is None:
                    nodes[i] = replace(n, eth_if=eth, ib_if=n.ib_if or ib)
                    note += f", eth_if {eth}" + (f", ib_if {ib}" if ib and not n.ib_if else "") + f": {how}"
                elif n.eth_if != eth:
                    note += f", eth_if {n.eth_if} kept as written (the route to {peer.name} leaves by {eth})"
            return note
        notes = list(await asyncio.gather(*(one(i) for i in range(len(nodes)))))
    finally:
        await asyncio.gather(*(t.close() for t in ts.values()), return_exceptions=True)
    return replace(cluster, nodes=tuple(nodes)), notes


def render(cluster: ClusterConfig, made_from: str) -> str:
    """The cluster as sparkconsole.yaml text (what parse_cluster reads back to the same cluster)."""
    import yaml
    nodes = []
    for n in cluster.nodes:
        d: dict[str, Any] = {"name": n.name, "address": n.address}
        ssh = {k: v for k, v in (("user", n.ssh.user), ("port", n.ssh.port if n.ssh.port != 22 else None),
                                 ("identity", n.ssh.identity)) if v is not None}
        if ssh:
            d["ssh"] = ssh
        d["role"] = n.role
        d["container"] = n.container
        if n.local:
            d["local"] = True
        for k in ("eth_if", "ib_if"):
            if getattr(n, k):
                d[k] = getattr(n, k)
        if n.vllm_env:
            d["vllm_env"] = dict(n.vllm_env)
        if n.hf_home:
            d["hf_home"] = n.hf_home
        nodes.append(d)
    data: dict[str, Any] = {"nodes": nodes}
    if cluster.ssh.known_hosts:
        data["ssh"] = {"known_hosts": cluster.ssh.known_hosts}
    if cluster.master_port is not None:
        data["master_port"] = cluster.master_port
    head = (f"# Written by `sparkconsole init` from {made_from}.\n"
            "# Every key: sparkconsole's README, \"Pointing it at your Sparks\".\n")
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def refuse_existing(path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise UserError("the file exists; it is kept as it is", file=str(path), fix="add --force to overwrite it")


def write(path: Path, text: str, force: bool) -> None:
    from ..config import load_cluster
    refuse_existing(path, force)        # again: it may have appeared while the nodes were asked
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    try:
        load_cluster(tmp)           # read back as every command will read it
    except UserError:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


async def run(args: argparse.Namespace) -> int:
    out = Path(args.output).expanduser()
    refuse_existing(out, args.force)                # before anything connects
    cluster, made_from = source_cluster(args)
    notes: list[str] = []
    if args.probe:
        cluster, notes = await probe(cluster)
    text = render(cluster, " ".join(made_from.split()))
    write(out, text, args.force)
    for note in notes:
        print(note, file=sys.stderr)
    print(f"wrote {out.resolve()}:")
    print(text, end="")
    return 0
