"""The container every vLLM server of a plan runs in, whatever the topology: as spark-vllm-docker's
launch-cluster.sh starts it, plus sparkconsole's deliberate differences (docs/RECIPES_PARITY.md, "The container").

As the runner:
- privileged (the ConnectX-7's RDMA devices for NCCL) with `--ipc=host`, or with `--non-privileged` the runner's
  narrower set: `--cap-add IPC_LOCK --device /dev/infiniband`, a shm size and a pids limit;
- `--ulimit nofile=N:N` (1048576) and `-e NCCL_IGNORE_CPU_AFFINITY=1`;
- the node's Hugging Face cache (`${HF_HOME:-$HOME/.cache/huggingface}`, where `model pull` writes and preflight
  looks) at /root/.cache/huggingface, and the compile caches (vLLM, FlashInfer, Triton, TileLang, B12X) unless
  `--no-cache-dirs`, each made first on the node;
- mods copied in and run before vLLM starts (launch/mods.py), without the recipe's own env.
Deliberately different: a memory cap always (`--memory` = `--memory-swap`), so a unified-memory runaway is an
OOM-kill of the container and not a frozen Spark; no `--rm`, so a dead server's log can still be read; no
`--restart` policy (docs/RECIPES_PARITY.md: an OOM-killed server would come back for the same memory); behind
LiteLLM (2x-solo), the drain gate's mount and command wrapper (launch/gate.py), passed in by the planner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import NodeConfig
from .mods import Mod, gated, mod_steps, release_step
from .recipe import Recipe, fill
from .steps import NodeExpr, Step, launch_labels

HF_CACHE = '"${HF_HOME:-$HOME/.cache/huggingface}"'
HF_CACHE_TARGET = "/root/.cache/huggingface"
COMPILE_CACHES = (('"$HOME"/.cache/vllm', "/root/.cache/vllm"), ('"$HOME"/.cache/flashinfer', "/root/.cache/flashinfer"),
                  ('"$HOME"/.triton', "/root/.triton"), ('"$HOME"/.tilelang', "/root/.tilelang"),
                  # the B12X image family's CuTeDSL kernels: without it they compile again on every launch
                  ('"$HOME"/.cache/b12x', "/root/.cache/b12x"))
# Always first, as the runner's DOCKER_ARGS: NCCL must not pin its threads to the cores the container was given.
BASE_ENV = (("NCCL_IGNORE_CPU_AFFINITY", "1"),)
NON_PRIVILEGED_SHM = "64g"          # launch-cluster.sh --shm-size-gb default


@dataclass(frozen=True)
class ContainerSpec:
    recipe: Recipe
    topology: str
    image: str
    privileged: bool = True
    cache_dirs: bool = True
    mods: tuple[Mod, ...] = ()

    def caches(self) -> list[tuple[str, str]]:
        return [(HF_CACHE, HF_CACHE_TARGET), *(COMPILE_CACHES if self.cache_dirs else ())]

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
                 mounts: Sequence[str] = ()) -> tuple[str, ...]:
        """`docker run` of one server, its command gated on the mods when there are any; `mounts`: sparkconsole's
        own (the drain gate's directory)."""
        cs = self.recipe.container_settings
        argv: list[str] = ["docker", "run", "-d", "--name", name,
                           *launch_labels(self.recipe, self.topology, role, node, url), "--network", "host"]
        if self.privileged:
            argv.append("--privileged")
        else:
            argv += ["--cap-add", "IPC_LOCK", *(["--device", "/dev/infiniband"] if cs.rdma else []),
                     "--pids-limit", str(cs.pids_limit)]
        if cs.nofile:
            argv += ["--ulimit", f"nofile={cs.nofile}:{cs.nofile}"]
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
        for t in cs.tmpfs:
            argv += ["--tmpfs", t]
        for k, v in (*BASE_ENV, *env):
            argv += ["-e", f"{k}={v}"]
        for s in self.recipe.secrets:
            argv += ["-e", s.name]
        argv += ["--entrypoint=", self.image, *(gated(command) if self.mods else command)]
        return tuple(argv)

    def after_start(self, node: NodeConfig, name: str, env: Sequence[tuple[str, str]] = ()) -> list[Step]:
        """The mods, run without the recipe's own `env:` (the runners export it after the mods); a name the
        topology or the node also sets (`env`, as the runner's `-e`) stays."""
        kept = {k for k, _ in (*BASE_ENV, *env, *node.vllm_env)}
        return mod_steps(node.name, name, self.mods, [k for k in self.recipe.env if k not in kept])

    def release(self, node: NodeConfig, name: str) -> list[Step]:
        return [release_step(node.name, name)] if self.mods else []
