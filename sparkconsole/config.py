"""The cluster file (`sparkconsole.yaml`): nodes, endpoints, alert thresholds, SSH policy.

Search order: `--cluster PATH`, then ./sparkconsole.yaml, then ~/.config/sparkconsole/sparkconsole.yaml (then a
spark-vllm-docker checkout's `.env`, or this machine: clusterfile.py).
Every problem is a one-line `UserError` naming file, line, field and fix.

    nodes:
      - name: spark1
        address: 192.168.100.10        # IP literal or resolvable non-mDNS name (.local refused)
        ssh: {user: ops, port: 22, identity: ~/.ssh/id_ed25519}
        role: head                      # head | worker
        container: vllm_node            # the vLLM container's name on that node
        vllm_port: 8000
        vllm_env: {NCCL_DEBUG: WARN}    # optional: environment for vLLM containers launched on this node
    endpoints:                          # optional; default: one vLLM endpoint per node
      - {name: router, url: "http://192.168.100.10:4000", kind: router}
    thresholds: {temp_margin_c: 5, headroom_floor_gib: 8, stall_seconds: 30, stall_power_w: 30}
    ssh: {known_hosts: ~/.ssh/known_hosts, trust_on_first_use: false, connect_timeout_s: 10}
    agent: {interval_s: 0.5}
    recorder: {enabled: true, full_rate_hours: 24, keep_days: 14, max_mb: 1024}    # docs/RECORDER.md
    protect: {stop_container_before_exhaustion_s: 15, containers: launched}        # 0: off; any: every container
    master_port: 29501                  # optional: a cluster launch's master port (the runner's MASTER_PORT)
    notify: {webhook: URL, ntfy: URL, bell: false, min_severity: warn, rate_limit_s: 60}
    gateway: {port: 4100}               # optional: one endpoint on the head for every running model (launch/gateway.py)
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UserError
from .yamlsrc import Located, Path_, load_file

CONFIG_NAME = "sparkconsole.yaml"
IFACE_RE = re.compile(r"^[A-Za-z0-9_.:,-]{1,64}$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
CONTAINER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_HOST_RE = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


@dataclass(frozen=True)
class SshSettings:
    user: str | None = None          # None: ~/.ssh/config or the local user decides
    port: int = 22
    identity: str | None = None


@dataclass(frozen=True)
class NodeConfig:
    name: str
    address: str
    ssh: SshSettings = field(default_factory=SshSettings)
    role: str = "worker"             # head | worker
    container: str = "vllm_node"
    vllm_port: int = 8000
    local: bool = False              # run the agent on this machine, no SSH (address must be loopback)
    eth_if: str | None = None        # NCCL/GLOO socket interface on this node (cluster launches), e.g. enp1s0f0np0
    ib_if: str | None = None         # RDMA device(s) for NCCL_IB_HCA, e.g. rocep1s0f0,roceP2p1s0f0
    # Environment for the vLLM containers a launch starts on this node, after the recipe's own: what differs per
    # node (e.g. VLLM_CPU_OMP_THREADS_BIND on a CPU test bed whose "nodes" share one machine's cores).
    vllm_env: tuple[tuple[str, str], ...] = ()
    # The node's Hugging Face cache when it is not the node's own $HF_HOME (or ~/.cache/huggingface): the HF_HOME
    # a spark-vllm-docker checkout's .env names. Put in `env`, so every command on the node (the plan's cache
    # mount, `model pull`, preflight's model probe) looks there.
    hf_home: str | None = None
    # Set programmatically only (the simulator, hf_home): extra agent flags and environment for node commands.
    agent_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


# An absolute path, as a node's shell takes it literally (the value is quoted: no ~ or $ expansion there).
HF_HOME_RE = re.compile(r"^/[A-Za-z0-9._/+@:=,-]{0,511}$")


def hf_home_env(hf_home: str | None) -> tuple[tuple[str, str], ...]:
    """A node's hf_home as the environment of the commands run on it."""
    return (("HF_HOME", hf_home),) if hf_home else ()


@dataclass(frozen=True)
class EndpointConfig:
    name: str
    url: str
    kind: str = "vllm"               # vllm | router
    node: str | None = None          # the node that hosts it, if any
    metrics_url: str | None = None   # where /metrics lives when not on `url` (vllm-router: its own port)


@dataclass(frozen=True)
class Thresholds:
    temp_margin_c: float = 5.0       # alert when within this many °C of the slowdown threshold
    headroom_floor_gib: float = 8.0  # alert when MemAvailable drops below this
    stall_seconds: float = 30.0      # silent stall: running requests, no new tokens for this long…
    stall_power_w: float = 30.0      # …while GPU power sits below this


@dataclass(frozen=True)
class SshPolicy:
    known_hosts: str | None = None   # None: asyncssh's default (~/.ssh/known_hosts)
    trust_on_first_use: bool = False
    connect_timeout_s: float = 10.0


@dataclass(frozen=True)
class RecorderSettings:
    """The flight recorder (sparkconsole/recorder): what is kept, and for how long."""
    enabled: bool = True
    full_rate_hours: float = 24.0    # every tick kept this long…
    keep_days: float = 14.0          # …then per-10-s min/mean/max until this age…
    max_mb: float = 1024.0           # …or until the file passes this size (oldest dropped first)


PROTECT_CONTAINERS = ("launched", "any")


@dataclass(frozen=True)
class ProtectSettings:
    """The guard action (protect.py): stop the container whose memory grew when the node's memory is estimated to
    run out within this many seconds (nodes/forecast.py; 0: off). On by default, for the containers this project
    launched (`containers: launched`, its `sparkconsole.*` labels): on a GB10 a runaway in GPU memory is not
    stopped by the container's cap, and a frozen node loses every workload on it anyway, so stopping the one that
    grew costs less than the freeze it prevents. `containers: any` lets it stop any container (one started by hand)."""
    stop_container_before_exhaustion_s: float = 15.0
    containers: str = "launched"


@dataclass(frozen=True)
class NotifySettings:
    """Where alerts go besides the screen (sparkconsole/notify)."""
    webhook: str | None = None       # JSON POST of each alert
    ntfy: str | None = None          # ntfy-style topic URL: plain-text POST with Title/Priority headers
    bell: bool = False               # terminal bell on a bad alert
    min_severity: str = "warn"       # warn | bad
    rate_limit_s: float = 60.0       # at most one message per alert key in this long (clears always pass)


@dataclass(frozen=True)
class GatewaySettings:
    """The gateway: one LiteLLM proxy on the head node that lists every running workload by its served model name
    (launch/gateway.py). Present in the cluster file: launches, restarts and stops keep it current."""
    port: int = 4100
    image: str = "ghcr.io/berriai/litellm:v1.106.2"
    version: str = "1.106.2"           # 1.82.7 / 1.82.8 are refused, as for a recipe's router
    command: tuple[str, ...] = ("litellm",)
    volumes: tuple[str, ...] = ()      # HOST:CONTAINER[:ro], mounted as written (an image without LiteLLM inside)


@dataclass(frozen=True)
class ClusterConfig:
    nodes: tuple[NodeConfig, ...]
    endpoints: tuple[EndpointConfig, ...]
    thresholds: Thresholds = field(default_factory=Thresholds)
    ssh: SshPolicy = field(default_factory=SshPolicy)
    agent_interval_s: float = 0.5
    source: str = "<built-in>"
    simulated: bool = False
    recorder: RecorderSettings = field(default_factory=RecorderSettings)
    protect: ProtectSettings = field(default_factory=ProtectSettings)
    notify: NotifySettings = field(default_factory=NotifySettings)
    master_port: int | None = None   # a cluster launch's master port; None: the recipe's (or the planner's default)
    gateway: GatewaySettings | None = None   # None: no gateway (the cluster file has no `gateway:` section)

    def node(self, name: str) -> NodeConfig:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def head(self) -> NodeConfig:
        return next((n for n in self.nodes if n.role == "head"), self.nodes[0])


def find_config(explicit: str | None = None, cwd: Path | None = None) -> Path | None:
    """The cluster file to use, or None when there is none anywhere."""
    if explicit:
        return Path(explicit).expanduser()
    here = (cwd or Path.cwd()) / CONFIG_NAME
    if here.is_file():
        return here
    xdg = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "sparkconsole" / CONFIG_NAME
    if xdg.is_file():
        return xdg
    return None


def check_address(address: Any, doc: Located | None, path: Path_) -> str:
    """IP literal or a plain DNS name; `.local` (mDNS) is refused with the reason."""
    def err(problem: str, fix: str) -> UserError:
        return doc.error(path, problem, fix) if doc else UserError(problem, field=".".join(map(str, path)), fix=fix)
    if not isinstance(address, str) or not address.strip():
        raise err("address must be a text value", "write the node's IP address, e.g. 192.168.100.10")
    a = address.strip()
    try:
        ipaddress.ip_address(a)
        return a
    except ValueError:
        pass
    if a.lower().rstrip(".").endswith(".local"):
        raise err(f"mDNS name {a!r} refused: .local names crashed published runs at c64 and do not resolve "
                  "inside containers", "use the node's IP address instead")
    if not _HOST_RE.match(a):
        raise err(f"{a!r} is neither an IP address nor a host name", "write the node's IP address")
    return a


def _get(doc: Located, m: dict[str, Any], path: Path_, key: str, kind: type | tuple[type, ...], default: Any,
         fix: str) -> Any:
    if key not in m or m[key] is None:
        return default
    v = m[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(v, bool) and bool not in kinds:
        raise doc.error(path + (key,), f"expected {kinds[0].__name__}, got {v!r}", fix)
    if not isinstance(v, kinds):
        raise doc.error(path + (key,), f"expected {kinds[0].__name__}, got {type(v).__name__} {str(v)[:40]!r}", fix)
    return v


def _unknown(doc: Located, m: dict[str, Any], path: Path_, allowed: set[str]) -> None:
    for k in m:
        if k not in allowed:
            raise doc.error(path + (k,), f"unknown key {str(k)[:40]!r}", f"remove it, or use one of: {', '.join(sorted(allowed))}")


def _port(doc: Located, m: dict[str, Any], path: Path_, key: str, default: int) -> int:
    v: int = _get(doc, m, path, key, int, default, "write a port number 1-65535")
    if not 1 <= v <= 65535:
        raise doc.error(path + (key,), f"port {v} out of range", "write a port number 1-65535")
    return v


def _number(doc: Located, m: dict[str, Any], path: Path_, key: str, default: float, lo: float, hi: float) -> float:
    v = _get(doc, m, path, key, (int, float), default, f"write a number between {lo} and {hi}")
    if not (lo <= float(v) <= hi):
        raise doc.error(path + (key,), f"{v} out of range", f"write a number between {lo} and {hi}")
    return float(v)


def _env_map(doc: Located, m: dict[str, Any], path: Path_) -> tuple[tuple[str, str], ...]:
    raw = _get(doc, m, path, "vllm_env", dict, {}, "write 'vllm_env: {NAME: value}'")
    out = []
    for k, v in raw.items():
        if not isinstance(k, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$", k):
            raise doc.error(path + ("vllm_env", k), f"bad variable name {str(k)[:40]!r}", "use letters, digits and _")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise doc.error(path + ("vllm_env", k), "an environment value must be a single value",
                            "write a number or text")
        out.append((k, str(v)))
    return tuple(out)


def parse_cluster(doc: Located) -> ClusterConfig:
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "the cluster file must be a mapping with a 'nodes' list", "start the file with 'nodes:'")
    _unknown(doc, data, (), {"nodes", "endpoints", "thresholds", "ssh", "agent", "recorder", "protect", "notify",
                             "master_port", "gateway"})
    nodes = _nodes(doc, data)
    return ClusterConfig(nodes=tuple(nodes), endpoints=tuple(_endpoints(doc, data, nodes)),
                         thresholds=_thresholds(doc, data), ssh=_ssh_policy(doc, data),
                         agent_interval_s=_agent_interval(doc, data), source=doc.file, recorder=_recorder(doc, data),
                         protect=_protect(doc, data), notify=_notify(doc, data),
                         master_port=None if data.get("master_port") is None else _port(doc, data, (), "master_port", 0),
                         gateway=_gateway(doc, data))


def _nodes(doc: Located, data: dict[str, Any]) -> list[NodeConfig]:
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise doc.error(("nodes",), "at least one node is required", "add a 'nodes:' list with name and address")
    if len(raw_nodes) > 256:
        raise doc.error(("nodes",), f"{len(raw_nodes)} nodes (limit 256)", "split the cluster file")
    nodes: list[NodeConfig] = []
    seen: set[str] = set()
    for i, rn in enumerate(raw_nodes):
        node = _node(doc, rn, i)
        if node.name in seen:
            raise doc.error(("nodes", i, "name"), f"duplicate node name {node.name!r}", "give each node its own name")
        seen.add(node.name)
        nodes.append(node)
    if sum(1 for n in nodes if n.role == "head") > 1:
        raise doc.error(("nodes",), "more than one node has role head", "mark exactly one node 'role: head'")
    return nodes


def _node(doc: Located, rn: Any, i: int) -> NodeConfig:
    p: tuple[str | int, ...] = ("nodes", i)
    if not isinstance(rn, dict):
        raise doc.error(p, "each node must be a mapping", "write '- name: spark1' then 'address: 192.168.100.10'")
    _unknown(doc, rn, p, {"name", "address", "ssh", "role", "container", "vllm_port", "local", "eth_if", "ib_if",
                          "vllm_env", "hf_home"})
    name = _get(doc, rn, p, "name", str, None, "give the node a short name, e.g. spark1")
    if name is None or not NAME_RE.match(name):
        raise doc.error(p + ("name",), f"bad node name {str(name)[:40]!r}", "use letters, digits, '-', '_' or '.' (max 63)")
    if "address" not in rn:
        raise doc.error(p, f"node {name!r} has no address", "add 'address: <IP>'")
    address = check_address(rn["address"], doc, p + ("address",))
    role = _get(doc, rn, p, "role", str, "head" if i == 0 else "worker", "write head or worker")
    if role not in ("head", "worker"):
        raise doc.error(p + ("role",), f"unknown role {role[:20]!r}", "write head or worker")
    container = _get(doc, rn, p, "container", str, "vllm_node", "write the vLLM container's name")
    if not CONTAINER_RE.match(container):
        raise doc.error(p + ("container",), f"bad container name {container[:40]!r}", "use letters, digits, '_', '.', '-'")
    local = _get(doc, rn, p, "local", bool, False, "write true or false")
    ifaces = {}
    for key in ("eth_if", "ib_if"):
        v = _get(doc, rn, p, key, str, None, "write the interface name, e.g. enp1s0f0np0")
        if v is not None and not IFACE_RE.match(v):
            raise doc.error(p + (key,), f"bad interface name {v[:40]!r}", "write the interface name, e.g. enp1s0f0np0")
        ifaces[key] = v
    hf_home = _get(doc, rn, p, "hf_home", str, None, "write the absolute path of the node's Hugging Face cache")
    if hf_home is not None and not HF_HOME_RE.match(hf_home):
        raise doc.error(p + ("hf_home",), f"hf_home {hf_home[:60]!r} is not an absolute path",
                        "write the node's Hugging Face cache as an absolute path, e.g. /data/huggingface")
    return NodeConfig(name=name, address=address, ssh=_node_ssh(doc, rn, p), role=role, container=container,
                      vllm_port=_port(doc, rn, p, "vllm_port", 8000), local=local,
                      vllm_env=_env_map(doc, rn, p), hf_home=hf_home, env=hf_home_env(hf_home), **ifaces)


def _node_ssh(doc: Located, rn: dict[str, Any], p: tuple[str | int, ...]) -> SshSettings:
    rs = rn.get("ssh") or {}
    if not isinstance(rs, dict):
        raise doc.error(p + ("ssh",), "ssh must be a mapping", "write 'ssh: {user: ops, port: 22}'")
    _unknown(doc, rs, p + ("ssh",), {"user", "port", "identity"})
    user = _get(doc, rs, p + ("ssh",), "user", str, None, "write the SSH user name")
    if user is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$", user):
        raise doc.error(p + ("ssh", "user"), f"bad user name {user[:40]!r}", "write a plain Unix user name")
    return SshSettings(user=user, port=_port(doc, rs, p + ("ssh",), "port", 22),
                       identity=_get(doc, rs, p + ("ssh",), "identity", str, None, "write the path of a private key"))


def _endpoints(doc: Located, data: dict[str, Any], nodes: list[NodeConfig]) -> list[EndpointConfig]:
    raw_eps = data.get("endpoints")
    if raw_eps is None:
        return list(default_endpoints(nodes))
    if not isinstance(raw_eps, list):
        raise doc.error(("endpoints",), "endpoints must be a list", "write '- {name: router, url: http://IP:4000, kind: router}'")
    names = {n.name for n in nodes}
    endpoints: list[EndpointConfig] = []
    for i, re_ in enumerate(raw_eps):
        p: tuple[str | int, ...] = ("endpoints", i)
        if not isinstance(re_, dict):
            raise doc.error(p, "each endpoint must be a mapping", "write '{name: NAME, url: http://IP:PORT}'")
        _unknown(doc, re_, p, {"name", "url", "kind", "node", "metrics_url"})
        name = _get(doc, re_, p, "name", str, None, "name the endpoint")
        url = _get(doc, re_, p, "url", str, None, "write http://IP:PORT")
        if not name or not url:
            raise doc.error(p, "an endpoint needs a name and a url", "write '{name: NAME, url: http://IP:PORT}'")
        _check_url(doc, p + ("url",), url)
        metrics_url = _get(doc, re_, p, "metrics_url", str, None, "write http://IP:PORT/metrics")
        if metrics_url is not None:
            _check_url(doc, p + ("metrics_url",), metrics_url)
        kind = _get(doc, re_, p, "kind", str, "vllm", "write vllm or router")
        if kind not in ("vllm", "router"):
            raise doc.error(p + ("kind",), f"unknown kind {kind[:20]!r}", "write vllm or router")
        node = _get(doc, re_, p, "node", str, None, "name one of the nodes")
        if node is not None and node not in names:
            raise doc.error(p + ("node",), f"no node named {node[:40]!r}", "name one of: " + ", ".join(sorted(names)))
        endpoints.append(EndpointConfig(name=name, url=url.rstrip("/"), kind=kind, node=node,
                                        metrics_url=metrics_url.rstrip("/") if metrics_url else None))
    return endpoints


def _thresholds(doc: Located, data: dict[str, Any]) -> Thresholds:
    rt = data.get("thresholds") or {}
    if not isinstance(rt, dict):
        raise doc.error(("thresholds",), "thresholds must be a mapping", "write 'thresholds: {temp_margin_c: 5}'")
    _unknown(doc, rt, ("thresholds",), {"temp_margin_c", "headroom_floor_gib", "stall_seconds", "stall_power_w"})
    t = ("thresholds",)
    return Thresholds(
        temp_margin_c=_number(doc, rt, t, "temp_margin_c", 5.0, 0, 50),
        headroom_floor_gib=_number(doc, rt, t, "headroom_floor_gib", 8.0, 0, 4096),
        stall_seconds=_number(doc, rt, t, "stall_seconds", 30.0, 1, 3600),
        stall_power_w=_number(doc, rt, t, "stall_power_w", 30.0, 0, 2000),
    )


def _ssh_policy(doc: Located, data: dict[str, Any]) -> SshPolicy:
    rs = data.get("ssh") or {}
    if not isinstance(rs, dict):
        raise doc.error(("ssh",), "ssh must be a mapping", "write 'ssh: {known_hosts: ~/.ssh/known_hosts}'")
    _unknown(doc, rs, ("ssh",), {"known_hosts", "trust_on_first_use", "connect_timeout_s"})
    return SshPolicy(
        known_hosts=_get(doc, rs, ("ssh",), "known_hosts", str, None, "write a known_hosts path"),
        trust_on_first_use=_get(doc, rs, ("ssh",), "trust_on_first_use", bool, False, "write true or false"),
        connect_timeout_s=_number(doc, rs, ("ssh",), "connect_timeout_s", 10.0, 0.5, 300),
    )


def _agent_interval(doc: Located, data: dict[str, Any]) -> float:
    ra = data.get("agent") or {}
    if not isinstance(ra, dict):
        raise doc.error(("agent",), "agent must be a mapping", "write 'agent: {interval_s: 0.5}'")
    _unknown(doc, ra, ("agent",), {"interval_s"})
    return _number(doc, ra, ("agent",), "interval_s", 0.5, 0.05, 60)


def _section(doc: Located, data: dict[str, Any], key: str, example: str, allowed: set[str]) -> dict[str, Any]:
    m = data.get(key) or {}
    if not isinstance(m, dict):
        raise doc.error((key,), f"{key} must be a mapping", f"write '{key}: {example}'")
    _unknown(doc, m, (key,), allowed)
    return m


def _recorder(doc: Located, data: dict[str, Any]) -> RecorderSettings:
    m = _section(doc, data, "recorder", "{full_rate_hours: 24, keep_days: 14, max_mb: 1024}",
                 {"enabled", "full_rate_hours", "keep_days", "max_mb"})
    p = ("recorder",)
    full = _number(doc, m, p, "full_rate_hours", 24.0, 0.1, 24 * 365)
    keep = _number(doc, m, p, "keep_days", 14.0, 0.01, 3650)
    if keep * 24 < full:
        raise doc.error(p + ("keep_days",), f"keep_days {keep:g} is shorter than full_rate_hours {full:g}",
                        "keep the 10-s summaries at least as long as the full-rate ticks")
    return RecorderSettings(enabled=_get(doc, m, p, "enabled", bool, True, "write true or false"),
                            full_rate_hours=full, keep_days=keep, max_mb=_number(doc, m, p, "max_mb", 1024.0, 1, 1 << 20))


def _protect(doc: Located, data: dict[str, Any]) -> ProtectSettings:
    m = _section(doc, data, "protect", "{stop_container_before_exhaustion_s: 15, containers: launched}",
                 {"stop_container_before_exhaustion_s", "containers"})
    which = _get(doc, m, ("protect",), "containers", str, "launched", "write launched or any")
    if which not in PROTECT_CONTAINERS:
        raise doc.error(("protect", "containers"), f"unknown value {which!r}",
                        "write launched (the containers this console launched) or any")
    return ProtectSettings(stop_container_before_exhaustion_s=_number(
        doc, m, ("protect",), "stop_container_before_exhaustion_s", 15.0, 0, 600), containers=which)


def _notify(doc: Located, data: dict[str, Any]) -> NotifySettings:
    m = _section(doc, data, "notify", "{webhook: http://127.0.0.1:9000/hook, bell: true}",
                 {"webhook", "ntfy", "bell", "min_severity", "rate_limit_s"})
    p = ("notify",)
    urls = {}
    for key in ("webhook", "ntfy"):
        v = _get(doc, m, p, key, str, None, "write http(s)://HOST[:PORT]/PATH")
        if v is not None and not re.match(r"^https?://[^\s/]+(/\S*)?$", v):
            raise doc.error(p + (key,), "bad url (not shown: it may carry a token)", "write http(s)://HOST[:PORT]/PATH")
        urls[key] = v
    sev = _get(doc, m, p, "min_severity", str, "warn", "write warn or bad")
    if sev not in ("warn", "bad"):
        raise doc.error(p + ("min_severity",), f"unknown severity {sev[:20]!r}", "write warn or bad")
    return NotifySettings(**urls, bell=_get(doc, m, p, "bell", bool, False, "write true or false"), min_severity=sev,
                          rate_limit_s=_number(doc, m, p, "rate_limit_s", 60.0, 0, 86400))


def _gateway(doc: Located, data: dict[str, Any]) -> GatewaySettings | None:
    if "gateway" not in data:
        return None
    m = _section(doc, data, "gateway", "{port: 4100}", {"port", "image", "version", "command", "volumes"})
    p = ("gateway",)
    d = GatewaySettings()
    lists = {}
    for key in ("command", "volumes"):
        v = m.get(key)
        if v is None:
            continue
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise doc.error(p + (key,), f"{key} must be a list of text", f"write '{key}: [...]'")
        lists[key] = tuple(v)
    version = m.get("version", d.version)
    if not isinstance(version, (str, int, float)) or isinstance(version, bool):
        raise doc.error(p + ("version",), "version must be text", 'write version: "1.106.2"')
    return GatewaySettings(port=_port(doc, m, p, "port", d.port),
                           image=_get(doc, m, p, "image", str, d.image, "write the LiteLLM image"),
                           version=str(version), command=lists.get("command", d.command),
                           volumes=lists.get("volumes", d.volumes))


def _check_url(doc: Located, path: Path_, url: str) -> None:
    if not re.match(r"^https?://[^\s/]+(:\d+)?(/\S*)?$", url):
        raise doc.error(path, f"bad url {url[:60]!r}", "write http://IP:PORT")
    host = re.sub(r"^https?://", "", url).split("/")[0]
    host = host[1:host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
    check_address(host, doc, path)


def default_endpoints(nodes: Sequence[NodeConfig]) -> tuple[EndpointConfig, ...]:
    """No endpoints written: one vLLM endpoint per node, on its vllm_port."""
    return tuple(EndpointConfig(name=n.name, url=f"http://{_url_host(n.address)}:{n.vllm_port}", node=n.name)
                 for n in nodes)


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def load_cluster(path: str | Path) -> ClusterConfig:
    return parse_cluster(load_file(path))


def local_cluster() -> ClusterConfig:
    """The fallback when no cluster file exists: this machine as its one node, read without SSH."""
    import socket
    node = NodeConfig(name=socket.gethostname()[:63] or "local", address="127.0.0.1", role="head", local=True)
    return ClusterConfig(nodes=(node,), endpoints=(), source="<this machine>")
