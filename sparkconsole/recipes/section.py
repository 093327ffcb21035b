"""sparkconsole's own section of a recipe (any version), all keys optional:

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

Unknown keys inside `sparkconsole:` are errors. Every stage below reads one key of the section.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..yamlsrc import Path_
from .fields import CONTAINER_RE, ENV_RE, NAME_RE, Fields
from .model import (
    ROUTER_CHOICES,
    TOPOLOGIES,
    ClusterSettings,
    ContainerSettings,
    DisaggSettings,
    RouterImpl,
    RouterSettings,
    SecretRef,
)

SECTION = "sparkconsole"
P: Path_ = (SECTION,)
CONTAINER_KEYS = {"name", "memory", "shm_size", "gpus", "ipc_host", "init", "volumes", "tmpfs", "privileged",
                  "nofile", "pids_limit", "rdma", "cache_dirs"}


@dataclass(frozen=True)
class Section:
    topologies: tuple[str, ...]
    topology_defaults: Mapping[str, Mapping[str, Any]]
    container: ContainerSettings
    secrets: tuple[SecretRef, ...]
    cluster: ClusterSettings
    router: RouterSettings
    disagg: DisaggSettings


def read_section(r: Fields, data: Mapping[str, Any], *, cluster_only: bool, solo_only: bool,
                 env: Mapping[str, str], default_topologies: tuple[str, ...] | None = None) -> Section:
    sc = r.mapping(data, (), SECTION, "write 'sparkconsole:' as a mapping")
    r.unknown(sc, P, {"topologies", "topology_defaults", "container", "secrets", "cluster", "router", "disagg"})
    topologies = read_topologies(r, sc, cluster_only, solo_only, default_topologies)
    topology_defaults = read_topology_defaults(r, sc)
    container = read_container(r, sc)
    secrets = read_secrets(r, sc)
    for s in secrets:
        if s.name in env:
            raise r.err(("env", s.name), f"{s.name} is both in env and in secrets", "remove it from env")
    return Section(topologies=topologies, topology_defaults=topology_defaults, container=container, secrets=secrets,
                   cluster=read_cluster(r, sc), router=read_router(r, sc), disagg=read_disagg(r, sc))


def read_topologies(r: Fields, sc: Mapping[str, Any], cluster_only: bool, solo_only: bool,
                    default: tuple[str, ...] | None) -> tuple[str, ...]:
    if "topologies" in sc:
        topologies = r.str_list(sc, P, "topologies", f"list some of: {', '.join(TOPOLOGIES)}")
        for i, t in enumerate(topologies):
            if t not in TOPOLOGIES:
                raise r.err(P + ("topologies", i), f"unknown topology {t[:30]!r}", f"use one of: {', '.join(TOPOLOGIES)}")
    elif default is not None:
        topologies = default
    elif cluster_only:
        topologies = ("cluster-tp2",)
    elif solo_only:
        topologies = ("solo", "2x-solo")
    else:
        topologies = ("solo", "cluster-tp2", "2x-solo")
    if cluster_only and any(t in ("solo", "2x-solo") for t in topologies):
        raise r.err(P + ("topologies",), "cluster_only recipe lists a single-node topology",
                    "remove solo and 2x-solo, or set cluster_only: false")
    if solo_only and "cluster-tp2" in topologies:
        raise r.err(P + ("topologies",), "solo_only recipe lists cluster-tp2", "remove cluster-tp2, or set solo_only: false")
    return tuple(topologies)


def read_topology_defaults(r: Fields, sc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    raw = r.mapping(sc, P, "topology_defaults", "write 'topology_defaults: {cluster-tp2: {tensor_parallel: 2}}'")
    out: dict[str, dict[str, Any]] = {}
    for t, vals in raw.items():
        if t not in TOPOLOGIES:
            raise r.err(P + ("topology_defaults", t), f"unknown topology {str(t)[:30]!r}", f"use one of: {', '.join(TOPOLOGIES)}")
        if not isinstance(vals, dict):
            raise r.err(P + ("topology_defaults", t), "expected a mapping of placeholder values", "write '{name: value}'")
        for k, v in vals.items():
            if not NAME_RE.match(str(k)) or isinstance(v, (dict, list)):
                raise r.err(P + ("topology_defaults", t, k), "bad placeholder value", "write 'name: value'")
        out[t] = dict(vals)
    return out


def read_container(r: Fields, sc: Mapping[str, Any]) -> ContainerSettings:
    cs = r.mapping(sc, P, "container", "write 'container: {memory: 100g, shm_size: 64g}'")
    cp = P + ("container",)
    r.unknown(cs, cp, CONTAINER_KEYS)
    dflt = ContainerSettings()
    cname = r.get(cs, cp, "name", str, None, "write a container name")
    if cname is not None and not CONTAINER_RE.match(cname):
        raise r.err(cp + ("name",), f"bad container name {cname[:40]!r}", "use letters, digits, '_', '.', '-'")
    gpus = cs.get("gpus", dflt.gpus) if "gpus" in cs else dflt.gpus
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, (str, int))):
        raise r.err(cp + ("gpus",), "gpus must be 'all', a count, or null", "write gpus: all")
    return ContainerSettings(
        name=cname, memory=r.size(cs, cp, "memory", dflt.memory), shm_size=r.size(cs, cp, "shm_size", dflt.shm_size),
        gpus=None if gpus in (None, "none") else str(gpus),
        ipc_host=r.get(cs, cp, "ipc_host", bool, dflt.ipc_host, "write true or false"),
        init=r.get(cs, cp, "init", bool, dflt.init, "write true or false"),
        volumes=r.str_list(cs, cp, "volumes", "write a list of HOST:CONTAINER[:ro]"),
        tmpfs=r.str_list(cs, cp, "tmpfs", "write a list of container paths"),
        privileged=r.get(cs, cp, "privileged", bool, dflt.privileged, "write true or false"),
        nofile=r.positive(cs, cp, "nofile", dflt.nofile),
        pids_limit=r.positive(cs, cp, "pids_limit", dflt.pids_limit) or dflt.pids_limit,
        rdma=r.get(cs, cp, "rdma", bool, dflt.rdma, "write true or false"),
        cache_dirs=r.get(cs, cp, "cache_dirs", bool, dflt.cache_dirs, "write true or false"))


def read_secrets(r: Fields, sc: Mapping[str, Any]) -> tuple[SecretRef, ...]:
    raw = sc.get("secrets")
    refs: list[SecretRef] = []
    if raw is None:
        return (SecretRef("HF_TOKEN"),)
    if isinstance(raw, list):
        for i, n in enumerate(raw):
            if not isinstance(n, str) or not ENV_RE.match(n):
                raise r.err(P + ("secrets", i), "bad variable name", "write a variable name like HF_TOKEN")
            refs.append(SecretRef(n))
    elif isinstance(raw, dict):
        for n, src in raw.items():
            if not ENV_RE.match(str(n)):
                raise r.err(P + ("secrets", n), "bad variable name", "write a variable name like HF_TOKEN")
            src = "env" if src is None else src
            if not isinstance(src, str) or not (src == "env" or (src.startswith("file:") and len(src) > 5)):
                raise r.err(P + ("secrets", n), "a secret's source is 'env' or 'file:PATH'",
                            f"write '{n}: env' (the node's environment) or '{n}: file:/path/on/node'")
            refs.append(SecretRef(str(n), src))
    else:
        raise r.err(P + ("secrets",), "secrets must be a list or a mapping", "write 'secrets: {HF_TOKEN: env}'")
    return tuple(refs)


def read_cluster(r: Fields, sc: Mapping[str, Any]) -> ClusterSettings:
    cl = r.mapping(sc, P, "cluster", "write 'cluster: {backend: mp, master_port: 29501}'")
    clp = P + ("cluster",)
    r.unknown(cl, clp, {"backend", "master_port", "eth_if", "ib_if", "ray"})
    backend = r.get(cl, clp, "backend", str, "mp", "write mp or ray")
    if backend not in ("mp", "ray"):
        raise r.err(clp + ("backend",), f"unknown backend {backend[:20]!r}", "write mp (vLLM's own multi-node) or ray")
    return ClusterSettings(backend=backend, master_port=r.port(cl, clp, "master_port", 29501) or 29501,
                           eth_if=r.iface(cl, clp, "eth_if"), ib_if=r.iface(cl, clp, "ib_if"),
                           ray=tuple(r.str_list(cl, clp, "ray", "write the Ray command as a list, e.g. [ray]")
                                     or ClusterSettings.ray))


def read_router(r: Fields, sc: Mapping[str, Any]) -> RouterSettings:
    rt = r.mapping(sc, P, "router", "write 'router: {default: vllm-router, port: 4000}'")
    rp = P + ("router",)
    r.unknown(rt, rp, {"default", "port", "vllm_router", "litellm"})
    rdef = RouterSettings()
    default_router = r.get(rt, rp, "default", str, rdef.default, "write vllm-router, simple-shuffle or least-busy")
    if default_router not in ROUTER_CHOICES:
        raise r.err(rp + ("default",), f"unknown router {default_router[:30]!r}", f"use one of: {', '.join(ROUTER_CHOICES)}")
    return RouterSettings(default=default_router, port=r.port(rt, rp, "port", rdef.port) or rdef.port,
                          vllm_router=_router_impl(r, rt, rp, "vllm_router", rdef.vllm_router),
                          litellm=_router_impl(r, rt, rp, "litellm", rdef.litellm))


def _router_impl(r: Fields, m: Mapping[str, Any], path: Path_, key: str, dflt: RouterImpl) -> RouterImpl:
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


def read_disagg(r: Fields, sc: Mapping[str, Any]) -> DisaggSettings:
    dg = r.mapping(sc, P, "disagg", "write 'disagg: {connector: NixlConnector}'")
    dp = P + ("disagg",)
    r.unknown(dg, dp, {"connector", "kv_buffer_device", "side_channel_port", "prefill_port", "decode_port"})
    kv_device = r.get(dg, dp, "kv_buffer_device", str, None, "write cuda or cpu")
    if kv_device not in (None, "cuda", "cpu"):
        raise r.err(dp + ("kv_buffer_device",), f"unknown KV buffer device {kv_device[:20]!r}", "write cuda or cpu")
    return DisaggSettings(connector=r.get(dg, dp, "connector", str, "NixlConnector", "write NixlConnector"),
                          kv_buffer_device=kv_device,
                          side_channel_port=r.port(dg, dp, "side_channel_port", 5600) or 5600,
                          prefill_port=r.port(dg, dp, "prefill_port", None),
                          decode_port=r.port(dg, dp, "decode_port", None))
