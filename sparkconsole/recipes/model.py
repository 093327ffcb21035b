"""The recipe model: what every reader (recipe_version "1", "2") produces and everything above reads.

A `Recipe` is immutable; the values a launch adds (the topology's placeholder values, `--set`, the `overrides:`
entries whose `when:` matches) are applied by `params()` and `recipes.overrides.for_launch`, never by mutation.
Placeholders are filled by `fill` (v1: Python's str.format, as run-recipe.py does) or `recipes.render` (v2: the
braces that are not a `{name}` stay as written, as sparkrun renders them).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError

TOPOLOGIES = ("solo", "cluster-tp2", "2x-solo", "disagg")
ROUTER_CHOICES = ("vllm-router", "simple-shuffle", "least-busy")
# The runtimes sparkrun names; a recipe keeps whatever it says, and the plan refuses what it cannot run.
KNOWN_RUNTIMES = ("vllm", "sglang", "llama-cpp", "trtllm", "atlas", "modular-max", "tokenary")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
    # A v2 recipe's executor_config (docker options sparkrun passes through), each one shown in the plan's
    # `docker run` and judged by preflight (launch/lint_container.py).
    cap_add: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ()
    ulimits: tuple[str, ...] = ()      # NAME=SOFT[:HARD], beside the nofile one
    user: str | None = None
    entrypoint: str | None = None      # None: the image's own is cleared (`--entrypoint=`), as the runner does
    # where the node's Hugging Face cache is mounted: spark-vllm-docker's place, or sparkrun's (v2 recipes name
    # paths below it, and HF_HOME says where it is)
    hf_cache_target: str = "/root/.cache/huggingface"


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
class Readiness:
    """A v2 recipe's `readiness:` block, as sparkrun reads it: how long launch health waits for the port, for
    /health, and for a real answer to one streamed chat request (None: the runner's own budget; inf: no limit)."""
    port_timeout_s: float | None = None
    health_timeout_s: float | None = None
    inference: bool = True
    inference_timeout_s: float | None = None
    inference_prompt: str = "Reply with exactly: ready"


@dataclass(frozen=True)
class PreExec:
    """One `pre_exec:` entry of a v2 recipe: a command run in the container before the server starts (as root,
    like a mod's run.sh), or a file copied in (`{copy: SRC, dest: DIR}`)."""
    command: str | None = None
    copy: str | None = None
    dest: str | None = None

    def describe(self) -> str:
        return self.command if self.command is not None else f"copy {self.copy} → {self.dest}"


@dataclass(frozen=True)
class Override:
    """One `overrides:` entry: when every selector of `when` matches the launch, its values apply."""
    index: int
    when: Mapping[str, Any]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    container: str | None = None
    line: int | None = None


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
    # recipe_version "2" (sparkrun's format); a v1 recipe keeps the defaults below.
    runtime: str = "vllm"              # "vllm" | "sglang" | "llama-cpp" | any other name, kept as written
    metadata: Mapping[str, Any] = field(default_factory=dict)   # model_params, model_dtype, kv_dtype, num_layers, …
    min_nodes: int = 1
    max_nodes: int | None = None
    readiness: Readiness | None = None
    registry: str | None = None        # the registry the recipe came from; None for a local file
    model_revision: str | None = None
    pre_exec: tuple[PreExec, ...] = ()
    overrides: tuple[Override, ...] = ()
    command_generated: bool = False    # no `command:`: built from `defaults` for the runtime (recipes/generate.py)
    include_chain: tuple[str, ...] = ()  # the files `include:` merged in, outermost base first

    @property
    def v2(self) -> bool:
        return self.recipe_version != "1"

    def placeholders(self) -> list[str]:
        if self.v2:
            from .render import placeholders_v2
            return placeholders_v2(self.command)
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
        if self.v2:
            from .render import render_v2
            return render_v2(self.command, self.template_values(params), self.source, self.command_line, "command")
        return fill(self.command, params, self.source, self.command_line, "command")

    def template_values(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """What a v2 template's placeholders read: the launch's values, then model, model_revision (only when the
        recipe pins one) and resolved_model_path, as sparkrun injects them."""
        out = dict(params)
        if self.model is not None:
            out.setdefault("model", self.model)
            out.setdefault("resolved_model_path", self.model)
        if self.model_revision:
            out.setdefault("model_revision", self.model_revision)
        return out

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
        return template.format(**{k: fmt_value(v) for k, v in params.items()})
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise UserError(f"placeholder cannot be filled ({' '.join(str(exc).split())[:80]})", file=file, line=line,
                        field=field_, fix="write {name} placeholders without format specs or conversions") from None


def fmt_value(v: Any) -> Any:
    # YAML true/false as vLLM expects them on a command line
    if isinstance(v, bool):
        return "true" if v else "false"
    return v
