"""A spark-vllm-docker checkout's `.env` read as the cluster, the way its runner (launch-cluster.sh) reads it.

    CLUSTER_NODES=192.168.177.11,192.168.177.12    # head first
    ETH_IF=enp1s0f1np1                             # every node's socket interface
    IB_IF=rocep1s0f1,roceP2p1s0f1                  # every node's RDMA devices
    MASTER_PORT=29501                              # the cluster launch's master port
    CONTAINER_NAME=vllm_node                       # the container's name on every node
    CONTAINER_NCCL_DEBUG=INFO                      # any other CONTAINER_X=v: X=v inside the container

As the runner does: a line is NAME=value or a comment, a name is letters, digits and _, a name given twice is
refused. LOCAL_IP and COPY_HOSTS are the runner's own business (which machine it runs on; where
build-and-copy.sh sends images) and are not read. Each node is reached over SSH as `ssh ADDRESS` reaches it
(user, port and key from ~/.ssh/config, sshconfig.py). A secret-named CONTAINER_ variable (CONTAINER_HF_TOKEN)
is not passed by value: a plan never holds a secret, and recipes take HF_TOKEN from each node's environment.
Without CLUSTER_NODES the runner discovers the nodes; here the cluster is this machine, with the file's settings.
"""

from __future__ import annotations

import io
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import secrets
from .config import (
    CONTAINER_RE,
    HF_HOME_RE,
    IFACE_RE,
    NAME_RE,
    ClusterConfig,
    NodeConfig,
    SshPolicy,
    check_address,
    default_endpoints,
    hf_home_env,
)
from .errors import UserError
from .yamlsrc import read_user_file

RUNNER_FILES = ("launch-cluster.sh", "run-recipe.py", "run-recipe.sh")
MAX_BYTES = 256 * 1024
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True)
class DotenvCluster:
    cluster: ClusterConfig
    checkout: Path
    notes: tuple[str, ...] = ()          # what was read differently from the runner, one short clause each


def checkout_env(directory: Path) -> Path | None:
    """The `.env` of a spark-vllm-docker checkout at `directory` (its runner's files beside it), or None."""
    env = directory / ".env"
    if env.is_file() and any((directory / f).is_file() for f in RUNNER_FILES):
        return env
    return None


def checkout_gap(directory: Path) -> str | None:
    """What keeps `directory` from being read as a spark-vllm-docker checkout when half of one is there: a `.env`
    with no runner beside it, or a runner with no `.env`. None when neither is there (or both are)."""
    env = (directory / ".env").is_file()
    runner = next((f for f in RUNNER_FILES if (directory / f).is_file()), None)
    if env and runner is None:
        return (f"./.env is not read: none of {', '.join(RUNNER_FILES)} is beside it, so this is not a "
                "spark-vllm-docker checkout (run sparkconsole in the checkout's own directory)")
    if runner is not None and not env:
        return (f"./{runner} is here but no .env beside it: the runner finds the nodes by its autodiscovery, which "
                "sparkconsole does not run (its `--discover` writes the .env, with CLUSTER_NODES)")
    return None


def read_dotenv(path: Path) -> dict[str, tuple[str, int]]:
    """NAME → (value, line), parsed by python-dotenv (quotes, `export`, comments); the runner's refusals kept."""
    from dotenv.parser import parse_stream
    file = str(path)
    raw = read_user_file(path, MAX_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"not UTF-8 text (byte {exc.start})", file=file, fix="save the file as UTF-8") from None
    out: dict[str, tuple[str, int]] = {}
    for b in parse_stream(io.StringIO(text)):
        lead = b.original.string[:len(b.original.string) - len(b.original.string.lstrip())]
        line = b.original.line + lead.count("\n")      # the parser counts blank lines before a binding as its own
        if b.error or (b.key is not None and b.value is None):
            shown = b.original.string.strip()[:40]
            raise UserError(f"not a NAME=value line ({shown!r})", file=file, line=line,
                            field=b.key or shown.split("=")[0][:40] or None,
                            fix="write NAME=value (quotes around a value with blanks), or start the line with #")
        if b.key is None or b.value is None:          # (a key without a value was refused above)
            continue                                  # a blank line or a comment
        if not _KEY_RE.match(b.key):
            raise UserError(f"bad variable name {b.key[:40]!r}", file=file, line=line, field=b.key[:40],
                            fix="use letters, digits and _, not starting with a digit")
        if b.key in out:
            raise UserError(f"{b.key} is set twice (lines {out[b.key][1]} and {line}); the runner refuses that",
                            file=file, line=line, field=b.key, fix="delete one of the two lines")
        out[b.key] = (b.value, line)
    return out


class _Env:
    """A read `.env`: its values, and the one-line error naming the file, the line and the variable."""

    def __init__(self, path: Path) -> None:
        self.file = str(path)
        self.env = read_dotenv(path)

    def bad(self, key: str, problem: str, fix: str) -> UserError:
        return UserError(problem, file=self.file, line=self.env[key][1], field=key, fix=fix)

    def value(self, key: str) -> str | None:
        v = self.env.get(key, ("", 0))[0].strip()
        return v or None


def cluster_from_dotenv(path: Path, ssh_config: Path | None = None) -> DotenvCluster:
    """The cluster a `.env` describes; a bad value is a one-line UserError naming file, line, variable, fix."""
    from .sshconfig import lookup
    e = _Env(path)
    notes: list[str] = []
    settings = _node_settings(e, notes)
    master_port = None
    mp = e.value("MASTER_PORT")
    if mp is not None:
        if not mp.isdigit() or not 1 <= int(mp) <= 65535:
            raise e.bad("MASTER_PORT", f"{mp[:20]!r} is not a port", "write a port number 1-65535, e.g. 29501")
        master_port = int(mp)
    nodes: list[NodeConfig] = []
    known_hosts: str | None = None
    addresses = [a.strip() for a in (e.value("CLUSTER_NODES") or "").split(",") if a.strip()]
    for i, address in enumerate(addresses):
        try:
            address = check_address(address, None, ("CLUSTER_NODES",))
        except UserError as exc:
            raise e.bad("CLUSTER_NODES", exc.problem, exc.fix or "write the nodes' IP addresses, head first") from None
        if address in addresses[:i]:
            raise e.bad("CLUSTER_NODES", f"{address} is listed twice", "list each node once, head first")
        host = lookup(address, ssh_config)
        known_hosts = known_hosts or host.known_hosts
        nodes.append(NodeConfig(name=_node_name(address, i, nodes), address=address, ssh=host.ssh,
                                role="head" if i == 0 else "worker", **settings))
    if not nodes:
        notes.append("no CLUSTER_NODES: this machine only")
        nodes.append(NodeConfig(name=socket.gethostname()[:63] or "local", address="127.0.0.1", role="head",
                                local=True, **settings))
    cluster = ClusterConfig(nodes=tuple(nodes), endpoints=default_endpoints(nodes), source=e.file,
                            ssh=SshPolicy(known_hosts=known_hosts), master_port=master_port)
    return DotenvCluster(cluster, path.parent, tuple(notes))


def _node_settings(e: _Env, notes: list[str]) -> dict[str, Any]:
    """What every node of the `.env` shares: the container's name and environment, the interfaces, the HF cache."""
    container = e.value("CONTAINER_NAME") or "vllm_node"
    if not CONTAINER_RE.match(container):
        raise e.bad("CONTAINER_NAME", f"bad container name {container[:40]!r}", "use letters, digits, '_', '.', '-'")
    ifaces: dict[str, str | None] = {}
    for key in ("ETH_IF", "IB_IF"):
        v = e.value(key)
        if v is not None and not IFACE_RE.match(v):
            raise e.bad(key, f"bad interface name {v[:40]!r}", "write the interface name, e.g. enp1s0f1np1")
        ifaces[key.lower()] = v
    vllm_env = []
    for key, (v, _line) in e.env.items():
        if not key.startswith("CONTAINER_") or key == "CONTAINER_NAME":
            continue
        name = key[len("CONTAINER_"):]
        if not _ENV_NAME_RE.match(name):
            raise e.bad(key, f"{name[:40]!r} is not a variable name for the container", "write CONTAINER_NAME_OF_VAR=v")
        if secrets.is_secret_name(name):
            secrets.register(v)           # never shown anywhere, even though it is not used
            notes.append(f"{key} not passed by value (a plan holds no secret): each node's own {name} is passed")
            continue
        vllm_env.append((name, v))
    hf_home = e.value("HF_HOME")
    if hf_home is not None and not HF_HOME_RE.match(hf_home):
        # the runner expands it once, on the head; a node's shell here takes it literally
        raise e.bad("HF_HOME", f"{hf_home[:60]!r} is not an absolute path",
                    "write the Hugging Face cache's absolute path, e.g. HF_HOME=/data/huggingface")
    return dict(container=container, vllm_env=tuple(vllm_env), hf_home=hf_home, env=hf_home_env(hf_home), **ifaces)


def _node_name(address: str, i: int, taken: list[NodeConfig]) -> str:
    """spark1, spark2, … for addresses; a host name's first label when it is one (and free)."""
    try:
        import ipaddress
        ipaddress.ip_address(address)
    except ValueError:
        label = address.split(".")[0]
        if NAME_RE.match(label) and all(n.name != label for n in taken):
            return label
    return f"spark{i + 1}"
