"""Preflight's judgement of the docker options a recipe asks for (a v2 recipe's executor_config, our own
`sparkconsole.container`), each as the plan's `docker run` will pass it.

- the Docker socket mounted: the container would command the node's Docker as root; refused;
- the node's root or /etc mounted, a capability that is all of root's (ALL, SYS_ADMIN), seccomp or AppArmor
  switched off: warned, naming the option;
- a shared-memory size above the container's memory cap: shm is the node's RAM, outside the cap's reach on a
  unified-memory node; warned with the fix;
- a user other than root: the node's caches are mounted as root's, and vLLM writes into them; warned;
- an entrypoint of the image's own: the server's command becomes its arguments; warned;
- a cluster launch without --privileged and without /dev/infiniband: NCCL cannot use the ConnectX-7 link's RDMA;
  warned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import lint_memory
from .findings import Facts, Finding

if TYPE_CHECKING:
    from ..config import NodeConfig
    from ..recipes import Recipe
    from .steps import Plan

SRC_SOCKET = "Docker's own docs: access to the Docker socket is root on the host"
SRC_CAPS = "docker run reference: SYS_ADMIN / ALL grant what --privileged grants; seccomp and AppArmor confine it"
SRC_SHM = ("a GB10's shared memory is the node's unified RAM (leptonai/gpud#1170); the container's memory cap does not "
           "bound it")
SRC_RDMA = "eugr/spark-vllm-docker launch-cluster.sh: --privileged, or IPC_LOCK and /dev/infiniband, for NCCL over RDMA"


def _finding(rule: str, severity: str, message: str, source: str, fix: str) -> Finding:
    return Finding(rule, severity, message, source, fix)


def container_options(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    cs = recipe.container_settings
    out: list[Finding] = []
    for v in cs.volumes:
        host = v.split(":", 1)[0].rstrip("/") or "/"
        if host.endswith("docker.sock"):
            out.append(_finding("container_options", "refuse", f"volume {v} mounts the node's Docker socket",
                                SRC_SOCKET, "remove the volume"))
        elif host in ("/", "/etc", "/root", "/var/run", "/run"):
            out.append(_finding("container_options", "warn", f"volume {v} mounts the node's {host} into the container",
                                SRC_CAPS, "mount only the folder the server needs"))
    for cap in cs.cap_add:
        if cap.upper() in ("ALL", "SYS_ADMIN", "CAP_SYS_ADMIN", "SYS_MODULE", "CAP_SYS_MODULE"):
            out.append(_finding("container_options", "warn", f"cap_add {cap}: the container may act as root on the "
                                "node", SRC_CAPS, f"remove {cap} unless the recipe's author says why it needs it"))
    for opt in cs.security_opt:
        if opt.replace(":", "=") in ("seccomp=unconfined", "apparmor=unconfined", "label=disable"):
            out.append(_finding("container_options", "warn", f"security_opt {opt} switches a confinement off",
                                SRC_CAPS, "remove it unless the image needs it"))
    shm, cap_gib = lint_memory.size_gib(cs.shm_size), lint_memory.size_gib(cs.memory)
    if shm is not None and cap_gib is not None and shm > cap_gib and not (cs.ipc_host and cs.privileged):
        out.append(_finding("container_options", "warn", f"shm_size {cs.shm_size} is above the container's memory "
                            f"cap {cs.memory}: shared memory is the node's RAM and the cap does not bound it", SRC_SHM,
                            f"use shm_size {cs.memory} or less"))
    if cs.user not in (None, "root", "0", "0:0"):
        out.append(_finding("container_options", "warn", f"user {cs.user}: the node's model and compile caches are "
                            "mounted as root's, and the server writes into them", SRC_CAPS,
                            "run as root (user: root), or make the node's caches writable by that user"))
    if cs.entrypoint:
        out.append(_finding("container_options", "warn", f"entrypoint {cs.entrypoint!r}: the server's command is "
                            "passed to it as arguments", SRC_CAPS, "write entrypoint: \"\" (the runner's way)"))
    if plan.topology == "cluster-tp2" and not cs.privileged and not any("infiniband" in d for d in cs.devices) \
            and not cs.rdma:
        out.append(_finding("container_options", "warn", "a cluster launch without --privileged and without "
                            "/dev/infiniband: NCCL falls back to TCP over the link", SRC_RDMA,
                            "add devices: [/dev/infiniband] and cap_add: [IPC_LOCK], or privileged: true"))
    return out
