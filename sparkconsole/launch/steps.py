"""What a plan is made of: the steps each node runs, the services they start, and the plan itself (launch/plan.py
builds them, launch/runner.py runs them, launch/health.py judges them). Data only, and its rendering."""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import NodeConfig
from ..recipes import Readiness, Recipe, SecretRef

# `ray status` lists each live node as " 1 node_<id>" under "Active:"
RAY_NODE_LINE = r"^\s*1 node_[0-9a-f]+"
RAY_JOIN_TIMEOUT_S = 120.0
# A server started by `docker exec` (vLLM on a Ray cluster) is not the container's main process: its end is
# written to the container log as this line and its exit code.
EXIT_MARK = "sparkconsole: vLLM exited with code"


class NodeExpr(str):
    """An argument the node's shell expands, as the runner's own script does: the node's Hugging Face cache
    (`${HF_HOME:-$HOME/.cache/huggingface}`) and the compile caches under its `$HOME`. Only sparkconsole's own
    constants are ever NodeExprs, never a recipe's or an operator's text, so nothing user-given is expanded."""

    __slots__ = ()


def shell_words(argv: Sequence[str]) -> str:
    """argv as one shell line: every word quoted, a NodeExpr left for the shell to expand."""
    return " ".join(a if isinstance(a, NodeExpr) else shlex.quote(a) for a in argv)

@dataclass(frozen=True)
class Step:
    node: str
    what: str                                   # what it is, in words
    argv: tuple[str, ...]
    change: bool = True                         # changes the node: confirmed and written to the audit log
    input: bytes | None = None                  # stdin (a config file's text)
    secrets: tuple[SecretRef, ...] = ()         # read on the node at run time, by reference
    tolerate: tuple[str, ...] = ()              # stderr text that still counts as success
    service: str | None = None                  # the service this step starts
    expect: tuple[str, int] | None = None       # (regex, n): success needs n stdout lines matching it…
    retry_s: float = 0.0                        # …tried again each second for this long
    input_label: str | None = None              # stdin that is not text (a mod's tar), in words for the plan
    report_output: bool = False                 # on failure, its own output is the reason (a mod's run.sh)

    def shell(self) -> str:
        """The command line as the node's shell gets it: argv quoted, file secrets read there."""
        prefix = []
        for s in self.secrets:
            if s.source.startswith("file:"):
                path = s.source[5:]
                quoted = '"$HOME"/' + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)
                prefix.append(f'{s.name}="$(cat -- {quoted})"')
        line = shell_words(self.argv)
        # Inside `sh -c` the node's expansions see the environment the runner puts before the command
        # (`HF_HOME=… sh -c …`); expanded by the outer shell they would see the login's instead. A file secret
        # stays an assignment in front, where the redactor masks only its value, and reaches docker through sh's
        # environment.
        if any(isinstance(a, NodeExpr) for a in self.argv):
            line = f"sh -c {shlex.quote(line)}"
        return " ".join([*prefix, line])


@dataclass(frozen=True)
class Service:
    """Something a plan starts and the runner follows: a vLLM server, a headless worker, or a router."""
    key: str                                    # unique in the plan, e.g. "spark1/server"
    node: str
    container: str
    role: str                                   # server | worker | router | prefill | decode
    url: str | None                             # base URL answering health and /v1/models; None: headless
    model: str | None = None                    # served model name expected in /v1/models
    health_path: str = "/health"
    models_path: str | None = "/v1/models"
    drain_gate: bool = False                    # carries launch/drain_gate.py (closed for a roll behind LiteLLM)

    @property
    def logs_argv(self) -> tuple[str, ...]:
        return ("docker", "logs", "-f", "--tail", "200", self.container)

    @property
    def state_argv(self) -> tuple[str, ...]:
        return ("docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}",
                self.container)

    def stop_steps(self) -> tuple[Step, ...]:
        return (Step(self.node, f"stop {self.role} container {self.container}",
                     ("docker", "stop", "-t", "30", self.container), tolerate=("No such container",)),
                Step(self.node, f"remove container {self.container}", ("docker", "rm", self.container),
                     tolerate=("No such container", "is already in progress")))

    def restart_step(self) -> Step:
        return Step(self.node, f"restart {self.role} container {self.container}",
                    ("docker", "restart", "-t", "30", self.container))


@dataclass(frozen=True)
class Plan:
    recipe: str                                 # recipe key
    recipe_name: str
    topology: str
    nodes: tuple[str, ...]
    steps: tuple[Step, ...]
    services: tuple[Service, ...]
    endpoint: str | None                        # the URL clients use
    router: str | None = None                   # vllm-router | simple-shuffle | least-busy
    backend: str | None = None                  # mp | ray (cluster)
    image: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    server_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # service key → vLLM argv
    notes: tuple[str, ...] = ()
    server_env: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)  # service key → its env
    listens: Mapping[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)     # node → (address, port)
    cpu_build: bool = False                     # vLLM's CPU platform (VLLM_TARGET_DEVICE=cpu, or no --gpus)
    mods: tuple[str, ...] = ()                  # mods applied in every server's container, in order
    mod_origins: tuple[str, ...] = ()           # where each of those comes from, in words
    pre_exec: int = 0                           # a v2 recipe's pre_exec entries, run after the mods
    readiness: Readiness | None = None          # a v2 recipe's readiness: timeouts and the inference probe
    untrusted: tuple[str, ...] = ()             # what runs as root on someone else's word (recipes/trust.py)…
    trusted: bool = False                       # …confirmed (--trust, or the operator's answer): the runner
                                                # refuses a plan with untrusted items until it is
    runtime: str = "vllm"                       # vllm | sglang | llama-cpp (sparkconsole/runtimes.py)
    workload: str = ""                          # the workload's name (`--name`; the recipe key unless given)

    @property
    def name(self) -> str:
        """What `recipe status|restart|stop NAME` and the console call this launch: its workload name."""
        return self.workload or self.recipe

    @property
    def model(self) -> str | None:
        """The served model name clients ask for (the gateway lists the workload under it)."""
        return next((s.model for s in self.services if s.model and s.url), None)

    def for_node(self, node: str) -> list[Step]:
        return [s for s in self.steps if s.node == node]

    def service(self, key: str) -> Service:
        return next(s for s in self.services if s.key == key)

    @property
    def kv_metrics(self) -> tuple[str, ...]:
        """/metrics of the servers that receive a KV cache (disagg: decode), which a bench level reads around it."""
        return tuple(f"{s.url}/metrics" for s in self.services if s.role == "decode" and s.url)

    @property
    def restartable_in_place(self) -> bool:
        # A tensor-parallel group must come up together; single-node servers can restart one by one. Mods are
        # applied to a fresh container, as the runner does on every start: a plan with mods is relaunched.
        return self.topology != "cluster-tp2" and not self.mods and not self.pre_exec

    def render(self, addresses: Mapping[str, str] | None = None) -> str:
        from .. import secrets as _secrets
        lines = [f"Plan: {self.recipe} ({self.recipe_name}) × {self.topology} on {', '.join(self.nodes)}"]
        if self.endpoint:
            lines.append(f"Endpoint: {self.endpoint}")
        order = {id(s): i + 1 for i, s in enumerate(self.steps)}   # numbers give the execution order
        for node in self.nodes:
            steps = self.for_node(node)
            if not steps:
                continue
            addr = f" {addresses[node]}" if addresses and node in addresses else ""
            lines.append(f"[{node}{addr}]")
            for s in steps:
                lines.append(f"  {order[id(s)]}. {s.what}")
                lines.append(f"     $ {_secrets.redact(s.shell())}")
                if s.input_label is not None:
                    lines.append(f"     (stdin: {s.input_label})")
                elif s.input is not None:
                    lines.append("     (stdin: " + _secrets.redact(s.input.decode("utf-8", "replace")).strip()
                                 .replace("\n", "\n             ") + ")")
        for name, origin in zip(self.mods, self.mod_origins, strict=False):
            lines.append(f"mod: {name} from {origin}")
        for item in self.untrusted:
            lines.append(f"needs confirmation: {item}")
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)


def url_host(address: str) -> str:
    try:
        if ipaddress.ip_address(address).version == 6:
            return f"[{address}]"
    except ValueError:
        pass
    return address


def launch_labels(recipe: Recipe, topology: str, role: str, node: NodeConfig, url: str | None,
                  router: str | None = None, *, workload: str | None = None, model: str | None = None,
                  claim_b: int | None = None, ranks: int | None = None) -> list[str]:
    """`--label` arguments that let the console group one launch's containers across nodes and poll where it
    serves (nodes/launches.py), also where several "nodes" share one Docker engine, as on the test bed. The
    router's says which router it is, so a restart or stop planned again from the labels plans the same one.
    `workload`: the launch's name, several of which may run from one recipe; `model`: the served model name the
    gateway lists it under; `claim_b`: the memory the server claims at start, which the node's budget counts
    until its measured use reaches it (placement/); `ranks`: how many containers a cluster launch runs, so that
    one the nodes do not all list reads STARTING, not SERVING on its head and one worker."""
    labels = [f"recipe={recipe.key}", f"topology={topology}", f"role={role}", f"node={node.name}"]
    if workload:
        labels.append(f"workload={workload}")
    if url:
        labels.append(f"url={url}")
    if model:
        labels.append(f"model={model}")
    if router:
        labels.append(f"router={router}")
    if claim_b is not None:
        labels.append(f"claim={claim_b}")
    if ranks is not None:
        labels.append(f"ranks={ranks}")
    return [a for label in labels for a in ("--label", f"sparkconsole.{label}")]
