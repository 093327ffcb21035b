"""Is a launch serving? One verdict for all the containers a plan started, across its nodes.

A tensor-parallel group serves only while every rank runs: a headless worker that exits leaves its head's
container running, and the head then fails its requests or hangs in a collective. Looking at the head alone
would show a silent stall; looking at each container alone would show one red row on another node. The
verdict joins them: SERVING, STARTING, BROKEN (with the member that broke it and why), CLOSED (a server whose
drain gate is closed: healthy, but refusing new requests, with the line that opens it) or DOWN.

`judge` is pure (states in, verdict out); `Runner.health` (runner.py) reads the states over the transports.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..nodes.launches import needed_words
from . import gate
from .steps import Plan, Service

SERVING, STARTING, BROKEN, CLOSED, DOWN = "SERVING", "STARTING", "BROKEN", "CLOSED", "DOWN"
RUNNING = ("running",)
COMING = ("created", "restarting")


@dataclass(frozen=True)
class MemberState:
    service: Service
    status: str                   # running | exited | created | restarting | missing | unreachable | …
    detail: str = ""              # "exit code 137, OOM-killed"
    answers: bool | None = None   # GET url/health returned 200 (None: not asked, headless)
    why: str = ""                 # why it did not answer
    closed: bool = False          # its drain gate is closed (the health answer said so): new requests get 503

    def line(self) -> str:
        s = self.service
        state = self.status + (f" ({self.detail})" if self.detail and self.status not in RUNNING else "")
        http = "" if self.answers is None else (f"  {s.url} health {'ok' if self.answers else 'FAILING'}"
                                                + (f": {self.why}" if self.why and not self.answers else "")
                                                + (", CLOSED to new requests" if self.closed else ""))
        return f"{s.node:>12}  {s.role:<8} {s.container:<24} {state}{http}"


@dataclass(frozen=True)
class LaunchHealth:
    plan: Plan
    members: tuple[MemberState, ...]
    verdict: str
    reason: str
    fix: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == SERVING

    def render(self) -> str:
        named = self.plan.recipe if self.plan.name == self.plan.recipe else f"{self.plan.name} ({self.plan.recipe})"
        lines = [f"{named} × {self.plan.topology} on {', '.join(self.plan.nodes)}"
                 + (f"  endpoint {self.plan.endpoint}" if self.plan.endpoint else "")]
        lines += [m.line() for m in self.members]
        lines.append(f"{self.verdict}: {self.reason}" + (f" — fix: {self.fix}" if self.fix else ""))
        return "\n".join(lines)


def _group_words(plan: Plan) -> str:
    return needed_words(plan.topology) or "the endpoint serves with fewer backends, or not at all"


def judge(plan: Plan, members: tuple[MemberState, ...] | list[MemberState]) -> LaunchHealth:
    members = tuple(members)
    restart = f"sparkconsole recipe restart {plan.recipe} -T {plan.topology}"
    if all(m.status == "missing" for m in members):
        return LaunchHealth(plan, members, DOWN, "none of its containers exists",
                            f"sparkconsole recipe launch {plan.recipe} -T {plan.topology}")
    lost = [m for m in members if m.status == "unreachable"]
    if lost:
        m = lost[0]
        return LaunchHealth(plan, members, BROKEN, f"node {m.service.node} does not answer ({m.detail[:120]})",
                            "check the node and its network (sparkconsole status)")
    gone = [m for m in members if m.status not in RUNNING + COMING]
    if gone:
        m = gone[0]
        what = f"{m.service.role} on {m.service.node} {m.status}" + (f" ({m.detail})" if m.detail else "")
        others = [o for o in members if o is not m and o.status in RUNNING]
        tail = f"; {_group_words(plan)}" if others else ""
        return LaunchHealth(plan, members, BROKEN, what + tail, restart)
    if any(m.status in COMING for m in members):
        return LaunchHealth(plan, members, STARTING, "containers are starting")
    failing = [m for m in members if m.answers is False]
    if failing:
        m = failing[0]
        return LaunchHealth(plan, members, BROKEN,
                            f"{m.service.role} on {m.service.node} runs but its health check fails"
                            + (f" ({m.why})" if m.why else ""), restart)
    shut = [m for m in members if m.closed]
    if shut:
        m = shut[0]
        return LaunchHealth(plan, members, CLOSED,
                            f"{m.service.role} {m.service.container} on {m.service.node} is closed to new requests "
                            "by its drain gate (a rolling restart's): it answers them 503; it opens by itself within "
                            f"{gate.LEASE_S:g} s of the roll's last touch, or when its container restarts",
                            gate.reopen_command(m.service.node, m.service.container))
    return LaunchHealth(plan, members, SERVING, "every container runs and every endpoint answers")
