"""Restarts that drop no request: a rolling restart behind a router, a graceful (drained) one everywhere else.

Rolling (a router in front of N servers, 2x-solo): one server at a time is taken out of the router, drained
(its own `vllm:num_requests_running` + `vllm:num_requests_waiting` reach 0, bounded by the drain timeout, after
which it is stopped anyway and the requests still on it are reported as cut), launched again from the plan (a
new container with the recipe's flags and image as they are now: what a restart for a new image or a changed flag
needs, which `docker restart` would not give), waited for until it is healthy and answers a real one-token completion, and put back into the router. Only then the next one. A server
that does not come back stops the roll: it stays out of the router and the others keep serving.

vllm-router 0.1.17's worker API, as it answers on the test bed:
- `POST /remove_worker?url=URL` → 200 `Successfully removed worker: URL` (text), also for a URL it does not know;
  a GET is 405.
- `POST /add_worker?url=URL` → 200 `Successfully added worker: URL`; it blocks until the worker answers its health
  check (up to the router's `--worker-startup-timeout-secs`, 600 s by default, then 400 `Timeout …`); 400
  `Worker URL already exists` when it is in.
- `GET /list_workers` → `{"urls": [URL, …]}`.

LiteLLM 1.106.2 removes a deployment only through `/model/delete`, which answers "No DB Connected" without its
database (`store_model_in_db`), and sparkconsole's LiteLLM runs without one. So a server behind LiteLLM carries
the drain gate (launch/gate.py): the roll closes it (new requests answered 503 before anything streams, which
LiteLLM's weighted failover sends to another server, cooling this one down), drains it, restarts it, and waits
until LiteLLM sends to it again (its cooldown ends) before it closes the next. vLLM 0.32 has no such mode itself:
its SIGTERM drain answers new requests with empty aborted 200 streams, and /pause holds them. A roll never leaves
a server closed: it holds the gate closed by touching its flag within the gate's lease until the container is
replaced, and a roll that stops before then (it failed, it was cancelled, Ctrl-C) opens it again on its way out;
one that cannot (a killed console) stops touching, and the gate opens by itself when its lease ends.

Graceful (no router: solo, cluster, disagg): every server is drained by the same rule, then the launch restarts
as it always has. Each restart is written to the audit log: who, when, which servers, drained or cut requests.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from .. import audit
from ..nodes.launches import LABEL
from ..recipes import ROUTER_CHOICES
from ..serving import metrics as vmetrics
from ..serving import prom
from . import gate
from .progress import Emit, ProgressCallback, emit_to, emitter
from .routers import LITELLM_COOLDOWN_S
from .steps import Plan, Service, Step

if TYPE_CHECKING:
    from ..nodes.transport import Transport
    from .runner import Runner

DRAIN_TIMEOUT_S = 120.0
DRAIN_POLL_S = 0.5
ADD_WORKER_TIMEOUT_S = 120.0
NOT_BEHIND_ROUTER = ("router", "worker", "prefill", "decode")


@dataclass
class ServerRestart:
    """What happened to one server: the requests it finished while draining, those cut, the seconds taken."""
    key: str
    node: str
    drained: int = 0                  # requests it still had when taken out that finished before the stop
    cut: int = 0                      # requests still on it when the drain timed out
    drain_s: float = 0.0
    restart_s: float = 0.0
    out_s: float = 0.0                # time out of the router (the others carried everything)
    ok: bool = False


@dataclass
class RestartReport:
    mode: str                         # rolling | graceful
    servers: list[ServerRestart] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def cut(self) -> int:
        return sum(s.cut for s in self.servers)

    def line(self) -> str:
        each = ", ".join(f"{s.key} {'back' if s.ok else 'FAILED'} (drained {s.drained}, cut {s.cut}, "
                         f"restart {s.restart_s:.1f} s, out {s.out_s:.1f} s)" for s in self.servers)
        return f"{self.mode} restart in {self.seconds:.1f} s: {each}"


def backends(plan: Plan) -> list[Service]:
    """The servers behind the plan's router (or every serving head when it has none)."""
    return [s for s in plan.services if s.url and s.role not in NOT_BEHIND_ROUTER] or \
           [s for s in plan.services if s.url and s.role != "router"]


def router_of(plan: Plan) -> Service | None:
    return next((s for s in plan.services if s.role == "router"), None)


def rolls(plan: Plan) -> bool:
    """A plan whose router fronts several interchangeable servers restarts one at a time."""
    return router_of(plan) is not None and sum(1 for s in plan.services if s.role == "server" and s.url) >= 2


def worker_api(plan: Plan) -> bool:
    """Whether the plan's router takes a server out on request (vllm-router); LiteLLM has no API for it without
    its DB. What the roll does is decided by asking the running router (WorkerApi.answers): the router that runs
    may not be the recipe's default (the demo's LiteLLM, a launch with --router)."""
    return plan.router == "vllm-router"


def gated(plan: Plan) -> bool:
    """Whether the plan's servers carry the drain gate (behind LiteLLM)."""
    return any(s.drain_gate for s in backends(plan))


async def running_router(transport: Transport, plan: Plan) -> str | None:
    """Which router a running launch has (its router container's `sparkconsole.router` label), so that a restart
    plans the servers it launched: behind LiteLLM they carry the drain gate. None when it does not say."""
    router = router_of(plan)
    if router is None:
        return None
    res = await transport.run(("docker", "inspect", "--format", f'{{{{index .Config.Labels "{LABEL}router"}}}}',
                               router.container))
    label = res.stdout.strip()
    return label if res.rc == 0 and label in ROUTER_CHOICES else None


# --- the plan in words -----------------------------------------------------------------------------------
def restart_text(plan: Plan, *, all_at_once: bool = False, drain_timeout: float = DRAIN_TIMEOUT_S) -> str:
    """The restart's steps per server, in words (`recipe plan NAME -T TOPOLOGY --restart`)."""
    how = ("docker restart" if plan.restartable_in_place
           else "stop and remove its container, start it again from its launch steps")
    relaunch = ("stop and remove its container, start a new one from the plan (the recipe's flags and image as "
                "they are now)")
    drain = (f"drain: wait until its running + waiting requests reach 0 (at most {drain_timeout:g} s; "
             "then it is stopped anyway and the requests cut are counted)")
    if all_at_once or not rolls(plan):
        lines = [f"Restart: {plan.recipe} × {plan.topology}, " + ("all at once" if all_at_once else "graceful")]
        n = 1
        if drain_timeout > 0 and not all_at_once:
            for s in backends(plan):
                lines.append(f"  {n}. [{s.node}] {s.container}: {drain}")
                n += 1
        if plan.restartable_in_place:
            for s in plan.services:
                if s.role != "router":
                    lines.append(f"  {n}. [{s.node}] {s.container}: restart ({how})")
                    n += 1
        else:
            lines.append(f"  {n}. stop every container of the launch, then launch it again")
            n += 1
        lines.append(f"  {n}. wait until every server is healthy")
        if all_at_once and router_of(plan):
            lines.append("note: every server is down at once: requests in flight fail and the endpoint is down "
                         "until they are back")
        return "\n".join(lines)
    router = router_of(plan)
    assert router is not None
    lines = [f"Restart: {plan.recipe} × {plan.topology}, rolling, one server at a time behind {plan.router} "
             f"({router.url})"]
    for i, s in enumerate(backends(plan), 1):
        if worker_api(plan):
            out, back = "take it out of the router (POST /remove_worker)", "put it back into the router (POST /add_worker)"
        elif s.drain_gate:
            out = ("close it to new requests (its drain gate answers them 503; LiteLLM sends them to another "
                   "server and cools this one down)")
            back = f"wait until LiteLLM sends to it again (its cooldown, {LITELLM_COOLDOWN_S} s)"
        else:
            out = ("LiteLLM has no API to take it out without its database: it leaves only by LiteLLM's own failed "
                   "calls (cooldown)")
            back = "LiteLLM sends to it again once its cooldown ends"
        lines.append(f"  server {i}: {s.container} on {s.node} ({s.url})")
        for j, what in enumerate((out, drain, relaunch,
                                  "wait until it is healthy and answers a one-token completion", back), 1):
            lines.append(f"    {i}.{j} {what}")
    lines.append("  a server that does not come back stops the roll; the others keep serving")
    return "\n".join(lines)


# --- the router's worker list ------------------------------------------------------------------------------
class WorkerApi:
    """vllm-router's worker management endpoints (see the module's docstring)."""

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client, self.url = client, url.rstrip("/")

    async def answers(self) -> bool:
        """Whether the router has the worker API: vllm-router lists its workers; LiteLLM answers 404 or 401."""
        try:
            await self.list()
        except (httpx.HTTPError, ValueError, AttributeError):
            return False
        return True

    async def list(self) -> list[str]:
        r = await self.client.get(self.url + "/list_workers")
        r.raise_for_status()
        return [str(u) for u in r.json().get("urls") or []]

    async def remove(self, worker: str) -> None:
        r = await self.client.post(self.url + "/remove_worker", params={"url": worker})
        if r.status_code != 200:
            raise RuntimeError(f"the router refused to remove {worker}: HTTP {r.status_code} {r.text[:200]}")

    async def add(self, worker: str) -> None:
        r = await self.client.post(self.url + "/add_worker", params={"url": worker}, timeout=ADD_WORKER_TIMEOUT_S)
        if r.status_code != 200 and "already exists" not in r.text:
            raise RuntimeError(f"the router refused to add {worker}: HTTP {r.status_code} {r.text[:200]}")


async def _scrape(client: httpx.AsyncClient, svc: Service, names: tuple[str, ...]) -> prom.Scrape | None:
    """These metrics from one server's /metrics; None when it does not answer."""
    try:
        r = await client.get(f"{svc.url}/metrics")
        if r.status_code != 200:
            return None
        return prom.parse(r.text, only=names)
    except (httpx.HTTPError, ValueError):
        return None


async def in_flight(client: httpx.AsyncClient, svc: Service) -> int | None:
    """running + waiting requests on one server, from its /metrics; None when it does not answer."""
    s = await _scrape(client, svc, (*vmetrics.RUNNING, *vmetrics.WAITING))
    return None if s is None else int((s.total(*vmetrics.RUNNING) or 0) + (s.total(*vmetrics.WAITING) or 0))


async def served(client: httpx.AsyncClient, svc: Service) -> float | None:
    """Requests the server has finished since it started (vllm:request_success_total), None when unknown."""
    s = await _scrape(client, svc, vmetrics.SUCCESS)
    return None if s is None else s.total(*vmetrics.SUCCESS)


async def back_in_rotation(client: httpx.AsyncClient, svc: Service, *, wait: float = LITELLM_COOLDOWN_S + 5.0,
                           poll: float = DRAIN_POLL_S) -> bool:
    """Behind LiteLLM, a restarted server is back once LiteLLM sends to it again: its cooldown (started by the
    refusals while it was closed or down) has ended. True as soon as it serves a request it did not have, False
    when none came (no traffic) by the time the cooldown is surely over."""
    before = await served(client, svc)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        await asyncio.sleep(poll)
        now = await served(client, svc)
        if before is not None and now is not None and now > before:
            return True
    return False


async def drain(client: httpx.AsyncClient, svc: Service, timeout: float, emit: Emit,
                poll: float = DRAIN_POLL_S) -> tuple[int, int, float]:
    """Wait until the server has no request left (two readings in a row, so a request still on its way from the
    router is seen); returns (requests that finished, requests left at the deadline, seconds). A server without
    /metrics (not vLLM, or already down) has nothing to wait for."""
    t0 = time.monotonic()
    first: int | None = None
    zeros = 0
    left = 0
    while True:
        n = await in_flight(client, svc)
        if n is None:
            return first or 0, 0, time.monotonic() - t0
        first = n if first is None else max(first, n)
        left = n
        zeros = zeros + 1 if n == 0 else 0
        if zeros >= 2:
            return first, 0, time.monotonic() - t0
        remaining = timeout - (time.monotonic() - t0)
        if remaining <= 0:
            return first - left, left, time.monotonic() - t0
        emit(svc.node, "draining", f"draining {svc.container}: {n} request(s) left, {remaining:.0f} s left", svc.key)
        await asyncio.sleep(poll)


async def completes(client: httpx.AsyncClient, svc: Service) -> str | None:
    """None when the server answers a real one-token completion, else why not."""
    body = {"model": svc.model, "prompt": "hi", "max_tokens": 1}
    try:
        r = await client.post(f"{svc.url}/v1/completions", json=body, timeout=120)
    except httpx.HTTPError as exc:
        return f"a one-token completion failed: {type(exc).__name__}"
    return None if r.status_code == 200 else f"a one-token completion answered HTTP {r.status_code}: {r.text[:200]}"


# --- the restarts ------------------------------------------------------------------------------------------
async def rolling_restart(runner: Runner, plan: Plan, on_progress: ProgressCallback | None = None, *,
                          drain_timeout: float = DRAIN_TIMEOUT_S) -> RestartReport:
    """One server at a time: out of the router, drained, restarted, healthy and answering, back in."""
    router = router_of(plan)
    assert router is not None and router.url
    roll = _Roll(runner, plan, router, emitter(on_progress), drain_timeout)
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
        roll.client = client
        api = WorkerApi(client, router.url)
        roll.api = api if await api.answers() else None
        if roll.api is None and not gated(plan):
            roll.emit(router.node, "info", f"{router.container} has no worker API and this plan's servers no drain "
                                           "gate: each server is drained and restarted while the router still lists "
                                           "it (restart with --router as it was launched)", router.key)
        try:
            for svc in backends(plan):
                await roll.one(svc)
        finally:
            _record(roll.action, roll.report, plan, roll.t0)
    return roll.report


class _Roll:
    """One rolling restart's state: the router, its worker API (None behind LiteLLM), the report so far."""

    def __init__(self, runner: Runner, plan: Plan, router: Service, emit: Emit,
                 drain_timeout: float) -> None:
        self.runner, self.plan, self.router, self.emit, self.drain_timeout = runner, plan, router, emit, drain_timeout
        self.report = RestartReport("rolling")
        self.t0 = time.monotonic()
        self.action = f"rolling restart {plan.recipe} ({plan.topology})"
        self.client: httpx.AsyncClient
        self.api: WorkerApi | None = None
        self.held: gate.Held | None = None           # the drain gate this roll holds closed

    def fail(self, svc: Service, why: str, fix: str) -> Exception:
        from .runner import LaunchError
        others = [s.container for s in backends(self.plan) if s.key != svc.key]
        self.emit(svc.node, "failed", f"{svc.container}: {why}", svc.key)
        return LaunchError(f"rolling restart stopped at {svc.role} {svc.container} on node {svc.node}: {why}; "
                           f"{', '.join(others) or 'no other server'} still serving", node=svc.node, fix=fix)

    async def take_out(self, svc: Service) -> None:
        if self.api is None:
            if svc.drain_gate:
                await self.close(svc)
            return
        fix = f"check the router ({self.router.container} on {self.router.node}), then restart again"
        try:
            others = [u for u in await self.api.list() if u != svc.url]
            if not others:
                raise self.fail(svc, "taking it out would leave the router with no server", fix)
            self.emit(svc.node, "draining", f"taking {svc.container} out of the router", svc.key)
            audit.record(self.action, self.router.node, f"POST {self.router.url}/remove_worker?url={svc.url}")
            await self.api.remove(str(svc.url))
        except (httpx.HTTPError, RuntimeError, ValueError) as exc:
            raise self.fail(svc, f"the router's worker API failed: {exc}", fix) from None

    async def close(self, svc: Service) -> None:
        """Behind LiteLLM: close the server's drain gate, once another server is serving."""
        others = [s for s in backends(self.plan) if s.key != svc.key]
        if not any([await completes(self.client, s) is None for s in others]):
            raise self.fail(svc, "no other server answers a completion, so closing it would leave none serving",
                            "bring the other servers back first (recipe status), then restart again")
        self.emit(svc.node, "draining", f"closing {svc.container} to new requests (LiteLLM sends them to the "
                                        "others)", svc.key)
        why = await self.runner.run_step(gate.close_step(svc.node, svc.container), self.action, self.emit)
        if why is not None:
            raise self.fail(svc, f"its drain gate did not close: {why}",
                            f"check the container: docker exec {svc.container} true (on {svc.node})")
        self.held = gate.Held(self.runner, svc.node, svc.container, svc.key, self.action, self.emit)

    async def one(self, svc: Service) -> None:
        res = ServerRestart(svc.key, svc.node)
        self.report.servers.append(res)
        out_at = time.monotonic()
        try:
            await self.take_out(svc)
            res.drained, res.cut, res.drain_s = await drain(self.client, svc, self.drain_timeout, self.emit)
            if res.cut:
                self.emit(svc.node, "draining", f"drain timed out after {self.drain_timeout:g} s: stopping "
                                                f"{svc.container} with {res.cut} request(s) cut", svc.key)
            t_restart = time.monotonic()
            self.emit(svc.node, "restarting", f"restarting {svc.container}", svc.key)
            if self.held is not None:
                await self.held.let_go()          # a touch after this would close the new container
            why = await restart_one(self.runner, self.plan, svc, self.emit, self.action)
            if why is None:
                why = await completes(self.client, svc)
            res.restart_s = time.monotonic() - t_restart
            if why is not None:
                raise self.fail(svc, f"did not come back: {why}; it stays out of the router",
                                f"read its log: docker logs {svc.container} (on {svc.node})")
        except BaseException:
            # failed, cancelled or Ctrl-C between closing the gate and a new container: never left closed
            if self.held is not None:
                await asyncio.shield(self.held.reopen())
            raise
        finally:
            self.held = None
        if self.api is not None:
            try:
                await self.api.add(str(svc.url))
            except (httpx.HTTPError, RuntimeError) as exc:
                raise self.fail(svc, f"restarted, but not back in the router: {exc}",
                                f"add it by hand: curl -X POST '{self.router.url}/add_worker?url={svc.url}'") from None
            audit.record(self.action, self.router.node, f"POST {self.router.url}/add_worker?url={svc.url}")
        elif svc.drain_gate:
            self.emit(svc.node, "restarting", f"{svc.container} is up: waiting until LiteLLM sends to it again "
                                              f"(its cooldown, {LITELLM_COOLDOWN_S} s)", svc.key)
            await back_in_rotation(self.client, svc)
        res.out_s, res.ok = time.monotonic() - out_at, True
        self.emit(svc.node, "back", f"{svc.container} back in after {res.out_s:.1f} s (drained {res.drained}, "
                                    f"cut {res.cut})", svc.key)


async def restart(runner: Runner, plan: Plan, on_progress: ProgressCallback | None = None, *,
                  drain_timeout: float = DRAIN_TIMEOUT_S, all_at_once: bool = False) -> RestartReport | None:
    """`recipe restart`: rolling behind a router, graceful elsewhere; all at once (today's hard restart) on request."""
    from .runner import check_trusted
    check_trusted(plan)              # a restart runs the plan's mods and pre_exec again
    if all_at_once:
        await runner.restart(plan, on_progress)
        audit.record(f"restart {plan.recipe} ({plan.topology}) all at once", ",".join(plan.nodes),
                     "every server restarted together")
        return None
    if rolls(plan):
        return await rolling_restart(runner, plan, on_progress, drain_timeout=drain_timeout)
    return await graceful_restart(runner, plan, on_progress, drain_timeout=drain_timeout)


async def restart_one(runner: Runner, plan: Plan, svc: Service, emit: Emit, action: str) -> str | None:
    """Launch one server again from the plan and wait until it is ready; None, or why it did not come back (its
    log line). A new container, not `docker restart`: operators restart to take a new image or a changed flag,
    which a restarted container would not have."""
    from .runner import LaunchError

    steps = [*svc.stop_steps(), *relaunch_steps(plan, svc, router_of(plan))]
    for st in steps:
        why = await runner.run_step(st, action, emit)
        if why is not None:
            return f"{st.what}: {why}"
    try:
        await runner.wait_ready(plan, emit_to(emit), services=[svc])
    except LaunchError as err:
        return str(err.problem)
    return None


def relaunch_steps(plan: Plan, svc: Service, router: Service | None) -> list[Step]:
    """The launch steps that start this one server again (its node's, the router's left out)."""
    def routers(st: Step) -> bool:
        return router is not None and (st.service == router.key or any(router.container in a for a in st.argv))
    return [st for st in plan.steps if st.node == svc.node and not routers(st)]


async def graceful_restart(runner: Runner, plan: Plan, on_progress: ProgressCallback | None = None, *,
                           drain_timeout: float = DRAIN_TIMEOUT_S) -> RestartReport:
    """Every server drained (when drain_timeout > 0), then the launch restarted as a whole."""
    emit = emitter(on_progress)
    report = RestartReport("graceful")
    t0 = time.monotonic()
    if drain_timeout > 0:
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
            for svc in backends(plan):
                res = ServerRestart(svc.key, svc.node)
                res.drained, res.cut, res.drain_s = await drain(client, svc, drain_timeout, emit)
                report.servers.append(res)
    t1 = time.monotonic()
    await runner.restart(plan, on_progress)
    for res in report.servers:
        res.restart_s, res.ok = time.monotonic() - t1, True
    _record(f"graceful restart {plan.recipe} ({plan.topology})", report, plan, t0)
    return report


def _record(action: str, report: RestartReport, plan: Plan, t0: float) -> None:
    report.seconds = time.monotonic() - t0
    audit.record(action, ",".join(plan.nodes), report.line())
