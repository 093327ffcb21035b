"""Recipes: the spark-vllm-docker (run-recipe.sh) YAML format, read as it is, plus sparkconsole's own section.

Community fields (eugr/spark-vllm-docker, recipe_version "1"): name, description, model, container, command
(a `vllm serve …` template whose `{placeholders}` are filled with Python str.format from `defaults` and
overrides, `{{`/`}}` for literal braces), defaults, env, mods, build_args, cluster_only, solo_only.

sparkconsole's optional section, all keys optional:

    sparkconsole:
      topologies: [solo, cluster-tp2, 2x-solo, disagg]
      topology_defaults: {cluster-tp2: {tensor_parallel: 2}}      # placeholder values per topology
      container: {memory: 100g, shm_size: 64g, gpus: all, ipc_host: true, init: false,
                  volumes: ["/host:/ctr:ro"], tmpfs: ["/tmp"], name: vllm_node}
      secrets: {HF_TOKEN: env, OTHER_TOKEN: "file:/etc/sparkconsole/other"}   # passed by reference, never by value
      cluster: {backend: mp, master_port: 29501, eth_if: enp1s0f0np0, ib_if: rocep1s0f0}
      router: {default: vllm-router, port: 4000,
               vllm_router: {image: …, version: "0.1.17", policy: round_robin, command: [vllm-router]},
               litellm: {image: …, version: "1.106.2", strategy: simple-shuffle, command: [litellm]}}
      disagg: {connector: NixlConnector, side_channel_port: 5600, prefill_port: 8100, decode_port: 8200}

Unknown keys inside `sparkconsole:` are errors; unknown top-level keys (forks add their own) are kept as
warnings that `recipe lint` reports. Every problem is a one-line UserError naming file, line, field and fix.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..yamlsrc import Located, Path_, load_file
from .bashread import command_warnings

TOPOLOGIES = ("solo", "cluster-tp2", "2x-solo", "disagg")
COMMUNITY_KEYS = {"recipe_version", "name", "description", "model", "container", "command", "defaults", "env",
                  "mods", "build_args", "cluster_only", "solo_only"}
SECTION = "sparkconsole"
SUPPORTED_VERSIONS = ("1",)
# The placeholders run-recipe.sh fills from its own flags; any other name must come from defaults or --set.
CLI_PLACEHOLDERS = ("port", "host", "tensor_parallel", "gpu_memory_utilization", "max_model_len",
                    "max_num_batched_tokens")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIZE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?[bkmgtBKMGT]?$")
_CONTAINER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class ContainerSettings:
    name: str | None = None            # None: the node's `container` from the cluster file
    # the container's memory cap: it holds vLLM's CPU side (Python, compile workers, host buffers), so a runaway
    # there kills the container, not the host; it does not hold GPU memory, which a GB10 does not charge to the
    # container's cgroup (graphistry/pygraphistry PR 1671, Blackwellboy/model-serving-minefield issue 57)
    memory: str | None = "100g"
    shm_size: str | None = "64g"       # spark-vllm-docker's launch-cluster.sh default
    gpus: str | None = "all"           # None: no --gpus (CPU test bed)
    ipc_host: bool = True
    init: bool = False
    volumes: tuple[str, ...] = ()      # may hold {placeholders}
    tmpfs: tuple[str, ...] = ()
    # As launch-cluster.sh starts the container: privileged (RDMA devices for NCCL over the ConnectX-7 link),
    # the nofile ulimit, and the node's compile caches mounted (vLLM, FlashInfer, Triton, TileLang).
    privileged: bool = True
    nofile: int | None = 1048576       # launch-cluster.sh's VLLM_SPARK_NOFILE_LIMIT default
    pids_limit: int = 4096             # non-privileged mode only, as the runner's --pids-limit
    rdma: bool = True                  # non-privileged mode: the RDMA devices (/dev/infiniband) passed in
    cache_dirs: bool = True


@dataclass(frozen=True)
class RouterImpl:
    image: str | None = None
    version: str | None = None         # pinned; 1.82.7 / 1.82.8 of LiteLLM are refused
    policy: str | None = None          # vllm-router --policy, or LiteLLM routing_strategy
    command: tuple[str, ...] = ()      # the executable inside the image (may hold {placeholders})
    volumes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RouterSettings:
    default: str = "vllm-router"       # vllm-router | simple-shuffle | least-busy
    port: int = 4000
    vllm_router: RouterImpl = field(default_factory=lambda: RouterImpl(
        image="vllm-router:0.1.17", version="0.1.17", policy="round_robin", command=("vllm-router",)))
    litellm: RouterImpl = field(default_factory=lambda: RouterImpl(
        image="ghcr.io/berriai/litellm:v1.106.2", version="1.106.2", policy="simple-shuffle",
        command=("litellm",)))


@dataclass(frozen=True)
class ClusterSettings:
    backend: str = "mp"                # mp: vLLM's own --nnodes/--node-rank launch; ray: ray start + executor ray
    master_port: int = 29501
    eth_if: str | None = None
    ib_if: str | None = None
    ray: tuple[str, ...] = ("ray",)    # how the container runs Ray's CLI (its path, when not on the image's PATH)


@dataclass(frozen=True)
class DisaggSettings:
    connector: str = "NixlConnector"
    kv_buffer_device: str | None = None  # None: the connector's default (the GPU); "cpu" on a CPU build
    side_channel_port: int = 5600
    prefill_port: int | None = None    # None: the recipe's port
    decode_port: int | None = None


@dataclass(frozen=True)
class SecretRef:
    name: str
    source: str = "env"                # "env": the node's environment; "file:PATH": read on the node


@dataclass(frozen=True)
class Recipe:
    key: str                           # the file's stem: what `sparkconsole recipe … NAME` takes
    name: str
    container: str
    command: str
    recipe_version: str = "1"
    description: str = ""
    model: str | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    mods: tuple[str, ...] = ()
    build_args: tuple[str, ...] = ()
    cluster_only: bool = False
    solo_only: bool = False
    topologies: tuple[str, ...] = ()
    topology_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    container_settings: ContainerSettings = field(default_factory=ContainerSettings)
    secrets: tuple[SecretRef, ...] = (SecretRef("HF_TOKEN"),)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    router: RouterSettings = field(default_factory=RouterSettings)
    disagg: DisaggSettings = field(default_factory=DisaggSettings)
    warnings: tuple[str, ...] = ()
    source: str = "<built-in>"
    command_line: int | None = None    # where `command:` sits, for placeholder errors

    def placeholders(self) -> list[str]:
        return placeholders_in(self.command)

    def params(self, topology: str | None = None, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """defaults < topology_defaults[topology] < overrides (None values in overrides are ignored)."""
        out = dict(self.defaults)
        if topology:
            out.update(self.topology_defaults.get(topology, {}))
        for k, v in (overrides or {}).items():
            if v is not None:
                out[k] = v
        return out

    def render_command(self, params: Mapping[str, Any]) -> str:
        return fill(self.command, params, self.source, self.command_line, "command")

    def error(self, problem: str, fix: str, field_: str | None = None) -> UserError:
        return UserError(problem, file=self.source, field=field_, fix=fix)


def placeholders_in(template: str) -> list[str]:
    out: list[str] = []
    try:
        for _, name, _, _ in string.Formatter().parse(template):
            if name is not None and name not in out:
                out.append(name)
    except ValueError:
        pass
    return out


def fill(template: str, params: Mapping[str, Any], file: str, line: int | None, field_: str) -> str:
    """str.format as run-recipe.py does, with one-line errors naming the placeholder."""
    try:
        names = [n for _, n, _, _ in string.Formatter().parse(template) if n is not None]
    except ValueError as exc:
        raise UserError(f"bad placeholder syntax ({exc})", file=file, line=line, field=field_,
                        fix="write {name} for a value and {{ }} for literal braces") from None
    for name in names:
        if not name or not _NAME_RE.match(name):
            raise UserError(f"bad placeholder {{{name}}}", file=file, line=line, field=field_,
                            fix="use {plain_name} placeholders; write {{ and }} for literal braces")
        if name not in params:
            raise UserError(f"placeholder {{{name}}} has no value", file=file, line=line, field=field_,
                            fix=f"add '{name}: VALUE' under defaults, or pass --set {name}=VALUE")
    # Format specs: a nested {field} or a huge width ({port:>999999999}) must not raise or fill memory.
    for _, fname, spec, _ in string.Formatter().parse(template):
        if fname is not None and spec and ("{" in spec or re.search(r"\d{4,}", spec)):
            raise UserError(f"placeholder {{{fname}}} has a format spec that cannot be filled ({spec[:20]!r})",
                            file=file, line=line, field=field_, fix=f"write {{{fname}}} without a format spec")
    try:
        return template.format(**{k: _fmt(v) for k, v in params.items()})
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise UserError(f"placeholder cannot be filled ({' '.join(str(exc).split())[:80]})", file=file, line=line,
                        field=field_, fix="write {name} placeholders without format specs or conversions") from None


def _fmt(v: Any) -> Any:
    # YAML true/false as vLLM expects them on a command line
    if isinstance(v, bool):
        return "true" if v else "false"
    return v


# --- loading -------------------------------------------------------------------------------------------------

class _Reader:
    """Typed field access over a Located document, every failure a one-line error with the line."""

    def __init__(self, doc: Located) -> None:
        self.doc = doc

    def err(self, path: Path_, problem: str, fix: str) -> UserError:
        return self.doc.error(path, problem, fix)

    def get(self, m: Mapping[str, Any], path: Path_, key: str, kind: type | tuple[type, ...], default: Any,
            fix: str) -> Any:
        if key not in m or m[key] is None:
            return default
        v = m[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if (isinstance(v, bool) and bool not in kinds) or not isinstance(v, kinds):
            raise self.err(path + (key,), f"expected {kinds[0].__name__}, got {type(v).__name__} {str(v)[:40]!r}", fix)
        return v

    def mapping(self, m: Mapping[str, Any], path: Path_, key: str, fix: str) -> dict[str, Any]:
        v: dict[str, Any] = self.get(m, path, key, dict, {}, fix)
        return v

    def str_list(self, m: Mapping[str, Any], path: Path_, key: str, fix: str) -> tuple[str, ...]:
        v = m.get(key)
        if v is None:
            return ()
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list):
            raise self.err(path + (key,), f"expected a list, got {type(v).__name__}", fix)
        out = []
        for i, item in enumerate(v):
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise self.err(path + (key, i), f"expected text, got {type(item).__name__}", fix)
            out.append(str(item))
        return tuple(out)

    def unknown(self, m: Mapping[str, Any], path: Path_, allowed: set[str]) -> None:
        for k in m:
            if k not in allowed:
                raise self.err(path + (k,), f"unknown key {str(k)[:40]!r}",
                               f"remove it, or use one of: {', '.join(sorted(allowed))}")

    def port(self, m: Mapping[str, Any], path: Path_, key: str, default: int | None) -> int | None:
        v: int | None = self.get(m, path, key, int, default, "write a port number 1-65535")
        if v is not None and not 1 <= v <= 65535:
            raise self.err(path + (key,), f"port {v} out of range", "write a port number 1-65535")
        return v


def parse_recipe(doc: Located, key: str | None = None) -> Recipe:
    from .. import secrets as _secrets  # serving engineer's module: names whose values are never shown

    r = _Reader(doc)
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "a recipe must be a mapping with name, container and command",
                        "start the file with 'recipe_version: \"1\"' then 'name: …'")
    warnings = list(doc.warnings)
    warnings += [f"{doc.file}:{doc.line((k,))}: unknown key {str(k)[:40]!r} (kept, not used)"
                 for k in data if k not in COMMUNITY_KEYS and k != SECTION]
    for req in ("name", "container", "command"):
        if data.get(req) in (None, ""):
            raise doc.error((req,) if req in data else (), f"missing required field {req!r}",
                            f"add '{req}: …' (spark-vllm-docker requires name, recipe_version, container, command)")
    version = data.get("recipe_version")
    if version is None:
        warnings.append(f"{doc.file}: no recipe_version (run-recipe.sh requires it); assuming \"1\"")
        version = "1"
    version = str(version)
    if version not in SUPPORTED_VERSIONS:
        raise doc.error(("recipe_version",), f"recipe_version {version[:10]!r} is not supported",
                        'write recipe_version: "1"')
    name = r.get(data, (), "name", str, None, "write a short human-readable name")
    container = r.get(data, (), "container", str, None, "write the Docker image, e.g. vllm-node")
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_./:@-]{0,255}$", container):
        raise doc.error(("container",), f"bad image name {container[:60]!r}", "write an image reference like vllm-node:tag")
    command = r.get(data, (), "command", str, None, "write the vllm serve command as a block (command: |)")
    warnings += command_warnings(command, doc.file, doc.line(("command",)))
    description = r.get(data, (), "description", str, "", "write one line of text")
    model = r.get(data, (), "model", str, None, "write the Hugging Face model id, e.g. openai/gpt-oss-120b")
    defaults = r.mapping(data, (), "defaults", "write 'defaults:' with one 'name: value' per line")
    for k, v in defaults.items():
        if not _NAME_RE.match(str(k)):
            raise doc.error(("defaults", k), f"bad placeholder name {str(k)[:40]!r}", "use letters, digits and _")
        if isinstance(v, (dict, list)):
            raise doc.error(("defaults", k), "a default must be a single value", "write a number or a text value")
    if data.get("env") == []:
        # The runner exports env only `if env_vars:`, so an empty list passes there: read it as no variables.
        warnings.append(f"{doc.file}:{doc.line(('env',))}: env is an empty list; read as no variables, as the "
                        "runner does — fix: write 'env: {}'")
        data = {**data, "env": {}}
    env_raw = r.mapping(data, (), "env", "write 'env:' with one 'NAME: value' per line")
    env: dict[str, str] = {}
    for k, v in env_raw.items():
        if not _ENV_RE.match(str(k)):
            raise doc.error(("env", k), f"bad variable name {str(k)[:40]!r}", "use letters, digits and _")
        if isinstance(v, (dict, list)):
            raise doc.error(("env", k), "an environment value must be a single value", "write a number or text")
        if _secrets.is_secret_name(str(k)) and v not in (None, ""):
            # The value is never echoed, not even here.
            raise doc.error(("env", k), f"{k} has a value written in the recipe; secrets are passed by reference",
                            f"delete the value and list it under 'sparkconsole: secrets: {{{k}: env}}' "
                            "so it is read from the node's environment")
        env[str(k)] = "" if v is None else (("1" if v else "0") if isinstance(v, bool) else str(v))
    cluster_only = r.get(data, (), "cluster_only", bool, False, "write true or false")
    solo_only = r.get(data, (), "solo_only", bool, False, "write true or false")
    if cluster_only and solo_only:
        raise doc.error(("solo_only",), "cluster_only and solo_only are both true", "keep one of them")

    sc = r.mapping(data, (), SECTION, "write 'sparkconsole:' as a mapping")
    p = (SECTION,)
    r.unknown(sc, p, {"topologies", "topology_defaults", "container", "secrets", "cluster", "router", "disagg"})
    if "topologies" in sc:
        topologies = r.str_list(sc, p, "topologies", f"list some of: {', '.join(TOPOLOGIES)}")
        for i, t in enumerate(topologies):
            if t not in TOPOLOGIES:
                raise doc.error(p + ("topologies", i), f"unknown topology {t[:30]!r}", f"use one of: {', '.join(TOPOLOGIES)}")
    elif cluster_only:
        topologies = ("cluster-tp2",)
    elif solo_only:
        topologies = ("solo", "2x-solo")
    else:
        topologies = ("solo", "cluster-tp2", "2x-solo")
    if cluster_only and any(t in ("solo", "2x-solo") for t in topologies):
        raise doc.error(p + ("topologies",), "cluster_only recipe lists a single-node topology",
                        "remove solo and 2x-solo, or set cluster_only: false")
    if solo_only and "cluster-tp2" in topologies:
        raise doc.error(p + ("topologies",), "solo_only recipe lists cluster-tp2",
                        "remove cluster-tp2, or set solo_only: false")

    tdefs_raw = r.mapping(sc, p, "topology_defaults", "write 'topology_defaults: {cluster-tp2: {tensor_parallel: 2}}'")
    tdefs: dict[str, dict[str, Any]] = {}
    for t, vals in tdefs_raw.items():
        if t not in TOPOLOGIES:
            raise doc.error(p + ("topology_defaults", t), f"unknown topology {str(t)[:30]!r}", f"use one of: {', '.join(TOPOLOGIES)}")
        if not isinstance(vals, dict):
            raise doc.error(p + ("topology_defaults", t), "expected a mapping of placeholder values", "write '{name: value}'")
        for k, v in vals.items():
            if not _NAME_RE.match(str(k)) or isinstance(v, (dict, list)):
                raise doc.error(p + ("topology_defaults", t, k), "bad placeholder value", "write 'name: value'")
        tdefs[t] = dict(vals)

    cs = r.mapping(sc, p, "container", "write 'container: {memory: 100g, shm_size: 64g}'")
    cp = p + ("container",)
    r.unknown(cs, cp, {"name", "memory", "shm_size", "gpus", "ipc_host", "init", "volumes", "tmpfs", "privileged",
                       "nofile", "pids_limit", "rdma", "cache_dirs"})
    dflt = ContainerSettings()

    def size(k: str, default: str | None) -> str | None:
        if k in cs and cs[k] is None:
            return None
        v = r.get(cs, cp, k, (str, int), default, "write a size like 100g")
        if v is not None and not _SIZE_RE.match(str(v)):
            raise doc.error(cp + (k,), f"bad size {str(v)[:20]!r}", "write a size like 100g or 512m")
        return None if v is None else str(v)

    cname = r.get(cs, cp, "name", str, None, "write a container name")
    if cname is not None and not _CONTAINER_RE.match(cname):
        raise doc.error(cp + ("name",), f"bad container name {cname[:40]!r}", "use letters, digits, '_', '.', '-'")
    gpus = cs.get("gpus", dflt.gpus) if "gpus" in cs else dflt.gpus
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, (str, int))):
        raise doc.error(cp + ("gpus",), "gpus must be 'all', a count, or null", "write gpus: all")
    container_settings = ContainerSettings(
        name=cname, memory=size("memory", dflt.memory), shm_size=size("shm_size", dflt.shm_size),
        gpus=None if gpus in (None, "none") else str(gpus),
        ipc_host=r.get(cs, cp, "ipc_host", bool, dflt.ipc_host, "write true or false"),
        init=r.get(cs, cp, "init", bool, dflt.init, "write true or false"),
        volumes=r.str_list(cs, cp, "volumes", "write a list of HOST:CONTAINER[:ro]"),
        tmpfs=r.str_list(cs, cp, "tmpfs", "write a list of container paths"),
        privileged=r.get(cs, cp, "privileged", bool, dflt.privileged, "write true or false"),
        nofile=_positive(r, cs, cp, "nofile", dflt.nofile),
        pids_limit=_positive(r, cs, cp, "pids_limit", dflt.pids_limit) or dflt.pids_limit,
        rdma=r.get(cs, cp, "rdma", bool, dflt.rdma, "write true or false"),
        cache_dirs=r.get(cs, cp, "cache_dirs", bool, dflt.cache_dirs, "write true or false"))

    secrets_raw = sc.get("secrets")
    secret_refs: list[SecretRef] = []
    if secrets_raw is None:
        secret_refs = [SecretRef("HF_TOKEN")]
    elif isinstance(secrets_raw, list):
        for i, n in enumerate(secrets_raw):
            if not isinstance(n, str) or not _ENV_RE.match(n):
                raise doc.error(p + ("secrets", i), "bad variable name", "write a variable name like HF_TOKEN")
            secret_refs.append(SecretRef(n))
    elif isinstance(secrets_raw, dict):
        for n, src in secrets_raw.items():
            if not _ENV_RE.match(str(n)):
                raise doc.error(p + ("secrets", n), "bad variable name", "write a variable name like HF_TOKEN")
            src = "env" if src is None else src
            if not isinstance(src, str) or not (src == "env" or (src.startswith("file:") and len(src) > 5)):
                raise doc.error(p + ("secrets", n), "a secret's source is 'env' or 'file:PATH'",
                                f"write '{n}: env' (the node's environment) or '{n}: file:/path/on/node'")
            secret_refs.append(SecretRef(str(n), src))
    else:
        raise doc.error(p + ("secrets",), "secrets must be a list or a mapping", "write 'secrets: {HF_TOKEN: env}'")
    for s in secret_refs:
        if s.name in env:
            raise doc.error(("env", s.name), f"{s.name} is both in env and in secrets", "remove it from env")

    cl = r.mapping(sc, p, "cluster", "write 'cluster: {backend: mp, master_port: 29501}'")
    clp = p + ("cluster",)
    r.unknown(cl, clp, {"backend", "master_port", "eth_if", "ib_if", "ray"})
    backend = r.get(cl, clp, "backend", str, "mp", "write mp or ray")
    if backend not in ("mp", "ray"):
        raise doc.error(clp + ("backend",), f"unknown backend {backend[:20]!r}", "write mp (vLLM's own multi-node) or ray")
    cluster = ClusterSettings(backend=backend, master_port=r.port(cl, clp, "master_port", 29501) or 29501,
                              eth_if=_iface(r, cl, clp, "eth_if"), ib_if=_iface(r, cl, clp, "ib_if"),
                              ray=tuple(r.str_list(cl, clp, "ray", "write the Ray command as a list, e.g. [ray]")
                                        or ClusterSettings.ray))

    rt = r.mapping(sc, p, "router", "write 'router: {default: vllm-router, port: 4000}'")
    rp = p + ("router",)
    r.unknown(rt, rp, {"default", "port", "vllm_router", "litellm"})
    rdef = RouterSettings()
    default_router = r.get(rt, rp, "default", str, rdef.default, "write vllm-router, simple-shuffle or least-busy")
    if default_router not in ROUTER_CHOICES:
        raise doc.error(rp + ("default",), f"unknown router {default_router[:30]!r}", f"use one of: {', '.join(ROUTER_CHOICES)}")
    router = RouterSettings(default=default_router, port=r.port(rt, rp, "port", rdef.port) or rdef.port,
                            vllm_router=_router_impl(r, rt, rp, "vllm_router", rdef.vllm_router),
                            litellm=_router_impl(r, rt, rp, "litellm", rdef.litellm))

    dg = r.mapping(sc, p, "disagg", "write 'disagg: {connector: NixlConnector}'")
    dp = p + ("disagg",)
    r.unknown(dg, dp, {"connector", "kv_buffer_device", "side_channel_port", "prefill_port", "decode_port"})
    kv_device = r.get(dg, dp, "kv_buffer_device", str, None, "write cuda or cpu")
    if kv_device not in (None, "cuda", "cpu"):
        raise doc.error(dp + ("kv_buffer_device",), f"unknown KV buffer device {kv_device[:20]!r}", "write cuda or cpu")
    disagg = DisaggSettings(connector=r.get(dg, dp, "connector", str, "NixlConnector", "write NixlConnector"),
                            kv_buffer_device=kv_device,
                            side_channel_port=r.port(dg, dp, "side_channel_port", 5600) or 5600,
                            prefill_port=r.port(dg, dp, "prefill_port", None),
                            decode_port=r.port(dg, dp, "decode_port", None))

    return Recipe(
        key=key or Path(doc.file).stem, name=name, container=container, command=command, recipe_version=version,
        description=description, model=model, defaults=defaults, env=env,
        mods=r.str_list(data, (), "mods", "write a list of mod directories"),
        build_args=r.str_list(data, (), "build_args", "write a list of build-and-copy.sh flags"),
        cluster_only=cluster_only, solo_only=solo_only, topologies=tuple(topologies), topology_defaults=tdefs,
        container_settings=container_settings, secrets=tuple(secret_refs), cluster=cluster, router=router,
        disagg=disagg, warnings=tuple(warnings), source=doc.file, command_line=doc.line(("command",)))


ROUTER_CHOICES = ("vllm-router", "simple-shuffle", "least-busy")


def _positive(r: _Reader, m: Mapping[str, Any], path: Path_, key: str, default: int | None) -> int | None:
    if key in m and m[key] is None:
        return None
    v: int | None = r.get(m, path, key, int, default, f"write a whole number, e.g. {key}: {default}")
    if v is not None and (isinstance(v, bool) or v < 1):
        raise r.err(path + (key,), f"{key} must be a whole number ≥ 1", f"write e.g. {key}: {default}")
    return v


def _iface(r: _Reader, m: Mapping[str, Any], path: Path_, key: str) -> str | None:
    v: str | None = r.get(m, path, key, str, None, "write an interface name like enp1s0f0np0")
    if v is not None and not re.match(r"^[A-Za-z0-9_.:,-]{1,64}$", v):
        raise r.err(path + (key,), f"bad interface name {v[:30]!r}", "write an interface name like enp1s0f0np0")
    return v


def _router_impl(r: _Reader, m: Mapping[str, Any], path: Path_, key: str, dflt: RouterImpl) -> RouterImpl:
    v = r.mapping(m, path, key, f"write '{key}: {{image: …, version: …}}'")
    p = path + (key,)
    r.unknown(v, p, {"image", "version", "policy", "strategy", "command", "volumes"})
    version = v.get("version", dflt.version)
    if version is not None and not isinstance(version, (str, int, float)):
        raise r.err(p + ("version",), "version must be text", 'write version: "1.106.2"')
    policy = v.get("policy", v.get("strategy", dflt.policy))
    if policy is not None and not isinstance(policy, str):
        raise r.err(p + ("policy",), "policy must be text", "write a policy name")
    return RouterImpl(image=r.get(v, p, "image", str, dflt.image, "write the router's image"),
                      version=None if version is None else str(version), policy=policy,
                      command=r.str_list(v, p, "command", "write the executable as a list") or dflt.command,
                      volumes=r.str_list(v, p, "volumes", "write a list of HOST:CONTAINER[:ro]"))


def load_recipe(path: str | Path) -> Recipe:
    # duplicates="last": a repeated key is read as the runner's PyYAML safe_load reads it, with a warning.
    return parse_recipe(load_file(path, duplicates="last"), Path(path).stem)


# --- where recipes live ----------------------------------------------------------------------------------------

def bundled_dir() -> Path:
    return Path(__file__).with_name("recipes")


def user_dirs() -> list[Path]:
    xdg = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    return [Path.cwd() / "recipes", xdg / "sparkconsole" / "recipes"]


def _yaml_files(d: Path) -> list[Path]:
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def bundled_recipes() -> list[Recipe]:
    return [load_recipe(p) for p in _yaml_files(bundled_dir())]


def recipe_paths() -> dict[str, Path]:
    """Recipe key → file; ./recipes/ wins over ~/.config/sparkconsole/recipes/, which wins over the bundled."""
    found: dict[str, Path] = {}
    for d in [*user_dirs(), bundled_dir()]:
        for p in _yaml_files(d):
            found.setdefault(p.stem, p)
    return found


def recipe_path(name_or_path: str) -> Path:
    """The file a recipe argument names: a path to a YAML file, or a key from ./recipes,
    ~/.config/sparkconsole/recipes or the bundle (in that order)."""
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        return p
    paths = recipe_paths()
    if name_or_path in paths:
        return paths[name_or_path]
    known = ", ".join(sorted(paths)) or "(none)"
    raise UserError(f"no recipe named {name_or_path[:60]!r}", field="recipe",
                    fix=f"use one of: {known}, or give a path to a .yaml file")


def find_recipe(name_or_path: str) -> Recipe:
    """A path to a YAML file, or a recipe key from ./recipes, ~/.config/sparkconsole/recipes or the bundle."""
    return load_recipe(recipe_path(name_or_path))


