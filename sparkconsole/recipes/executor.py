"""A v2 recipe's `executor_config:` (the docker options sparkrun passes through) as sparkconsole's container settings.

Each option becomes part of the one container spec (launch/container.py), so it shows in the plan's `docker run`
and preflight judges it like our own (launch/lint_container.py): shm_size, privileged, cap_add, devices, volumes,
ulimit, security_opt, user, entrypoint, memory_limit (the container's memory cap), gpus, ipc. What sparkconsole
deliberately does otherwise is a warning naming the option: auto_remove (no --rm: a dead server's log stays
readable), restart_policy (launch health watches the server instead), network (always the host's), labels.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..yamlsrc import Path_
from .fields import Fields
from .model import ContainerSettings

P: Path_ = ("executor_config",)
# docker's own size syntax (go-units RAMInBytes): 64g, 10gb, 512MiB, 1.5G
_DOCKER_SIZE = re.compile(r"^\d+(\.\d+)?\s?[kKmMgGtTpP]?[iI]?[bB]?$")
_ULIMIT = re.compile(r"^[a-z]+=-?\d+(:-?\d+)?$")
_CAP = re.compile(r"^[A-Za-z_]{2,40}$")
_USER = re.compile(r"^[A-Za-z0-9_.-]{1,32}(:[A-Za-z0-9_.-]{1,32})?$")
KNOWN = {"shm_size", "privileged", "cap_add", "devices", "volumes", "ulimit", "security_opt", "user", "entrypoint",
         "memory_limit", "gpus", "ipc", "auto_remove", "restart_policy", "network", "labels", "executor",
         "executor_type", "accelerator_vendor"}
IGNORED = {"auto_remove": "sparkconsole never passes --rm, so a dead server's log can still be read",
           "restart_policy": "launch health watches the server; docker does not restart it",
           "labels": "sparkconsole labels its containers itself (launch/steps.py)",
           "accelerator_vendor": "a DGX Spark is NVIDIA's"}


def _size(r: Fields, ec: Mapping[str, Any], key: str) -> str | None:
    v = ec.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (str, int)) or not _DOCKER_SIZE.match(str(v).strip()):
        raise r.err(P + (key,), f"bad size {str(v)[:20]!r}", "write a size like 64g or 10gb")
    return str(v).strip().replace(" ", "")


def _list(r: Fields, ec: Mapping[str, Any], key: str, pattern: re.Pattern[str] | None, fix: str) -> tuple[str, ...]:
    items = r.str_list(ec, P, key, fix)
    for i, item in enumerate(items):
        if pattern is not None and not pattern.match(item):
            raise r.err(P + (key, i), f"bad {key} entry {item[:40]!r}", fix)
        if any(c in item for c in "\n\r\x00"):
            raise r.err(P + (key, i), f"a {key} entry holds a line break", fix)
    return items


def _volumes(r: Fields, ec: Mapping[str, Any]) -> tuple[str, ...]:
    v = ec.get("volumes")
    if isinstance(v, dict):          # {HOST: CONTAINER[:ro]}
        return tuple(f"{h}:{c}" for h, c in v.items())
    return _list(r, ec, "volumes", re.compile(r"^[^:\s]+:[^:\s]+(:(ro|rw|z|Z))?$"), "write HOST:CONTAINER[:ro]")


def read_executor(r: Fields, data: Mapping[str, Any], cs: ContainerSettings,
                  warnings: list[str]) -> ContainerSettings:
    ec = r.mapping(data, (), "executor_config", "write executor_config: {shm_size: 64g, cap_add: [IPC_LOCK]}")
    if not ec:
        return cs
    doc = r.doc
    for k in ec:
        if k not in KNOWN:
            warnings.append(f"{doc.file}:{doc.line(P + (k,))}: executor_config.{str(k)[:30]} is not a docker option "
                            "sparkconsole knows (kept, not used)")
        elif k in IGNORED:
            warnings.append(f"{doc.file}:{doc.line(P + (k,))}: executor_config.{k} not used: {IGNORED[k]}")
    network = ec.get("network")
    if network not in (None, "host"):
        raise r.err(P + ("network",), f"network {str(network)[:20]!r}: sparkconsole's servers use the host's network",
                    "remove executor_config.network, or write network: host")
    ipc = ec.get("ipc")
    if ipc not in (None, "host", "private", "shareable"):
        raise r.err(P + ("ipc",), f"ipc {str(ipc)[:20]!r} is not a docker IPC mode", "write ipc: host")
    entrypoint = r.get(ec, P, "entrypoint", str, None, "write the entrypoint, or \"\" to clear the image's")
    user = r.get(ec, P, "user", str, None, "write a user name or UID[:GID]")
    if user is not None and not _USER.match(user):
        raise r.err(P + ("user",), f"user {user[:30]!r} is not a user name or UID[:GID]",
                    "write e.g. user: root (sparkrun's $SHELL_USER is not expanded here)")
    gpus = ec.get("gpus")
    shm = _size(r, ec, "shm_size")
    memory = _size(r, ec, "memory_limit")
    return replace(
        cs,
        shm_size=shm or cs.shm_size,
        memory=memory or cs.memory,
        privileged=r.get(ec, P, "privileged", bool, cs.privileged, "write true or false"),
        ipc_host=cs.ipc_host if ipc is None else ipc == "host",
        gpus=cs.gpus if gpus is None else (None if gpus in ("none", False) else str(gpus)),
        cap_add=_list(r, ec, "cap_add", _CAP, "write capability names, e.g. [IPC_LOCK]"),
        devices=_list(r, ec, "devices", re.compile(r"^/dev/[^\s]+$"), "write device paths, e.g. /dev/infiniband"),
        security_opt=_list(r, ec, "security_opt", re.compile(r"^[a-z-]+([=:][^\s]+)?$"),
                           "write docker security options, e.g. no-new-privileges"),
        ulimits=_list(r, ec, "ulimit", _ULIMIT, "write NAME=SOFT[:HARD], e.g. memlock=-1:-1"),
        volumes=(*cs.volumes, *_volumes(r, ec)),
        user=user, entrypoint=entrypoint)
