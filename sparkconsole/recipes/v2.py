"""recipe_version "2" (and every value other than "1"): sparkrun's recipe format, read as sparkrun reads it.

Stages, each its own function: the document is loaded (sources.load_recipe: size and alias limits), its
`include:` merged (recipes/include.py), its `overrides:` read (recipes/overrides.py; applied per launch), every
field resolved here (name, runtime, node range, env, executor_config, readiness, pre_exec, mods, metadata), and
its command rendered at plan time (recipes/render.py; generated from `defaults` when absent, recipes/generate.py).

As sparkrun: the name is the file's stem unless `name:` says otherwise (sparkrun always uses the stem); the
runtime is `runtime:`, else what the command starts (`vllm serve`, `python -m sglang.launch_server`,
`llama-server`, `trtllm-serve`); `vllm-ray`/`vllm-distributed` are vLLM over Ray or its own multi-node launch;
`mode`, `min_nodes`/`max_nodes`, `solo_only`/`cluster_only` decide the topologies; the node's Hugging Face cache
is mounted at /cache/huggingface with HF_HOME set there. Keys sparkrun knows and sparkconsole does not use, and
keys neither knows, are warnings that `recipe lint` reports.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..yamlsrc import Located
from .envtemplate import check_env
from .executor import read_executor
from .fields import IMAGE_RE, Fields
from .generate import generated_command
from .include import Locate, resolve_includes
from .model import PreExec, Readiness, Recipe
from .overrides import read_overrides
from .section import SECTION, read_section
from .v1 import env_values

SPARKRUN_KEYS = {"sparkrun_version", "recipe_version", "name", "description", "model", "model_revision", "runtime",
                 "runtime_version", "mode", "min_nodes", "max_nodes", "container", "containers", "defaults", "env",
                 "command", "runtime_config", "cluster_only", "solo_only", "benchmark", "metadata", "pre_exec",
                 "post_exec", "post_commands", "mods", "stop_after_post", "builder", "builder_config", "executor",
                 "executor_config", "scheduler", "distribution_config", "layout", "cluster_config", "runtime_cache",
                 "readiness", "capabilities", "unsupported_capabilities", "include", "overrides", "build_args"}
# sparkrun's, read and not acted on: each a warning saying so.
NOT_USED = {"post_exec": "sparkconsole runs nothing in the container after it serves",
            "post_commands": "sparkconsole runs no recipe command on this machine",
            "builder": "sparkconsole builds no image; the image must be on the nodes (`sparkconsole image`)",
            "builder_config": "sparkconsole builds no image",
            "distribution_config": "`sparkconsole model pull` puts the model on every node",
            "layout": "the topology places the servers", "scheduler": "the topology places the servers",
            "containers": "every node runs the recipe's container",
            "cluster_config": "the node's own Hugging Face cache is mounted", "runtime_cache": "the node's compile "
            "caches are mounted (launch/container.py)", "executor": "sparkconsole runs every server in docker"}
SPARKRUN_HF_CACHE = "/cache/huggingface"
_RUNTIME_HINTS = ((re.compile(r"^vllm\s+serve\b"), "vllm"),
                  (re.compile(r"^(?:sglang\s+serve|python3?\s+-m\s+sglang\.launch_server)\b"), "sglang"),
                  (re.compile(r"^llama-server\b"), "llama-cpp"),
                  (re.compile(r"^(?:trtllm-serve|mpirun\b.*trtllm)"), "trtllm"))
_RAY_FLAG = re.compile(r"--distributed-executor-backend[=\s]+ray\b")
_DEFAULT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")
READINESS_KEYS = {"port_timeout_s", "health_timeout_s", "inference", "inference_style", "inference_timeout_s",
                  "inference_prompt"}


def read_v2(doc: Located, key: str | None = None, *, registry: str | None = None,
            locate: Locate | None = None) -> Recipe:
    doc, chain = include_stage(doc, locate)
    r = Fields(doc)
    data: dict[str, Any] = doc.data
    warnings = list(doc.warnings) + _key_warnings(doc, data)
    stem = Path(doc.file).stem
    version = str(data.get("recipe_version", data.get("sparkrun_version", "2")))
    model = r.get(data, (), "model", str, None, "write the Hugging Face model id, e.g. Qwen/Qwen3-8B")
    if not model:
        raise doc.error(("model",), "missing required field 'model'", "add 'model: ORG/NAME' (sparkrun requires it)")
    defaults = read_defaults_v2(r, data)
    command, runtime, backend = command_stage(r, data, defaults, warnings)
    container = _image(r, data, runtime)
    env = read_env_v2(r, data)
    min_nodes, max_nodes = node_range(r, data)
    cluster_only, solo_only = min_nodes >= 2, max_nodes == 1
    topologies = ("cluster-tp2",) if cluster_only else ("solo", "2x-solo") if solo_only else \
        ("solo", "cluster-tp2", "2x-solo")
    section = read_section(r, data, cluster_only=cluster_only, solo_only=solo_only, env=env,
                           default_topologies=topologies)
    cluster = section.cluster if SECTION in data and "cluster" in data[SECTION] else \
        replace(section.cluster, backend=backend)
    settings = read_executor(r, data, replace(section.container, hf_cache_target=SPARKRUN_HF_CACHE), warnings)
    return Recipe(
        key=key or stem, name=r.get(data, (), "name", str, None, "write a short name") or stem,
        container=container, command=command, recipe_version=version,
        description=_description(r, data), model=model, defaults=defaults, env=env,
        mods=r.str_list(data, (), "mods", "write a list of mod names"),
        build_args=r.str_list(data, (), "build_args", "write a list of build flags"),
        cluster_only=cluster_only, solo_only=solo_only, topologies=section.topologies,
        topology_defaults=section.topology_defaults, container_settings=settings, secrets=section.secrets,
        cluster=cluster, router=section.router, disagg=section.disagg, warnings=tuple(warnings), source=doc.file,
        command_line=doc.line(("command",)) if "command" in data else None,
        runtime=runtime, metadata=r.mapping(data, (), "metadata", "write metadata: {model_params: 8B}"),
        min_nodes=min_nodes, max_nodes=max_nodes, readiness=read_readiness(r, data), registry=registry,
        model_revision=_revision(r, data), pre_exec=read_pre_exec(r, data), overrides=read_overrides(r, data),
        command_generated="command" not in data or data.get("command") in (None, ""), include_chain=chain)


# --- stages ------------------------------------------------------------------------------------------------------

def include_stage(doc: Located, locate: Locate | None) -> tuple[Located, tuple[str, ...]]:
    if not isinstance(doc.data, dict):
        raise doc.error((), "a recipe must be a mapping with model, container and command",
                        "start the file with 'recipe_version: \"2\"' then 'model: …'")
    if "include" not in doc.data:
        return doc, ()
    merged, chain = resolve_includes(doc.data, Path(doc.file), locate, doc.line(("include",)))
    return Located(merged, doc.lines, doc.file, list(doc.warnings)), chain


def _key_warnings(doc: Located, data: Mapping[str, Any]) -> list[str]:
    out = []
    for k in data:
        if k in NOT_USED:
            out.append(f"{doc.file}:{doc.line((k,))}: {k} not used: {NOT_USED[k]}")
        elif k not in SPARKRUN_KEYS and k != SECTION:
            out.append(f"{doc.file}:{doc.line((k,))}: unknown key {str(k)[:40]!r} (kept, not used)")
    return out


def _image(r: Fields, data: Mapping[str, Any], runtime: str) -> str:
    container = r.get(data, (), "container", str, None, "write the Docker image, e.g. vllm/vllm-openai:v0.12.0")
    if not container and runtime != "vllm":
        return ""          # a runtime of its own (sparkrun's native executors): the plan refuses the runtime first
    if not container:
        raise r.err(("container",), "missing required field 'container'", "add 'container: IMAGE' (the serving image)")
    if not IMAGE_RE.match(container):
        raise r.err(("container",), f"bad image name {container[:60]!r}", "write an image reference like vllm-node:tag")
    return str(container)


def read_defaults_v2(r: Fields, data: Mapping[str, Any]) -> dict[str, Any]:
    defaults = r.mapping(data, (), "defaults", "write 'defaults:' with one 'name: value' per line")
    for k in defaults:
        if not _DEFAULT_NAME.match(str(k)):        # sparkrun's names may hold '-' and '.': {hf-overrides}
            raise r.err(("defaults", k), f"bad placeholder name {str(k)[:40]!r}", "use letters, digits, _ and -")
    return defaults


def command_stage(r: Fields, data: Mapping[str, Any], defaults: Mapping[str, Any],
                  warnings: list[str]) -> tuple[str, str, str]:
    """(the command template, the runtime, the cluster backend). No command: generated from `defaults` for vLLM;
    for another runtime empty, and the plan refuses naming the runtime."""
    command = r.get(data, (), "command", str, None, "write the serve command as a block (command: |)") or ""
    runtime = str(r.get(data, (), "runtime", str, "", "write the runtime, e.g. vllm") or "").strip()
    head = " ".join(command.split())
    if not runtime:
        runtime = next((name for pattern, name in _RUNTIME_HINTS if pattern.match(head)), "vllm")
    backend = "mp"
    if runtime in ("vllm-ray", "eugr-vllm-ray"):
        runtime, backend = "vllm", "ray"
    elif runtime in ("vllm-distributed", "vllm-mp"):
        runtime = "vllm"
    if runtime == "vllm" and (str(defaults.get("distributed_executor_backend", "")).lower() == "ray"
                              or _RAY_FLAG.search(head)):
        backend = "ray"
    if not command:
        built = generated_command(runtime, defaults, _revision(r, data))
        if built is not None:
            command, skipped = built
            if skipped:
                warnings.append(f"{r.doc.file}: no command: built from defaults; not vLLM options, not passed: "
                                f"{', '.join(skipped)}")
    return command, runtime, backend


def read_env_v2(r: Fields, data: Mapping[str, Any]) -> dict[str, str]:
    """As v1's, a boolean as sparkrun's str() spells it (True/False), and its templates checked."""
    env = env_values(r, dict(data), ("True", "False"))
    check_env(env, r.doc.file, r.doc.line)
    return env


def node_range(r: Fields, data: Mapping[str, Any]) -> tuple[int, int | None]:
    mode = r.get(data, (), "mode", str, "auto", "write solo, cluster or auto")
    if mode not in ("solo", "cluster", "auto"):
        raise r.err(("mode",), f"unknown mode {mode[:20]!r}", "write solo, cluster or auto")
    lo = r.get(data, (), "min_nodes", int, 1, "write a whole number of nodes")
    hi = r.get(data, (), "max_nodes", int, None, "write a whole number of nodes")
    if lo < 1 or (hi is not None and hi < 1):
        raise r.err(("min_nodes" if lo < 1 else "max_nodes",), "a node count must be ≥ 1", "write e.g. min_nodes: 2")
    if r.get(data, (), "cluster_only", bool, False, "write true or false"):
        lo = max(lo, 2)
    if r.get(data, (), "solo_only", bool, False, "write true or false"):
        hi = 1
    if mode == "solo":
        lo, hi = 1, 1
    elif mode == "cluster":
        lo = max(lo, 2)
    if hi is not None and hi < lo:
        raise r.err(("max_nodes",), f"max_nodes {hi} is below min_nodes {lo}",
                    "raise max_nodes, or drop solo_only / mode: solo from a cluster recipe")
    return lo, hi


def _description(r: Fields, data: Mapping[str, Any]) -> str:
    d = r.get(data, (), "description", str, "", "write one line of text")
    meta = data.get("metadata")
    if not d and isinstance(meta, dict) and isinstance(meta.get("description"), str):
        d = meta["description"]
    return " ".join(str(d).split())


def _revision(r: Fields, data: Mapping[str, Any]) -> str | None:
    v = r.get(data, (), "model_revision", (str, int), None, "write a commit hash or a branch name")
    if v is not None and not re.match(r"^[A-Za-z0-9._/-]{1,100}$", str(v)):
        raise r.err(("model_revision",), f"bad revision {str(v)[:30]!r}", "write a commit hash or a branch name")
    return None if v is None else str(v)


def read_readiness(r: Fields, data: Mapping[str, Any]) -> Readiness | None:
    raw = data.get("readiness")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise r.err(("readiness",), "readiness must be a mapping", "write readiness: {inference: false}")
    p = ("readiness",)
    r.unknown(raw, p, READINESS_KEYS)

    def timeout(k: str) -> float | None:
        v = raw.get(k)
        if v is None:
            return None
        try:
            s = float(v) if not isinstance(v, bool) else math.nan
        except (TypeError, ValueError):
            s = math.nan
        if math.isnan(s) or (k == "inference_timeout_s" and (not math.isfinite(s) or s <= 0)):
            raise r.err(p + (k,), f"bad timeout {str(v)[:20]!r}", "write seconds, e.g. 600 (≤ 0: no limit, "
                        "except for the inference probe)")
        return s if s > 0 else math.inf

    style = raw.get("inference_style", "auto")
    if style not in ("auto", "openai-chat-stream-v1"):
        raise r.err(p + ("inference_style",), f"inference style {str(style)[:30]!r} is not one sparkconsole probes",
                    "write inference_style: auto (a streamed chat completion)")
    prompt = r.get(raw, p, "inference_prompt", str, Readiness.inference_prompt, "write a prompt")
    if not prompt.strip():
        raise r.err(p + ("inference_prompt",), "the readiness prompt is empty", "write a prompt, or leave it out")
    return Readiness(port_timeout_s=timeout("port_timeout_s"), health_timeout_s=timeout("health_timeout_s"),
                     inference=r.get(raw, p, "inference", bool, True, "write true or false"),
                     inference_timeout_s=timeout("inference_timeout_s"), inference_prompt=prompt)


def read_pre_exec(r: Fields, data: Mapping[str, Any]) -> tuple[PreExec, ...]:
    raw = data.get("pre_exec")
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise r.err(("pre_exec",), "pre_exec must be a list of commands", "write pre_exec: [\"cmd …\"]")
    out = []
    for i, e in enumerate(raw):
        if isinstance(e, str) and e.strip():
            out.append(PreExec(command=e))
        elif isinstance(e, dict) and set(e) <= {"copy", "dest", "source_host"} and isinstance(e.get("copy"), str) \
                and isinstance(e.get("dest"), str):
            if "source_host" in e:
                raise r.err(("pre_exec", i, "source_host"), "a copy from another host is not supported",
                            "copy from a file beside the recipe")
            out.append(PreExec(copy=e["copy"], dest=e["dest"]))
        else:
            raise r.err(("pre_exec", i), "a pre_exec entry is a command, or {copy: FILE, dest: DIR}",
                        "write the command as text")
    return tuple(out)


def check_command(recipe: Recipe) -> None:
    """A v2 recipe the plan can run: one with a command (written, or generated for vLLM)."""
    if not recipe.command:
        raise UserError(f"recipe {recipe.key!r} has no command: and sparkconsole builds one only for vLLM "
                        f"(runtime {recipe.runtime})", file=recipe.source, field="command",
                        fix="write the serve command under command:")

