"""recipe_version "1": the spark-vllm-docker (run-recipe.sh) format, read as that runner reads it.

Fields (eugr/spark-vllm-docker): name, description, model, container, command (a `vllm serve …` template whose
`{placeholders}` are filled with Python str.format from `defaults` and overrides, `{{`/`}}` for literal braces),
defaults, env, mods, build_args, cluster_only, solo_only; plus sparkconsole's own section (recipes/section.py).

Unknown top-level keys (forks add their own) are kept as warnings that `recipe lint` reports. Every problem is a
one-line UserError naming file, line, field and fix. Each stage below reads one part of the document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..yamlsrc import Located
from .bashread import command_warnings
from .fields import ENV_RE, IMAGE_RE, NAME_RE, Fields
from .model import Recipe
from .section import SECTION, read_section

COMMUNITY_KEYS = {"recipe_version", "name", "description", "model", "container", "command", "defaults", "env",
                  "mods", "build_args", "cluster_only", "solo_only"}
SUPPORTED_VERSIONS = ("1",)
# The placeholders run-recipe.sh fills from its own flags; any other name must come from defaults or --set.
CLI_PLACEHOLDERS = ("port", "host", "tensor_parallel", "gpu_memory_utilization", "max_model_len",
                    "max_num_batched_tokens")


def read_v1(doc: Located, key: str | None = None) -> Recipe:
    r = Fields(doc)
    data = _mapping(doc)
    warnings = list(doc.warnings) + unknown_key_warnings(doc, data, COMMUNITY_KEYS | {SECTION})
    _required(doc, data)
    version = _version(doc, data, warnings)
    name, container, command = _identity(r, data)
    warnings += command_warnings(command, doc.file, doc.line(("command",)))
    description = r.get(data, (), "description", str, "", "write one line of text")
    model = r.get(data, (), "model", str, None, "write the Hugging Face model id, e.g. openai/gpt-oss-120b")
    defaults = read_defaults(r, data)
    data, env = read_env(r, data, warnings)
    cluster_only, solo_only = topology_flags(r, data)
    section = read_section(r, data, cluster_only=cluster_only, solo_only=solo_only, env=env)
    return Recipe(
        key=key or Path(doc.file).stem, name=name, container=container, command=command, recipe_version=version,
        description=description, model=model, defaults=defaults, env=env,
        mods=r.str_list(data, (), "mods", "write a list of mod directories"),
        build_args=r.str_list(data, (), "build_args", "write a list of build-and-copy.sh flags"),
        cluster_only=cluster_only, solo_only=solo_only, topologies=section.topologies,
        topology_defaults=section.topology_defaults, container_settings=section.container, secrets=section.secrets,
        cluster=section.cluster, router=section.router, disagg=section.disagg, warnings=tuple(warnings),
        source=doc.file, command_line=doc.line(("command",)))


def _mapping(doc: Located) -> dict[str, Any]:
    if not isinstance(doc.data, dict):
        raise doc.error((), "a recipe must be a mapping with name, container and command",
                        "start the file with 'recipe_version: \"1\"' then 'name: …'")
    return doc.data


def unknown_key_warnings(doc: Located, data: dict[str, Any], known: set[str]) -> list[str]:
    return [f"{doc.file}:{doc.line((k,))}: unknown key {str(k)[:40]!r} (kept, not used)" for k in data if k not in known]


def _required(doc: Located, data: dict[str, Any]) -> None:
    for req in ("name", "container", "command"):
        if data.get(req) in (None, ""):
            raise doc.error((req,) if req in data else (), f"missing required field {req!r}",
                            f"add '{req}: …' (spark-vllm-docker requires name, recipe_version, container, command)")


def _version(doc: Located, data: dict[str, Any], warnings: list[str]) -> str:
    version = data.get("recipe_version")
    if version is None:
        warnings.append(f"{doc.file}: no recipe_version (run-recipe.sh requires it); assuming \"1\"")
        version = "1"
    version = str(version)
    if version not in SUPPORTED_VERSIONS:
        raise doc.error(("recipe_version",), f"recipe_version {version[:10]!r} is not supported",
                        'write recipe_version: "1"')
    return version


def _identity(r: Fields, data: dict[str, Any]) -> tuple[str, str, str]:
    name = r.get(data, (), "name", str, None, "write a short human-readable name")
    container = read_image(r, data)
    command = r.get(data, (), "command", str, None, "write the vllm serve command as a block (command: |)")
    return name, container, command


def read_image(r: Fields, data: dict[str, Any]) -> str:
    container: str = r.get(data, (), "container", str, None, "write the Docker image, e.g. vllm-node")
    if not IMAGE_RE.match(container):
        raise r.err(("container",), f"bad image name {container[:60]!r}", "write an image reference like vllm-node:tag")
    return container


def read_defaults(r: Fields, data: dict[str, Any]) -> dict[str, Any]:
    defaults = r.mapping(data, (), "defaults", "write 'defaults:' with one 'name: value' per line")
    for k, v in defaults.items():
        if not NAME_RE.match(str(k)):
            raise r.err(("defaults", k), f"bad placeholder name {str(k)[:40]!r}", "use letters, digits and _")
        if isinstance(v, (dict, list)):
            raise r.err(("defaults", k), "a default must be a single value", "write a number or a text value")
    return defaults


def read_env(r: Fields, data: dict[str, Any], warnings: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the document, with an empty env list read as no variables; the env). A value is taken literally."""
    doc = r.doc
    if data.get("env") == []:
        # The runner exports env only `if env_vars:`, so an empty list passes there: read it as no variables.
        warnings.append(f"{doc.file}:{doc.line(('env',))}: env is an empty list; read as no variables, as the "
                        "runner does — fix: write 'env: {}'")
        data = {**data, "env": {}}
    return data, env_values(r, data, ("1", "0"))


def env_values(r: Fields, data: dict[str, Any], booleans: tuple[str, str]) -> dict[str, str]:
    """`env:` as NAME → text (true/false as `booleans` says); a secret's value written there is refused unechoed."""
    from .. import secrets as _secrets  # names whose values are never shown

    env_raw = r.mapping(data, (), "env", "write 'env:' with one 'NAME: value' per line")
    env: dict[str, str] = {}
    for k, v in env_raw.items():
        if not ENV_RE.match(str(k)):
            raise r.err(("env", k), f"bad variable name {str(k)[:40]!r}", "use letters, digits and _")
        if isinstance(v, (dict, list)):
            raise r.err(("env", k), "an environment value must be a single value", "write a number or text")
        if _secrets.is_secret_name(str(k)) and v not in (None, ""):
            # The value is never echoed, not even here.
            raise r.err(("env", k), f"{k} has a value written in the recipe; secrets are passed by reference",
                        f"delete the value and list it under 'sparkconsole: secrets: {{{k}: env}}' "
                        "so it is read from the node's environment")
        env[str(k)] = "" if v is None else ((booleans[0] if v else booleans[1]) if isinstance(v, bool) else str(v))
    return env


def topology_flags(r: Fields, data: dict[str, Any]) -> tuple[bool, bool]:
    cluster_only = r.get(data, (), "cluster_only", bool, False, "write true or false")
    solo_only = r.get(data, (), "solo_only", bool, False, "write true or false")
    if cluster_only and solo_only:
        raise r.err(("solo_only",), "cluster_only and solo_only are both true", "keep one of them")
    return cluster_only, solo_only
