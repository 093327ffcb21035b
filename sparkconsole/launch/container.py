"""The container every vLLM server of a plan runs in, whatever the topology: as spark-vllm-docker's
launch-cluster.sh starts it, plus sparkconsole's deliberate differences (docs/RECIPES_PARITY.md, "The container").

As the runner:
- privileged (the ConnectX-7's RDMA devices for NCCL) with `--ipc=host`, or with `--non-privileged` the runner's
  narrower set: `--cap-add IPC_LOCK --device /dev/infiniband`, a shm size and a pids limit;
- `--ulimit nofile=N:N` (1048576) and `-e NCCL_IGNORE_CPU_AFFINITY=1`;
- the node's Hugging Face cache (`${HF_HOME:-$HOME/.cache/huggingface}`, where `model pull` writes and preflight
  looks) at /root/.cache/huggingface, and the compile caches (vLLM, FlashInfer, Triton, TileLang, B12X) unless
  `--no-cache-dirs`, each made first on the node;
- mods copied in and run before vLLM starts (launch/mods.py), without the recipe's own env, then a v2 recipe's
  pre_exec commands (and copies);
- a v2 recipe's executor_config (recipes/executor.py): its capabilities, devices, security options, ulimits,
  user and entrypoint; its HF cache where sparkrun mounts it (/cache/huggingface, HF_HOME set there).
Deliberately different: a memory cap always (`--memory` = `--memory-swap`), so a runaway of the container's CPU side
is an OOM-kill of the container and not a frozen Spark — the cap does not hold GPU memory, which a GB10 does not
charge to the container's cgroup (docs/RECIPES_PARITY.md, memory-cap); no `--rm`, so a dead server's log can still
be read; no `--restart` policy (docs/RECIPES_PARITY.md: an OOM-killed server would come back for the same memory);
behind LiteLLM (2x-solo), the drain gate's file mount, its flag's tmpfs and command wrapper (launch/gate.py), passed
in by the planner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import NodeConfig
from ..recipes import PreExec, Recipe, fill
from .mods import Mod, gated, mod_steps, pre_exec_steps, release_step
from .steps import NodeExpr, Step, launch_labels

HF_CACHE = '"${HF_HOME:-$HOME/.cache/huggingface}"'
HF_CACHE_TARGET = "/root/.cache/huggingface"      # where spark-vllm-docker mounts it (and HF looks by default)
COMPILE_CACHES = (('"$HOME"/.cache/vllm', "/root/.cache/vllm"), ('"$HOME"/.cache/flashinfer', "/root/.cache/flashinfer"),
                  ('"$HOME"/.triton', "/root/.triton"), ('"$HOME"/.tilelang', "/root/.tilelang"),
                  # the B12X image family's CuTeDSL kernels: without it they compile again on every launch
                  ('"$HOME"/.cache/b12x', "/root/.cache/b12x"))
# Always first, as the runner's DOCKER_ARGS: NCCL must not pin its threads to the cores the container was given.
BASE_ENV = (("NCCL_IGNORE_CPU_AFFINITY", "1"),)
NON_PRIVILEGED_SHM = "64g"          # launch-cluster.sh --shm-size-gb default
# A router's or the gateway's container holds no model: a cap sized for the router, so a leak in it is its own
# OOM-kill and never the unified-memory host's. vllm-router: 88 MB resident in front of two servers on the test bed;
# LiteLLM: about 300 MB per process, and the gateway's graceful reload (launch/gateway.py) runs a second worker
# beside the first while the old one finishes its streams.
ROUTER_MEMORY = {"vllm-router": "512m", "litellm": "2g"}


def service_argv(name: str, labels: Sequence[str], image: str, command: Sequence[str], *, memory: str,
                 volumes: Sequence[str] = (), env: Sequence[tuple[str, str]] = (),
                 secrets: Sequence[str] = ()) -> tuple[str, ...]:
    """`docker run` of a router or the gateway: host network, an init process, a memory cap (memory-swap equal to
    it: no swap), read-only what it mounts, secrets by reference (`-e NAME`, read from the node's environment)."""
    argv = ["docker", "run", "-d", "--name", name, *labels, "--network", "host", "--init",
            "--memory", memory, "--memory-swap", memory]
    for v in volumes:
        argv += ["-v", v]
    for k, v in env:
        argv += ["-e", f"{k}={v}"]
    for s in secrets:
        argv += ["-e", s]
    return (*argv, "--entrypoint=", image, *command)


@dataclass(frozen=True)
class ContainerSpec:
    recipe: Recipe
    topology: str
    image: str
    privileged: bool = True
    cache_dirs: bool = True
    mods: tuple[Mod, ...] = ()
    pre_exec: tuple[PreExec, ...] = ()
    workload: str | None = None        # the launch's name, on every container's labels
    ranks: int | None = None           # a cluster launch's containers (one per node), on each rank's labels

    @property
    def gated(self) -> bool:
        """Something runs in the container before the server: its command waits for the release."""
        return bool(self.mods or self.pre_exec)

    def caches(self) -> list[tuple[str, str]]:
        return [(HF_CACHE, self.recipe.container_settings.hf_cache_target),
                *(COMPILE_CACHES if self.cache_dirs else ())]

    def base_env(self) -> list[tuple[str, str]]:
        """sparkconsole's variables, before the recipe's (which may replace them)."""
        env = list(BASE_ENV)
        target = self.recipe.container_settings.hf_cache_target
        if target != HF_CACHE_TARGET:
            env.append(("HF_HOME", target))
        return env

    def prepare(self, node: NodeConfig, name: str, *, drop_caches: bool = False) -> list[Step]:
        """Before a node's container starts: the page cache dropped (if asked), the cache directories made,
        and a stopped leftover of the same name removed."""
        steps = []
        if drop_caches:
            steps.append(Step(node.name, "drop the page cache before the model load (an OOM guard)",
                              ("sh", "-c", 'sync; if [ "$(id -u)" = 0 ]; then echo 3 > /proc/sys/vm/drop_caches; '
                                           'else sudo -n sh -c "echo 3 > /proc/sys/vm/drop_caches"; fi')))
        steps.append(Step(node.name, "make the node's model and compile cache directories (mounted below)",
                          ("mkdir", "-p", *(NodeExpr(src) for src, _ in self.caches()))))
        # `docker rm` refuses a running container: a launch never replaces a server someone else left running.
        steps.append(Step(node.name, f"remove a stopped leftover container {name} (refused if it is running)",
                          ("docker", "rm", name), tolerate=("No such container",)))
        return steps

    def run_argv(self, node: NodeConfig, role: str, name: str, env: Sequence[tuple[str, str]],
                 params: Mapping[str, Any], url: str | None, command: Sequence[str],
                 mounts: Sequence[str] = (), tmpfs: Sequence[str] = (), *, model: str | None = None,
                 claim_b: int | None = None) -> tuple[str, ...]:
        """`docker run` of one server, its command gated on the mods when there are any; `mounts` and `tmpfs`:
        sparkconsole's own (the drain gate's file and its flag's directory)."""
        cs = self.recipe.container_settings
        labels = launch_labels(self.recipe, self.topology, role, node, url, workload=self.workload,
                               model=model if url else None, claim_b=claim_b, ranks=self.ranks)
        argv: list[str] = ["docker", "run", "-d", "--name", name, *labels, "--network", "host"]
        if self.privileged:
            argv.append("--privileged")
        else:
            argv += ["--cap-add", "IPC_LOCK", *(["--device", "/dev/infiniband"] if cs.rdma else []),
                     "--pids-limit", str(cs.pids_limit)]
        for cap in cs.cap_add:
            argv += ["--cap-add", cap]
        for dev in cs.devices:
            argv += ["--device", dev]
        for opt in cs.security_opt:
            argv += ["--security-opt", opt]
        if cs.nofile and not any(u.startswith("nofile=") for u in cs.ulimits):
            argv += ["--ulimit", f"nofile={cs.nofile}:{cs.nofile}"]
        for u in cs.ulimits:
            argv += ["--ulimit", u]
        if cs.user:
            argv += ["--user", cs.user]
        if cs.gpus:
            argv += ["--gpus", cs.gpus]
        if cs.ipc_host and self.privileged:
            argv.append("--ipc=host")
        elif cs.shm_size or not self.privileged:
            argv += ["--shm-size", cs.shm_size or NON_PRIVILEGED_SHM]
        if cs.init:
            argv.append("--init")
        if cs.memory:
            # memory-swap equal to memory: no swap inside the container either (seed 004: swap on UMA spirals)
            argv += ["--memory", cs.memory, "--memory-swap", cs.memory]
        for src, dst in self.caches():
            argv += ["-v", NodeExpr(f"{src}:{dst}")]
        for v in cs.volumes:
            argv += ["-v", fill(v, params, self.recipe.source, None, "sparkconsole.container.volumes")]
        for v in mounts:
            argv += ["-v", v]
        for t in (*cs.tmpfs, *tmpfs):
            argv += ["--tmpfs", t]
        for k, v in (*self.base_env(), *env):
            argv += ["-e", f"{k}={v}"]
        for s in self.recipe.secrets:
            argv += ["-e", s.name]
        argv += [f"--entrypoint={cs.entrypoint or ''}", self.image, *(gated(command) if self.gated else command)]
        return tuple(argv)

    def router_argv(self, node: NodeConfig, name: str, router: str, url: str, model: str | None, image: str,
                    command: Sequence[str], *, volumes: Sequence[str] = (), env: Sequence[tuple[str, str]] = (),
                    secrets: Sequence[str] = ()) -> tuple[str, ...]:
        """`docker run` of the router in front of this launch's servers, with the launch's labels and a cap sized
        for the router (ROUTER_MEMORY)."""
        labels = launch_labels(self.recipe, self.topology, "router", node, url, router, workload=self.workload,
                               model=model)
        memory = ROUTER_MEMORY["vllm-router" if router == "vllm-router" else "litellm"]
        return service_argv(name, labels, image, command, memory=memory, volumes=volumes, env=env, secrets=secrets)

    def after_start(self, node: NodeConfig, name: str, env: Sequence[tuple[str, str]] = ()) -> list[Step]:
        """The mods, run without the recipe's own `env:` (the runners export it after the mods); a name the
        topology or the node also sets (`env`, as the runner's `-e`) stays. Then a v2 recipe's pre_exec."""
        kept = {k for k, _ in (*BASE_ENV, *env, *node.vllm_env)}
        return [*mod_steps(node.name, name, self.mods, [k for k in self.recipe.env if k not in kept]),
                *pre_exec_steps(node.name, name, self.pre_exec, self.recipe.source)]

    def release(self, node: NodeConfig, name: str) -> list[Step]:
        return [release_step(node.name, name)] if self.gated else []
