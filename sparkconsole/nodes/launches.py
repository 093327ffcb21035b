"""One launch, many nodes: the containers sparkconsole started, grouped by the labels the plan put on them.

Every container a plan starts carries `sparkconsole.recipe`, `.topology`, `.role` and `.node` (launch/plan.py),
and `.workload` (the launch's name: several workloads may run from one recipe), `.model` (the served model name) and
`.claim` (the memory its server claims). The agents report them with each container, so the console can show a
multi-node launch as one thing and see it break: a tensor-parallel worker that exits leaves its head running but
unable to serve. Containers are keyed by (node label, name), so nodes that share one Docker engine (the test bed)
still count each container once. A launch is grouped by its workload name; containers from before that label, by
recipe and topology.

Pure: node monitors (or recorded ticks) in, groups out. launch/health.py is the same verdict made from a plan
and live `docker inspect` answers; this one needs no plan, only what the agents already send.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any

from ..config import EndpointConfig

LABEL = "sparkconsole."
SERVING, STARTING, BROKEN, CLOSED = "SERVING", "STARTING", "BROKEN", "CLOSED"
# roles whose loss stops the whole launch from serving, per topology
_NEEDED = {"cluster-tp2": ("server", "worker"), "disagg": ("prefill", "decode", "router")}
# why such a launch cannot serve without one of them (the verdicts' words, and the dashboard's r / s)
_WHY_NEEDED = {"cluster-tp2": "the tensor-parallel group cannot serve without every rank",
               "disagg": "prefill and decode serve only together"}
# topologies served through a router, which a plan starts after its servers are healthy
ROUTED = ("2x-solo", "disagg")
# the fewest members of each role a launch of the topology runs (a cluster launch's `ranks` label says how many
# workers it has; one without the label, from before, is judged on one)
_SHAPE = {"2x-solo": {"server": 2}, "cluster-tp2": {"server": 1, "worker": 1}, "disagg": {"prefill": 1, "decode": 1}}
VLLM_ROLES = ("server", "prefill", "decode")


@dataclass(frozen=True)
class Member:
    node: str
    role: str
    container: str
    state: str | None
    exit_code: int | None = None
    oom_killed: bool | None = None
    url: str | None = None          # where it serves (`sparkconsole.url`); None for a headless rank
    router: str | None = None       # a router's choice (`sparkconsole.router`: vllm-router, simple-shuffle, …)
    model: str | None = None        # the served model name (`sparkconsole.model`)
    claim_b: int | None = None      # what its server claims at start (`sparkconsole.claim`), None: not said
    ranks: int | None = None        # a cluster launch's containers (`sparkconsole.ranks`), None: not said

    @property
    def port(self) -> int | None:
        """The port it serves on (from its URL)."""
        from urllib.parse import urlsplit
        try:
            return urlsplit(self.url).port if self.url else None
        except ValueError:
            return None

    @property
    def running(self) -> bool:
        return self.state == "running"

    def words(self) -> str:
        s = self.state or "unknown"
        if not self.running and self.exit_code is not None:
            s += f" ({self.exit_code}{', OOM-killed' if self.oom_killed else ''})"
        return f"{self.node} {self.role} {s}"


@dataclass(frozen=True)
class LaunchGroup:
    recipe: str
    topology: str
    members: tuple[Member, ...]
    verdict: str
    reason: str
    workload: str | None = None     # `sparkconsole.workload`; None: a container from before workloads had names

    @property
    def name(self) -> str:
        """The workload's name: what `recipe status|restart|stop NAME` and the console act on."""
        return self.workload or self.recipe

    @property
    def key(self) -> str:
        return f"{self.name}:{self.topology}"

    @property
    def router(self) -> str | None:
        return next((m.router for m in self.members if m.role == "router" and m.router), None)

    @property
    def model(self) -> str | None:
        """The served model name clients ask for."""
        return next((m.model for m in self.members if m.model), None)

    @property
    def endpoint(self) -> str | None:
        """Where clients reach it: its router when it has one, else its serving head."""
        router = next((m.url for m in self.members if m.role == "router" and m.url), None)
        return router or next((m.url for m in self.members if m.role in VLLM_ROLES and m.url), None)

    @property
    def missing(self) -> str | None:
        """What of it no node lists yet (`unlisted`), None when it is whole."""
        return unlisted(self.topology, self.members)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.node for m in self.members))

    def containers_on(self, node: str) -> tuple[str, ...]:
        return tuple(m.container for m in self.members if m.node == node)

    def line(self) -> str:
        named = f"{self.name} ({self.recipe})" if self.workload and self.workload != self.recipe else self.recipe
        return (f"{named} × {self.topology}: " + " · ".join(m.words() for m in self.members)
                + f" — {self.verdict}" + (f": {self.reason}" if self.verdict != SERVING else ""))


def _judge(topology: str, members: list[Member]) -> tuple[str, str]:
    down = [m for m in members if not m.running and m.state not in ("created", "restarting")]
    if down and any(m.running for m in members):
        m = down[0]
        if topology in _NEEDED and m.role in _NEEDED[topology]:
            return BROKEN, f"{m.role} on {m.node} is {m.words().split(' ', 2)[2]}; {_WHY_NEEDED[topology]}"
        return BROKEN, f"{m.role} on {m.node} is {m.words().split(' ', 2)[2]}"
    if down:
        return BROKEN, "no member runs"
    if any(not m.running for m in members):
        return STARTING, "containers are starting"
    missing = unlisted(topology, members)
    return (STARTING, missing) if missing else (SERVING, "")


def unlisted(topology: str, members: Iterable[Member]) -> str | None:
    """What of a launch no node lists, in words; None when it is whole. Each node's agent lists its containers
    every few seconds, so right after a launch one node may list its member before another does; a member removed
    by hand reads the same, so the words say both. A plan starts a router after its servers."""
    members = list(members)
    shape = dict(_SHAPE.get(topology, {}))
    ranks = max((m.ranks for m in members if m.ranks), default=None)
    if topology == "cluster-tp2" and ranks and ranks > 1:
        shape["worker"] = ranks - 1          # every rank: a TP 4 launch does not serve on its head and one worker
    for role, need in shape.items():
        have = sum(m.role == role for m in members)
        if have < need:
            others = ("the other is starting, or was removed" if need - have == 1
                      else "the others are starting, or were removed")
            return (f"{have} of its {need} {role}s listed ({others})" if need > 1
                    else f"its {role} is not listed (starting, or removed)")
    if topology in ROUTED and not any(m.role == "router" for m in members):
        return "its router is not running yet"
    return None


def launch_groups(nodes: Iterable[Any]) -> list[LaunchGroup]:
    """Groups of labelled containers across `nodes` (objects with .name and .containers), largest first."""
    seen: dict[tuple[str, str], tuple[tuple[str, str, str], Member]] = {}
    labelled: set[tuple[str, str, str]] = set()      # the groups with a workload label on some member
    for node in nodes:
        for c in getattr(node, "containers", ()) or ():
            labels = dict(getattr(c, "labels", None) or ())
            recipe, topology = labels.get(LABEL + "recipe"), labels.get(LABEL + "topology")
            if not recipe or not topology:
                continue
            where = labels.get(LABEL + "node") or str(node.name)
            # A workload's name is its label, else its recipe: a container without the label (from before, or
            # relaunched by a path that did not set it) belongs with the labelled ones of the same name.
            workload = labels.get(LABEL + "workload") or None
            if workload:
                labelled.add((recipe, topology, workload))
            seen[(where, c.name)] = ((recipe, topology, workload or recipe),
                                     Member(where, labels.get(LABEL + "role") or "?", c.name, c.state, c.exit_code,
                                            c.oom_killed, (labels.get(LABEL + "url") or "").rstrip("/") or None,
                                            labels.get(LABEL + "router") or None, labels.get(LABEL + "model") or None,
                                            _int(labels.get(LABEL + "claim")), _int(labels.get(LABEL + "ranks"))))
    groups: dict[tuple[str, str, str], list[Member]] = {}
    for key, member in seen.values():
        groups.setdefault(key, []).append(member)
    out = []
    for (recipe, topology, workload), members in groups.items():
        members.sort(key=lambda m: (m.role not in ("server", "prefill", "router"), m.node, m.container))
        verdict, reason = _judge(topology, members)
        named = workload if (recipe, topology, workload) in labelled else None
        out.append(LaunchGroup(recipe, topology, tuple(members), verdict, reason, named))
    out.sort(key=lambda g: (-len(g.members), g.key))
    return out


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def alone_words(groups: Iterable[LaunchGroup], node: str, container: str, action: str) -> str:
    """What `docker restart` / `docker stop` of one node's container does to the launch it belongs to, and the way
    that does not do it (the console's dashboard r / s act on one container; the recipes screen's on a launch)."""
    hit = next(((g, m) for g in groups for m in g.members if m.node == node and m.container == container), None)
    if hit is None or hit[0].topology == "solo":
        return "Requests in flight on this node will fail."
    g, m = hit
    whole = f"Recipes (2) → {'r restarts' if action == 'restart' else 's stops'} {g.name} as one launch"
    if g.topology in _NEEDED and m.role in _NEEDED[g.topology]:
        return (f"{container} is the {m.role} of {g.name} × {g.topology}: {_WHY_NEEDED[g.topology]}, so this "
                f"{action} breaks it. {whole}.")
    if g.topology == "2x-solo" and m.role == "server":
        how = (", one server at a time, dropping no request" if action == "restart" and g.router is not None else "")
        return (f"{container} is one of {g.name}'s servers behind its router: requests in flight here fail, and so "
                f"may new ones the router sends here before it notices. {whole}{how}.")
    return f"Requests in flight through {g.name} × {g.topology} will fail. {whole}."


def member_at(groups: Iterable[LaunchGroup], url: str) -> Member | None:
    """The launch member that serves at `url` (its `sparkconsole.url`)."""
    url = url.rstrip("/")
    return next((m for g in groups for m in g.members if m.url == url), None)


def needed_words(topology: str) -> str | None:
    """Why a launch of the topology cannot serve without each of its members; None where it can (behind a router)."""
    return _WHY_NEEDED.get(topology)


def find_workload(groups: Iterable[LaunchGroup], name: str) -> LaunchGroup | None:
    """The running workload called `name` (its workload label, else its recipe for a container from before)."""
    return next((g for g in groups if g.name == name), None)


def gates_closed(groups: Iterable[LaunchGroup], closed_urls: Collection[str],
                 reopen: Callable[[str, str], str]) -> list[LaunchGroup]:
    """A SERVING launch with a server whose drain gate is closed (its endpoint's poll says so: launch/drain_gate.py
    marks every answer) is CLOSED: it looks healthy and answers every generation 503. The reason names the server
    and `reopen(node, container)`, the command that opens it."""
    out = []
    for g in groups:
        shut = [m for m in g.members if m.url and m.url in closed_urls]
        if shut and g.verdict == SERVING:
            m = shut[0]
            g = replace(g, verdict=CLOSED, reason=f"{m.role} {m.container} on {m.node} is closed to new requests by "
                                                  f"its drain gate (a rolling restart's); open it: "
                                                  f"{reopen(m.node, m.container)}")
        out.append(g)
    return out


def served_endpoints(groups: Iterable[LaunchGroup], configured: Iterable[EndpointConfig]) -> tuple[EndpointConfig, ...]:
    """The endpoints to poll: the cluster file's, moved to where the launches serve.

    A recipe serves on its own port (e.g. 54351), not the cluster file's `vllm_port`: a vLLM server, prefill or
    decode member moves its node's one vLLM endpoint to its URL, and anything else that serves (a router, a
    second server on a node) is added as `NODE ROLE`. Once the containers are gone, the endpoints are the
    cluster file's again. Members whose URL is already polled change nothing.

    A named workload (`sparkconsole.workload`: several may run on one node) is one endpoint of its own, named
    after it, at its endpoint (its router, else its serving head), with its servers behind a router as
    `WORKLOAD NODE`; a node's cluster-file endpoint that nothing serves at any more while workloads run there is
    left out (it would only read DOWN)."""
    groups = list(groups)
    configured = tuple(configured)
    named = [g for g in groups if g.workload]
    out = {ep.name: ep for ep in configured}
    polled = {ep.url for ep in configured}
    _legacy(out, polled, [g for g in groups if not g.workload], configured)
    serving_at = {m.url for g in named for m in g.members if m.url}
    busy_nodes = {m.node for g in named for m in g.members if m.url}
    for ep in configured:
        if ep.kind == "vllm" and ep.node in busy_nodes and ep.url not in serving_at and out.get(ep.name) == ep:
            del out[ep.name]
    for g in named:
        head = g.endpoint
        for m in g.members:
            if not m.url or (m.url in polled and m.url != head):
                continue
            behind = f"{g.name} {m.node}" if m.role == "server" else f"{g.name} {m.role}"
            name = g.name if m.url == head else behind
            kind = "router" if m.role == "router" else "vllm"
            clash = next((k for k, ep in out.items() if ep.url == m.url), None)
            if clash is not None:
                del out[clash]                 # polled as the workload's, not as the node's
            polled.add(m.url)
            out[name] = EndpointConfig(name, m.url, kind=kind, node=m.node)
    return tuple(out.values())


def _legacy(out: dict[str, EndpointConfig], polled: set[str], groups: list[LaunchGroup],
            configured: tuple[EndpointConfig, ...]) -> None:
    """Launches from before workloads had names: the node's endpoint moved, the others added as NODE ROLE."""
    members = [m for g in groups for m in g.members if m.url]
    # an endpoint a launch already serves at stays where it is (a disagg router on the cluster file's port),
    # as what the launch put there
    kept: set[str] = set()
    for m in members:
        for ep in configured:
            if ep.url == m.url:
                kept.add(ep.name)
                out[ep.name] = replace(ep, kind="router" if m.role == "router" else ep.kind)
    for m in members:
        if not m.url or m.url in polled:      # every member has a url (filtered above); `not` narrows its type
            continue
        polled.add(m.url)
        own = [ep for ep in configured if ep.kind == "vllm" and ep.node == m.node]
        if m.role in VLLM_ROLES and len(own) == 1 and own[0].name not in kept:
            kept.add(own[0].name)
            out[own[0].name] = replace(own[0], url=m.url, metrics_url=None)
            continue
        name = f"{m.node} {m.role}"
        if name in out:
            name = f"{name} {m.url.rsplit(':', 1)[-1]}"
        out[name] = EndpointConfig(name, m.url, kind="router" if m.role == "router" else "vllm", node=m.node)


@dataclass(frozen=True)
class InTheWay:
    """A container running where a launch wants to start one of the same name."""
    node: str
    container: str
    group: LaunchGroup | None       # the launch it belongs to; None: started by hand, not by sparkconsole

    def words(self) -> str:
        owner = f"{self.group.recipe} × {self.group.topology}" if self.group else "not started by sparkconsole"
        return f"container {self.container} is running ({owner})"


def in_the_way(nodes: Iterable[Any], wanted: Iterable[tuple[str, str]]) -> list[InTheWay]:
    """Each (node, container name) of `wanted` that runs on that node now (the agents' container lists), with the
    launch it belongs to: a launch there would fail on the name, so preflight says so and names what to stop."""
    nodes = list(nodes)
    groups = launch_groups(nodes)
    running = {(str(n.name), c.name) for n in nodes for c in (getattr(n, "containers", ()) or ())
               if c.state == "running"}
    out = []
    for node, name in dict.fromkeys(wanted):
        if (node, name) in running:
            group = next((g for g in groups for m in g.members if m.node == node and m.container == name), None)
            out.append(InTheWay(node, name, group))
    return out
