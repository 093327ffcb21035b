"""The router in front of a plan's servers: vllm-router (also in prefill/decode mode) or a LiteLLM proxy, as steps
on the head node; and the refusal of compromised LiteLLM releases wherever a recipe pins one."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config import NodeConfig
from ..errors import UserError
from ..recipes import RouterImpl, SecretRef, fill
from .steps import Service, Step, url_host

if TYPE_CHECKING:
    from .planning import PlanBuilder

# Added first-token latency measured on this project's test bed (docs/testbed notes): shown in the plan.
ROUTER_OVERHEAD_NOTE = {
    "vllm-router": "vllm-router added about 0.5 ms to first token on the test bed",
    "litellm": "LiteLLM proxy added about 12 ms to first token on the test bed (single event loop, ~1,500 chunks/s)",
}
# LiteLLM releases from a supply-chain attack (seed 001): refused when planned, linted and launched.
COMPROMISED_LITELLM = ("1.82.7", "1.82.8")


def compromised_versions(impl: RouterImpl, *, litellm: bool) -> list[str]:
    """The compromised LiteLLM versions a router pin names (its version or its image tag)."""
    if not litellm and "litellm" not in (impl.image or "").lower():
        return []
    tag = (impl.image or "").rsplit("/", 1)[-1].partition(":")[2]
    found = {impl.version or "", *re.findall(r"\d+\.\d+\.\d+", tag)}
    return sorted(v for v in found if v in COMPROMISED_LITELLM)


# Where router configs go on the head node. Not a valid Python package name on purpose: a directory called
# "sparkconsole" in /tmp would shadow the real package for any script run from /tmp.
DEFAULT_ROUTER_DIR = "/tmp/sparkconsole-router"
# How long LiteLLM leaves a server out after it refused a request; a rolling restart waits it out (rolling.py).
LITELLM_COOLDOWN_S = 10


@dataclass
class _RouterParts:
    """What differs between the two routers' containers: the command's arguments, its health path, and what it
    reads from the node (environment, mounts, secrets by reference)."""

    impl: RouterImpl
    args: list[str]
    health: str
    env: list[tuple[str, str]] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    secrets: tuple[SecretRef, ...] = ()


def add_router(b: PlanBuilder, choice: str, head: NodeConfig, servers: list[Service], disagg: bool = False) -> str:
    """The router's steps on the head node, in front of `servers`; returns the URL clients use."""
    recipe, params = b.recipe, b.params
    port = b.router_port()
    name = f"{b.cname(head)}_router"
    url = f"http://{url_host(head.address)}:{port}"
    model = servers[0].model
    b.add_step(Step(head.name, f"remove a stopped leftover router container {name} (refused if it is running)",
                      ("docker", "rm", name), tolerate=("No such container",)))
    parts = (_vllm_router(b, head, port, servers, disagg) if choice == "vllm-router"
             else _litellm(b, choice, head, name, port, model, servers))
    impl = parts.impl
    if not impl.image:
        raise UserError(f"no image for the {choice} router", file=recipe.source, field="sparkconsole.router",
                        fix="set the router's image in the recipe's sparkconsole.router section")
    volumes = [*parts.mounts,
               *(fill(v, params, recipe.source, None, "sparkconsole.router.volumes") for v in impl.volumes)]
    argv = b.container.router_argv(head, name, choice, url, model, impl.image, parts.args, volumes=volumes,
                                   env=parts.env, secrets=[s.name for s in parts.secrets])
    key = f"{head.name}/router"
    b.add_step(Step(head.name, f"start the router ({choice}, {impl.image})", tuple(argv), secrets=parts.secrets,
                    service=key))
    b.listen(head, port)
    b.add_service(Service(key=key, node=head.name, container=name, role="router", url=url, model=model,
                          health_path=parts.health, models_path=None if choice != "vllm-router" else "/v1/models"))
    return url


def _vllm_router(b: PlanBuilder, head: NodeConfig, port: int, servers: list[Service], disagg: bool) -> _RouterParts:
    recipe = b.recipe
    impl = recipe.router.vllm_router
    if compromised_versions(impl, litellm=False):
        raise UserError("the router image is a compromised LiteLLM release (a supply-chain attack)", file=recipe.source,
                        field="sparkconsole.router.vllm_router", fix="use a vllm-router image")
    # Its Prometheus exporter takes 29000 unless told: beside the router's own port instead, so two routers on
    # one machine (two launches, or the test bed's) never fight over it, and preflight checks it with the rest.
    metrics_port = port + 1
    args = [*[fill(c, b.params, recipe.source, None, "sparkconsole.router.vllm_router.command") for c in impl.command],
            "--host", "0.0.0.0", "--port", str(port), "--prometheus-port", str(metrics_port)]
    b.listen(head, metrics_port)
    if disagg:
        prefill, decode = servers
        args += ["--vllm-pd-disaggregation", "--prefill", str(prefill.url), "--decode", str(decode.url)]
        if recipe.disagg.connector == "NixlConnector":
            args += ["--kv-connector", "nixl"]
    else:
        args += ["--worker-urls", *[str(s.url) for s in servers], "--policy", impl.policy or "round_robin"]
    b.note(ROUTER_OVERHEAD_NOTE["vllm-router"])
    return _RouterParts(impl, args, "/health")


def _litellm(b: PlanBuilder, choice: str, head: NodeConfig, name: str, port: int, model: str | None,
             servers: list[Service]) -> _RouterParts:
    recipe = b.recipe
    impl = recipe.router.litellm
    bad = compromised_versions(impl, litellm=True)
    if bad:
        raise UserError(f"LiteLLM {bad[0]} is a compromised release (a supply-chain attack)",
                        file=recipe.source, field="sparkconsole.router.litellm",
                        fix="pin a known-good LiteLLM, e.g. version 1.106.2")
    router_dir = b.options.get("router_dir") or DEFAULT_ROUTER_DIR
    cfg_path = f"{router_dir.rstrip('/')}/{name}.yaml"
    cfg = litellm_config(model or "model", servers, choice)
    b.add_step(Step(head.name, f"write the LiteLLM config ({choice}) to {cfg_path}",
                      ("sh", "-c", 'umask 077 && mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "sh", cfg_path),
                      input=cfg.encode()))
    args = [*[fill(c, b.params, recipe.source, None, "sparkconsole.router.litellm.command") for c in impl.command],
            "--config", "/etc/litellm/config.yaml", "--host", "0.0.0.0", "--port", str(port)]
    b.note(ROUTER_OVERHEAD_NOTE["litellm"])
    # Offline start (no price-map download); the master key comes from the node, by reference.
    return _RouterParts(impl, args, "/health/liveliness", env=[("LITELLM_LOCAL_MODEL_COST_MAP", "True")],
                        mounts=[f"{cfg_path}:/etc/litellm/config.yaml:ro"],
                        secrets=(SecretRef("LITELLM_MASTER_KEY"),))


def litellm_config(model: str, servers: Sequence[Service], strategy: str) -> str:
    """LiteLLM proxy config: one deployment per backend under one model name, the routing strategy chosen."""
    import yaml
    doc = {
        "model_list": [{"model_name": model,
                        "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": f"{s.url}/v1"}}
                       for s in servers],
        # A backend that refuses a request (closed by the drain gate, stopped for a restart, crashed) is cooled down
        # at its first failure, and the request goes to another. A stream fails at its first read, past LiteLLM's
        # retries: only its weighted failover (simple-shuffle) re-picks a server for it. LiteLLM cannot take a
        # server out without its database, so this is how a rolling restart behind it drops nothing (rolling.py).
        "router_settings": {"routing_strategy": strategy, "num_retries": 2, "allowed_fails": 0,
                            "cooldown_time": LITELLM_COOLDOWN_S, "enable_weighted_failover": True},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }
    return yaml.safe_dump(doc, sort_keys=False)
