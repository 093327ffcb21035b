"""One endpoint for every model: the gateway, a LiteLLM proxy on the head node whose model groups route each
request by its `model` to the workload serving that name (`gateway:` in the cluster file turns it on).

Why LiteLLM and not vllm-router's multi-model mode (`--enable-igw`), measured on the test bed's vllm-router 0.1.17:
IGW adds and removes workers at run time and adds ~0.5 ms, but it sends a request for a model no worker serves
(one just stopped, or a typo) to an arbitrary worker of another model, and its /v1/models answers
`{"models": [...]}`, which OpenAI clients do not read. LiteLLM refuses an unknown model with a 400 naming
/v1/models, lists every model in the OpenAI shape, and fails over inside a model group (two workloads serving
one name share it). Its cost is ~12 ms per request and a key (LITELLM_MASTER_KEY, from the head's environment by
reference, as for a recipe's LiteLLM router).

Updated without dropping a request: LiteLLM reads its models once per worker process, and without its database it
has no API to add one. It runs under gunicorn (`--run_gunicorn`), and a change is its config file rewritten and
SIGHUP to gunicorn's master: a new worker starts on the new config while the old one finishes the requests it has
(measured: 40 requests during a reload, none failed; a 45-s stream started before it finished), and the socket
never closes. A HUP that arrives while gunicorn is still starting is lost, so the listing is read back (inside the
container, where the key is) until it is the one written, and the HUP sent again if it is not.

Each workload is listed at its own endpoint (nodes/launches.py: its router when it has one, so its rolling restart
stays its router's business), under its served model name (`sparkconsole.model`). The gateway's container starts
through launch/container.py with a cap sized for LiteLLM.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import ClusterConfig, GatewaySettings
from ..errors import UserError
from ..nodes.launches import LABEL, SERVING, LaunchGroup
from ..recipes import RouterImpl
from .container import ROUTER_MEMORY, service_argv
from .progress import Emit
from .routers import DEFAULT_ROUTER_DIR, LITELLM_COOLDOWN_S, compromised_versions
from .runner import LaunchError, Runner
from .steps import Step, url_host

READY_TIMEOUT_S = 240.0          # LiteLLM under gunicorn: ~20 s to its first answer on the test bed, alone
RELOAD_TIMEOUT_S = 120.0
REHUP_AFTER_S = 20.0


@dataclass(frozen=True)
class Entry:
    """One workload as the gateway lists it."""
    model: str
    api_base: str                 # the workload's endpoint
    workload: str
    litellm: bool                 # behind its own LiteLLM router: the gateway sends the key on

    def words(self) -> str:
        return f"{self.model} → {self.api_base} ({self.workload})"


def entries(groups: Iterable[LaunchGroup]) -> list[Entry]:
    """Every serving workload with a served model name and an endpoint, in a stable order."""
    out = []
    for g in groups:
        if g.verdict != SERVING or not g.model or not g.endpoint:
            continue
        litellm = g.router not in (None, "vllm-router")
        out.append(Entry(g.model, g.endpoint, g.name, litellm))
    return sorted(out, key=lambda e: (e.model, e.api_base))


def gateway_config(listed: Sequence[Entry]) -> str:
    """LiteLLM's config: one deployment per workload, grouped by model name; a model two workloads serve is one
    group of two (simple-shuffle between them, failover from one to the other)."""
    import yaml
    models = []
    for e in listed:
        params: dict[str, Any] = {"model": f"hosted_vllm/{e.model}", "api_base": f"{e.api_base}/v1"}
        if e.litellm:
            params["api_key"] = "os.environ/LITELLM_MASTER_KEY"
        models.append({"model_name": e.model, "litellm_params": params})
    doc = {"model_list": models,
           "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 2,
                               "cooldown_time": LITELLM_COOLDOWN_S, "enable_weighted_failover": True},
           "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"}}
    return yaml.safe_dump(doc, sort_keys=False)


def container(cluster: ClusterConfig) -> str:
    """The gateway's container: named after the head's, so two clusters on one Docker host keep their own."""
    return f"{cluster.head.container}_gateway"


def config_path(cluster: ClusterConfig) -> str:
    return f"{DEFAULT_ROUTER_DIR}/{container(cluster)}.yaml"


def url(cluster: ClusterConfig) -> str | None:
    """Where clients reach the gateway (None: the cluster file has none)."""
    if cluster.gateway is None:
        return None
    return f"http://{url_host(cluster.head.address)}:{cluster.gateway.port}"


def start_argv(cluster: ClusterConfig, settings: GatewaySettings) -> tuple[str, ...]:
    bad = compromised_versions(RouterImpl(image=settings.image, version=settings.version), litellm=True)
    if bad:
        raise UserError(f"the gateway's LiteLLM {bad[0]} is a compromised release (a supply-chain attack)",
                        file=cluster.source, field="gateway.image", fix="pin a known-good LiteLLM, e.g. 1.106.2")
    head = cluster.head
    labels = ["--label", f"{LABEL}role=gateway", "--label", f"{LABEL}node={head.name}",
              "--label", f"{LABEL}url={url(cluster)}"]
    command = [*settings.command, "--config", "/etc/litellm/config.yaml", "--host", "0.0.0.0",
               "--port", str(settings.port), "--run_gunicorn", "--num_workers", "1"]
    return service_argv(container(cluster), labels, settings.image, command, memory=ROUTER_MEMORY["litellm"],
                        volumes=[f"{config_path(cluster)}:/etc/litellm/config.yaml:ro", *settings.volumes],
                        env=[("LITELLM_LOCAL_MODEL_COST_MAP", "True")], secrets=["LITELLM_MASTER_KEY"])


def listing_argv(name: str, port: int) -> tuple[str, ...]:
    """The model names the gateway lists, asked inside its container (where the key is; it never leaves the node)."""
    code = ("import json,os,urllib.request as u;"
            f"r=u.Request('http://127.0.0.1:{port}/v1/models',"
            "headers={'Authorization':'Bearer '+os.environ['LITELLM_MASTER_KEY']});"
            "print(json.dumps(sorted(m['id'] for m in json.load(u.urlopen(r,timeout=5))['data'])))")
    return ("docker", "exec", name, "python3", "-c", code)


@dataclass
class SyncReport:
    listed: list[Entry]
    action: str                   # started | reloaded | unchanged | stopped

    def line(self) -> str:
        models = ", ".join(e.words() for e in self.listed) or "no model"
        return f"gateway {self.action}: {models}"


class Gateway:
    """The gateway's container on the head, kept to the workloads that serve (see the module's docstring)."""

    def __init__(self, cluster: ClusterConfig, runner: Runner, emit: Emit | None = None) -> None:
        if cluster.gateway is None:
            raise UserError("the cluster file has no gateway", file=cluster.source, field="gateway",
                            fix="add 'gateway: {port: 4100}' to the cluster file")
        self.cluster, self.settings, self.runner = cluster, cluster.gateway, runner
        self.head = cluster.head.name
        self.name, self.path = container(cluster), config_path(cluster)
        self.emit = emit or (lambda *a, **k: None)

    async def _run(self, argv: Sequence[str], timeout: float = 30) -> tuple[int, str]:
        res = await self.runner.query(self.head, argv, timeout=timeout)
        return res.rc, res.stdout.strip()

    async def running(self) -> bool:
        rc, out = await self._run(("docker", "inspect", "-f", "{{.State.Running}}", self.name))
        return rc == 0 and out == "true"

    async def listed(self) -> list[str] | None:
        rc, out = await self._run(listing_argv(self.name, self.settings.port), timeout=20)
        try:
            got = json.loads(out.splitlines()[-1]) if rc == 0 and out else None
        except ValueError:
            return None
        return [str(x) for x in got] if isinstance(got, list) else None

    async def _step(self, step: Step) -> None:
        why = await self.runner.run_step(step, "gateway", self.emit)
        if why is not None:
            raise LaunchError(f"gateway on {self.head}: {step.what}: {why}", node=self.head,
                              fix=f"read its log: docker logs {self.name} (on {self.head})")

    async def sync(self, groups: Iterable[LaunchGroup]) -> SyncReport:
        """List exactly the serving workloads of `groups`: start the gateway, reload it, or leave it as it is."""
        listed = entries(groups)
        cfg = gateway_config(listed)
        rc, current = await self._run(("cat", self.path))
        up = await self.running()
        if up and rc == 0 and current == cfg.strip():
            return SyncReport(listed, "unchanged")
        await self._step(Step(self.head, f"write the gateway's config ({len(listed)} model(s)) to {self.path}",
                              ("sh", "-c", 'umask 077 && mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "sh",
                               self.path), input=cfg.encode()))
        want = sorted({e.model for e in listed})
        if not up:
            await self._step(Step(self.head, f"remove a stopped leftover {self.name} (refused if it is running)",
                                  ("docker", "rm", self.name), tolerate=("No such container",)))
            await self._step(Step(self.head, f"start the gateway (LiteLLM, {self.settings.image})",
                                  start_argv(self.cluster, self.settings), secrets=()))
            await self._until_listed(want, READY_TIMEOUT_S, hup=False)
            return SyncReport(listed, "started")
        await self._hup()
        await self._until_listed(want, RELOAD_TIMEOUT_S, hup=True)
        return SyncReport(listed, "reloaded")

    async def _hup(self) -> None:
        await self._step(Step(self.head, "reload the gateway: a new worker reads the config, the old one finishes "
                                         "its requests (SIGHUP to gunicorn)",
                              ("docker", "kill", "--signal", "HUP", self.name)))

    async def _until_listed(self, want: list[str], timeout: float, *, hup: bool) -> None:
        t0 = time.monotonic()
        last_hup = t0
        got: list[str] | None = None
        while time.monotonic() - t0 < timeout:
            got = await self.listed()
            if got == want:
                self.emit(self.head, "ready", f"gateway lists {', '.join(want) or 'no model'}", None)
                return
            if not await self.running():
                break
            if hup and time.monotonic() - last_hup > REHUP_AFTER_S:
                await self._hup()
                last_hup = time.monotonic()
            await asyncio.sleep(1.0)
        raise LaunchError(f"the gateway on {self.head} lists {got if got is not None else 'nothing readable'}, "
                          f"not {want}, after {time.monotonic() - t0:.0f} s", node=self.head,
                          fix=f"read its log: docker logs {self.name} (on {self.head})")

    async def stop(self) -> None:
        for st in (Step(self.head, f"stop the gateway {self.name}", ("docker", "stop", "-t", "30", self.name),
                        tolerate=("No such container",)),
                   Step(self.head, f"remove the gateway {self.name}", ("docker", "rm", self.name),
                        tolerate=("No such container",))):
            await self._step(st)


async def keep_current(cluster: ClusterConfig, transports: Mapping[str, Any], emit: Emit | None = None,
                       *, without: str | None = None) -> SyncReport | None:
    """The gateway (when the cluster file has one) listing the workloads that serve now, read from every node's
    Docker (launch/workloads.py), `without` one about to stop: called after a launch and before a stop."""
    if cluster.gateway is None:
        return None
    from .workloads import groups_of, read_nodes
    if cluster.head.name not in transports:
        raise LaunchError(f"no connection to the head node {cluster.head.name} for the gateway",
                          node=cluster.head.name, fix="check that the node is reachable (sparkconsole status)")
    read, _ = await read_nodes(cluster, transports)
    groups = [g for g in groups_of(read) if g.name != without]
    return await Gateway(cluster, Runner(cluster, transports), emit).sync(groups)
