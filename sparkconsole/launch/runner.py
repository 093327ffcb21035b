"""Runs a plan over the node transports: launch (head first), follow each server to readiness, stop, restart.

On any failure during a launch everything it started is stopped on every node (no half cluster is left
running) and the error names the node and the log line that failed. Every node-changing command is written
to the audit log before it runs. Progress is reported as `Progress` events through a callback.

Readiness: the container is running, `GET url/health` answers 200 and `GET url/v1/models` lists the served
model; headless workers are ready while their container runs and their head is ready. Logs are followed with
`docker logs -f` through `transport.stream`, so a dying server is reported by its own last error line.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import shlex
import statistics
import time
from collections.abc import Mapping, Sequence

import httpx

from .. import audit, secrets
from ..config import ClusterConfig
from ..errors import UserError
from ..nodes.transport import CommandResult, LineStream, Transport, TransportError
from . import gate
from .health import LaunchHealth, MemberState, judge
from .logread import error_line, exit_line, known_refusal_fix
from .progress import Emit, ProgressCallback, emitter
from .readiness import ProbeFailed, generates, inference_probe, ready_timeout
from .steps import EXIT_MARK, Plan, Service, Step

STEP_TIMEOUT_S = 300.0            # docker run of a large image can take a while to create the container
READY_TIMEOUT_S = 1800.0          # a 120B model loads in minutes (seed 004: ~7 min with warm-up)
LOG_LINES_KEPT = 200


def check_trusted(plan: Plan) -> None:
    """A plan that runs something as root on someone else's word (recipes/trust.py) runs only once confirmed."""
    if plan.untrusted and not plan.trusted:
        more = f" (+{len(plan.untrusted) - 1} more)" if len(plan.untrusted) > 1 else ""
        raise LaunchError(f"not confirmed: {plan.untrusted[0]}{more}",
                          fix=f"read them in `sparkconsole recipe plan {plan.recipe}`, then confirm, or pass --trust")


class LaunchError(UserError):
    """A launch, restart or stop failed; the message names the node and the failing log line or command."""

    def __init__(self, problem: str, *, node: str | None = None, fix: str | None = None,
                 log_line: str | None = None) -> None:
        self.node = node
        self.log_line = log_line
        super().__init__(problem, fix=fix)


class _Follower:
    """Follows one service's log and answers whether it is ready, still starting, or dead (and why)."""

    def __init__(self, runner: Runner, svc: Service, emit: Emit) -> None:
        self.runner = runner
        self.svc = svc
        self.emit = emit
        self.lines: collections.deque[str] = collections.deque(maxlen=LOG_LINES_KEPT)
        self.task: asyncio.Task[None] | None = None
        self.stream: LineStream | None = None
        self._last_emit = 0.0
        self.known: str | None = None      # the first line that states a known refusal (KNOWN_REFUSALS)

    async def start(self) -> None:
        transport = self.runner.transports[self.svc.node]
        # vLLM logs to stderr: fold it into the stream, which carries stdout only.
        cmd = self.runner.node_prefix(self.svc.node) + shlex.join(self.svc.logs_argv) + " 2>&1"
        self.stream = transport.stream(cmd)
        self.task = asyncio.ensure_future(self._read(self.stream))

    async def _read(self, stream: LineStream) -> None:
        try:
            async for line in stream:
                line = secrets.redact(line.rstrip())
                self.lines.append(line)
                if self.known is None and known_refusal_fix(line):
                    self.known = line.strip()[:500]     # a root cause scrolls away under its tracebacks
                now = time.monotonic()
                if now - self._last_emit >= 0.5:      # at most two log events a second per service
                    self._last_emit = now
                    self.emit(self.svc.node, "log", line[:300], self.svc.key)
        except (TransportError, asyncio.CancelledError):
            pass

    async def close(self) -> None:
        if self.stream is not None:
            with contextlib.suppress(TimeoutError, TransportError, OSError):
                await asyncio.wait_for(self.stream.close(), 10)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # the follower is best effort
                await self.task

    async def state(self) -> tuple[str, str]:
        return await self.runner.container_state(self.svc)


class Runner:
    def __init__(self, cluster: ClusterConfig, transports: Mapping[str, Transport], *,
                 ready_timeout: float = READY_TIMEOUT_S, poll_interval: float = 1.0,
                 step_timeout: float = STEP_TIMEOUT_S, measure_router: bool = True) -> None:
        self.cluster = cluster
        self.transports = dict(transports)
        self.ready_timeout = ready_timeout
        self.poll_interval = poll_interval
        self.step_timeout = step_timeout
        self.measure_router = measure_router
        self.router_overhead_ms: float | None = None

    # --- helpers ------------------------------------------------------------------------------------------
    def node_prefix(self, node: str) -> str:
        """node.env (e.g. DOCKER_HOST of a test engine) as assignments before each command on that node."""
        try:
            env = self.cluster.node(node).env
        except KeyError:
            env = ()
        return "".join(f"{k}={shlex.quote(v)} " for k, v in env)

    def _transport(self, node: str) -> Transport:
        try:
            return self.transports[node]
        except KeyError:
            raise LaunchError(f"no connection to node {node}", node=node,
                              fix="check that the node is reachable (sparkconsole status)") from None

    async def _run(self, node: str, argv: Sequence[str] | str, *, input: bytes | None = None,
                   timeout: float | None = None) -> CommandResult:
        cmd = argv if isinstance(argv, str) else shlex.join(argv)
        return await self._transport(node).run(self.node_prefix(node) + cmd, input=input,
                                               timeout=timeout or self.step_timeout)

    async def query(self, node: str, argv: Sequence[str], *, timeout: float = 30) -> CommandResult:
        """A command that reads and changes nothing on `node` (not audited), with the node's environment."""
        return await self._run(node, argv, timeout=timeout)

    async def container_state(self, svc: Service) -> tuple[str, str]:
        """(status, detail) of a service's container: running / exited / … plus exit code and OOM flag;
        "missing" when there is no such container, "unreachable" when the node or its Docker does not answer."""
        try:
            res = await self._run(svc.node, svc.state_argv, timeout=30)
        except (TransportError, LaunchError) as exc:
            return "unreachable", str(exc)
        if res.rc != 0:
            err = " ".join(res.stderr.split())
            if "No such" in err:
                return "missing", "no such container"
            # a dropped session or a Docker daemon that does not answer: the node is out of reach
            return "unreachable", err[-300:] or f"the state query ended with exit code {res.rc}"
        parts = res.stdout.split()
        status = parts[0] if parts else "unknown"
        detail = f"exit code {parts[1]}" if len(parts) > 1 else ""
        if len(parts) > 2 and parts[2] == "true":
            detail += ", OOM-killed"
        return status, detail

    async def health(self, plan: Plan, *, http_timeout: float = 5.0) -> LaunchHealth:
        """Every member's container state and, where it serves HTTP, its health check: one verdict."""
        members = []
        async with httpx.AsyncClient(timeout=http_timeout, trust_env=False) as client:
            for svc in plan.services:
                status, detail = await self.container_state(svc)
                answers, why, closed = None, "", False
                if svc.url and status == "running":
                    try:
                        r = await client.get(svc.url + svc.health_path)
                        answers, why = r.status_code == 200, f"HTTP {r.status_code}"
                        closed = r.headers.get(gate.HEADER) == "closed"
                    except httpx.HTTPError as exc:
                        answers, why = False, type(exc).__name__
                members.append(MemberState(svc, status, detail, answers, why, closed))
        return judge(plan, members)

    async def run_step(self, step: Step, action: str, emit: Emit) -> str | None:
        """Run one step; None on success, else a one-line reason (stderr's last line)."""
        emit(step.node, "step", step.what, step.service)
        cmd = self.node_prefix(step.node) + step.shell()
        if step.change:
            audit.record(action, step.node, cmd)
        deadline = time.monotonic() + step.retry_s
        while True:
            try:
                res = await self._transport(step.node).run(cmd, input=step.input, timeout=self.step_timeout)
            except TransportError as exc:
                return str(exc)
            if res.rc == 0 and step.expect is None:
                emit(step.node, "ok", step.what, step.service)
                return None
            if res.rc == 0 and step.expect is not None:     # (rc 0 with no expect returned above)
                pattern, want = step.expect
                found = [ln.strip() for ln in res.stdout.splitlines() if re.search(pattern, ln)]
                if len(found) >= want:
                    emit(step.node, "ok", f"{step.what}: {len(found)} found ({', '.join(found)[:200]})", step.service)
                    return None
                short = f"{len(found)} of {want} found after {step.retry_s:g} s"
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(1.0)
        if res.rc == 0:
            return f"{step.what}: {short}"
        text = (res.stderr + "\n" + res.stdout).strip()
        if any(t in text for t in step.tolerate):
            emit(step.node, "ok", f"{step.what} (nothing to do)", step.service)
            return None
        if step.report_output:
            # a mod's run.sh says why it failed in its own words, on either stream
            tail = [ln.strip() for ln in (res.stdout + "\n" + res.stderr).splitlines() if ln.strip()][-4:]
            return secrets.redact(f"exit code {res.rc}: " + (" | ".join(tail) or "no output"))[:600]
        # docker ends with "Run 'docker run --help'": the error itself is the line that says so
        why = (error_line(res.stderr.splitlines())
               or f"exit code {res.rc} and no error output (was the connection to {step.node} lost?)")
        if "Unable to find image" in text:
            why = f"image not on the node, and pulling it failed ({why})"
        return secrets.redact(why)

    # --- launch -------------------------------------------------------------------------------------------
    async def launch(self, plan: Plan, on_progress: ProgressCallback | None = None, *, wait: bool = True) -> dict[str, float]:
        """Run every step in order; wait until every service is ready. Returns seconds to ready per service."""
        emit = emitter(on_progress)
        check_trusted(plan)
        started: list[Service] = []
        try:
            await self._start_all(plan, started, emit)
        except asyncio.CancelledError:
            # Interrupted (Ctrl-C, the console closing): take down what this launch had started.
            await self._cleanup(plan, started, emit)
            raise
        if not wait:
            return {}
        try:
            ready = await self.wait_ready(plan, on_progress, services=started,
                                          timeout=ready_timeout(plan.readiness, self.ready_timeout))
            await self._probe(plan, emit)
            return ready
        except LaunchError as err:
            left = await self._cleanup(plan, started, emit)
            raise LaunchError(str(err.problem) + self._cleanup_note(started, left), node=err.node, fix=err.fix,
                              log_line=err.log_line) from None
        except BaseException:
            await self._cleanup(plan, started, emit)
            raise

    async def _probe(self, plan: Plan, emit: Emit) -> None:
        """A v2 recipe's readiness: one real streamed answer from the endpoint (launch/readiness.py)."""
        r = plan.readiness
        if r is None or not r.inference or not plan.endpoint:
            return
        model = next((s.model for s in plan.services if s.url == plan.endpoint), None)
        node = next((s.node for s in plan.services if s.url == plan.endpoint), plan.nodes[0])
        if not all(generates(argv) for argv in plan.server_args.values()):
            emit(node, "info", "readiness: a pooling model answers no chat; its health and model list are the probe")
            return
        emit(node, "waiting", "readiness: one streamed chat completion (the recipe's inference probe)")
        try:
            seconds = await inference_probe(plan.endpoint, model, r)
        except ProbeFailed as exc:
            raise LaunchError(f"the server at {plan.endpoint} answers /health but did not generate: {exc}",
                              node=node, fix="read its log; or, for a model that does not chat (embeddings), set "
                                             "readiness: {inference: false} in the recipe") from None
        emit(node, "ready", f"readiness: first text after {seconds:g} s")

    async def _start_all(self, plan: Plan, started: list[Service], emit: Emit) -> None:
        for step in plan.steps:
            if step.service:
                # Counted as started before its `docker run` returns: a failed or interrupted run can still
                # leave a created container behind, and the cleanup must take it too.
                started.append(plan.service(step.service))
            why = await self.run_step(step, f"launch {plan.recipe} ({plan.topology})", emit)
            if why is not None:
                emit(step.node, "failed", f"{step.what}: {why}", step.service)
                left = await self._cleanup(plan, started, emit)
                fix = ("the mod's run.sh failed in the container: fix it (or the image it patches), or launch "
                       "without it" if step.report_output else _fix_for(why, plan))
                raise LaunchError(f"launch failed on node {step.node}: {step.what}: {why}"
                                  + self._cleanup_note(started, left), node=step.node, fix=fix)

    @staticmethod
    def _cleanup_note(started: Sequence[Service], left: Sequence[Service] = ()) -> str:
        stopped = sorted({s.node for s in started} - {s.node for s in left})
        note = f"; stopped what it had started on {', '.join(stopped)}" if stopped else ""
        if left:
            note += ("; COULD NOT STOP " + ", ".join(f"{s.container} on {s.node}" for s in left)
                     + " (run the recipe's stop once the node is back)")
        return note

    async def _cleanup(self, plan: Plan, services: Sequence[Service], emit: Emit) -> list[Service]:
        """Stop and remove `services` (last started first); returns those that could not be stopped."""
        left: list[Service] = []
        for svc in reversed(services):
            ok = True
            for st in svc.stop_steps():
                why = await self.run_step(st, f"cleanup {plan.recipe} after a failed launch", emit)
                if why is not None:
                    emit(st.node, "failed", f"{st.what}: {why}", svc.key)
                    ok = False
                    break
            if ok:
                emit(svc.node, "stopped", f"{svc.role} {svc.container} stopped", svc.key)
            elif svc not in left:
                left.append(svc)
        return left

    # --- readiness ----------------------------------------------------------------------------------------
    async def wait_ready(self, plan: Plan, on_progress: ProgressCallback | None = None, *,
                         services: Sequence[Service] | None = None, timeout: float | None = None) -> dict[str, float]:
        emit = emitter(on_progress)
        services = list(plan.services if services is None else services)
        timeout = timeout or self.ready_timeout
        followers = {s.key: _Follower(self, s, emit) for s in services}
        for f in followers.values():
            with contextlib.suppress(TransportError):
                await f.start()
        t0 = time.monotonic()
        ready: dict[str, float] = {}
        try:
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                while len(ready) < len(services):
                    for svc in services:
                        if svc.key in ready:
                            continue
                        fol = followers[svc.key]
                        status, detail = await fol.state()
                        if status == "unreachable":
                            raise LaunchError(f"lost node {svc.node} while waiting for its {svc.role}: {detail}",
                                              node=svc.node, fix="check the node and its network, then launch again")
                        if status not in ("running", "created", "restarting"):
                            await asyncio.sleep(0.3)          # let the follower catch the last lines
                            line = fol.known or error_line(list(fol.lines))
                            raise LaunchError(f"{svc.role} on node {svc.node} stopped ({status}{', ' + detail if detail else ''})"
                                              + (f": {line}" if line else ""), node=svc.node, log_line=line,
                                              fix=known_refusal_fix(line) or
                                              f"read the whole log: docker logs {svc.container} (on {svc.node})")
                        ended = exit_line(fol.lines)
                        if ended is not None:
                            line = fol.known or error_line([ln for ln in fol.lines if EXIT_MARK not in ln])
                            raise LaunchError(f"{svc.role} on node {svc.node} stopped ({ended})"
                                              + (f": {line}" if line else ""), node=svc.node, log_line=line,
                                              fix=known_refusal_fix(line) or
                                              f"read the whole log: docker logs {svc.container} (on {svc.node})")
                        if await self._answers(client, svc, plan, ready):
                            ready[svc.key] = round(time.monotonic() - t0, 1)
                            emit(svc.node, "ready", f"{svc.role} ready after {ready[svc.key]:g} s"
                                 + (f" at {svc.url}" if svc.url else ""), svc.key)
                    if len(ready) < len(services):
                        if time.monotonic() - t0 > timeout:
                            late = [s for s in services if s.key not in ready]
                            line = error_line(list(followers[late[0].key].lines))
                            raise LaunchError(f"{late[0].role} on node {late[0].node} not ready after {timeout:g} s"
                                              + (f"; last log line: {line}" if line else ""), node=late[0].node,
                                              log_line=line, fix="read its log, or raise the timeout")
                        await asyncio.sleep(self.poll_interval)
                await self._measure_router(client, plan, services, emit)
        finally:
            for f in followers.values():
                await f.close()
        return ready

    async def _answers(self, client: httpx.AsyncClient, svc: Service, plan: Plan, ready: Mapping[str, float]) -> bool:
        if svc.url is None:
            # Headless worker: ready once the head of its group is.
            heads = [s for s in plan.services if s.url and s.role == "server"]
            return bool(heads) and all(h.key in ready for h in heads)
        try:
            r = await client.get(svc.url + svc.health_path)
            if r.status_code != 200:
                return False
            if not svc.models_path:
                return True
            r = await client.get(svc.url + svc.models_path)
            if r.status_code != 200:
                return False
            ids = [m.get("id") for m in (r.json().get("data") or []) if isinstance(m, dict)]
            return bool(ids) and (svc.model is None or svc.model in ids)
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    async def _measure_router(self, client: httpx.AsyncClient, plan: Plan, services: Sequence[Service],
                              emit: Emit) -> None:
        """The router's added latency: one-token completions through the router and straight to a backend,
        alternated (so load drifts hit both alike), median of 5 each. Routers that need a key are skipped."""
        routers = [s for s in services if s.role == "router" and s.models_path]
        backends = [s for s in services if s.role not in ("router", "worker", "prefill", "decode")
                    and s.url and s.models_path]
        if not routers or not backends or not self.measure_router:
            return
        router_url, backend_url = routers[0].url, backends[0].url
        if router_url is None or backend_url is None:      # a router always has a url; the backends were picked by it
            return
        body = {"model": routers[0].model, "prompt": "hi", "max_tokens": 1}

        async def once(url: str) -> float | None:
            t = time.perf_counter()
            try:
                r = await client.post(url + "/v1/completions", json=body)
            except httpx.HTTPError:
                return None
            return (time.perf_counter() - t) * 1000 if r.status_code == 200 else None

        via, direct = [], []
        for _ in range(5):
            a, b = await once(router_url), await once(backend_url)
            if a is None or b is None:
                return
            via.append(a)
            direct.append(b)
        v, d = statistics.median(via), statistics.median(direct)
        self.router_overhead_ms = round(v - d, 2)
        emit(routers[0].node, "info", f"router adds {v - d:+.2f} ms per request (completion, max_tokens=1: "
                                      f"router {v:.2f} ms, backend {d:.2f} ms, median of 5)", routers[0].key)

    # --- stop / restart -----------------------------------------------------------------------------------
    async def stop(self, plan: Plan, on_progress: ProgressCallback | None = None) -> None:
        """Stop and remove every container of the plan, routers first, on every node; report what failed."""
        emit = emitter(on_progress)
        failures = []
        # Routers first (no traffic to dying servers), then servers in reverse launch order (workers before head).
        order = [s for s in plan.services if s.role == "router"] + \
                [s for s in reversed(plan.services) if s.role != "router"]
        for svc in order:
            emit(svc.node, "stopping", f"stopping {svc.role} {svc.container}", svc.key)
            for st in svc.stop_steps():
                why = await self.run_step(st, f"stop {plan.recipe}", emit)
                if why is not None:
                    failures.append(f"{svc.node}: {st.what}: {why}")
                    emit(st.node, "failed", f"{st.what}: {why}", svc.key)
                    break
            else:
                emit(svc.node, "stopped", f"{svc.role} {svc.container} stopped", svc.key)
        if failures:
            raise LaunchError(f"stop failed on {len(failures)} container(s): {failures[0]}",
                              node=failures[0].split(":")[0], fix="check the node, then run the stop again")

    async def restart(self, plan: Plan, on_progress: ProgressCallback | None = None) -> dict[str, float]:
        """Single-node servers restart in place (docker restart, head first); a TP group is stopped and relaunched."""
        emit = emitter(on_progress)
        if not plan.restartable_in_place:
            await self.stop(plan, on_progress)
            return await self.launch(plan, on_progress)
        for svc in plan.services:
            if svc.role == "router":
                continue
            why = await self.run_step(svc.restart_step(), f"restart {plan.recipe}", emit)
            if why is not None:
                emit(svc.node, "failed", f"restart: {why}", svc.key)
                left = await self._cleanup(plan, list(plan.services), emit)
                raise LaunchError(f"restart failed on node {svc.node}: {why}"
                                  + self._cleanup_note(plan.services, left), node=svc.node, fix=_fix_for(why, plan))
        try:
            return await self.wait_ready(plan, on_progress)
        except LaunchError as err:
            left = await self._cleanup(plan, list(plan.services), emit)
            raise LaunchError(str(err.problem) + self._cleanup_note(plan.services, left), node=err.node,
                              fix=err.fix, log_line=err.log_line) from None


def _fix_for(why: str, plan: Plan) -> str:
    low = why.lower()
    if "running" in low and ("remove" in low or "conflict" in low or "in use" in low):
        return f"a container of that name is already running: sparkconsole recipe stop {plan.recipe} --topology {plan.topology}"
    if "image not on the node" in low or "no such image" in low or "pull access denied" in low:
        return f"load the image {plan.image} on that node (docker load), or build it"
    return "read the message above; fix the node or the recipe, then launch again"
