"""What each front end of the headless core is: the duties it takes (recording, the guard's action, notifications)
and how it watches the endpoints, named once instead of five booleans per call.

    core = Collector(cluster, RECORD, monitor_for(cluster, attach=False, history=16), say=print_line)
    core = Collector(cluster, console_role(record=True), monitor_for(cluster, attach=True), say=app._say)

Duties are held by one process at a time: a role that records takes all its duties under the cluster's writer
lock (collector/lock.py), so a collector and a console never both record, stop a container or notify. A console
(`hands_back`) holds them only while no collector runs, and gives them back when one starts (collector/duties.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..config import ClusterConfig

if TYPE_CHECKING:
    from ..nodes.monitor import ClusterMonitor


class Duty(enum.Enum):
    RECORD = "recording"          # the recorder file (one writer: collector/lock.py)
    GUARD = "guard"               # the opt-in guard's docker stop (protect.py); its warnings are everyone's
    NOTIFY = "notifications"      # webhook, ntfy, the terminal bell (notify/notifier.py)


ALL_DUTIES = frozenset(Duty)


@dataclass(frozen=True)
class Role:
    name: str                     # as the writer lock and the collector's first line name the process
    duties: frozenset[Duty]       # what it does while it holds them
    serving: bool = True          # watches endpoints at all (the cluster file's, then where launches serve)
    follows: bool = True          # polls where the launches serve (a recipe's own port, a router)
    launch_endpoints: bool = True  # starts polling for a launch even when the cluster file names no endpoint
    replay: bool = False          # a recorded past: the guard says what it would have done, nothing is followed
    hands_back: bool = False      # takes its duties only while no collector runs, and gives them back to one

    @property
    def locked(self) -> bool:
        """Its duties wait for the cluster's writer lock (it records, so they go with the recorder file)."""
        return Duty.RECORD in self.duties

    def without(self, duty: Duty) -> Role:
        return replace(self, duties=self.duties - {duty})

    def describe_duties(self) -> str:
        names = [d.value for d in Duty if d in self.duties]
        return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


# `sparkconsole record`: the cluster's collector. It waits for a console that holds the duties to hand them back.
RECORD = Role("record", ALL_DUTIES)
# The console: attached to the collector it only draws; alone it takes the collector's duties, and hands them back.
CONSOLE = Role("console", ALL_DUTIES, hands_back=True)
# `sparkconsole exporter` (and `record --exporter` reads the collector's own core): reads only; endpoints only where
# the cluster file names them, so a launch's own endpoints are not invented as series.
EXPORTER = Role("exporter", frozenset(), launch_endpoints=False)
# `sparkconsole demo --headless`: the console's duties on a simulated cluster, without its endpoints.
DEMO = Role("demo", ALL_DUTIES, serving=False)
# `console --at` and the scrub: a recorded past; the guard says what it would have done.
REPLAY = Role("replay", frozenset({Duty.GUARD}), follows=False, replay=True)
# A viewer that only reads (tests, tools): same alerts, no duty.
VIEWER = Role("viewer", frozenset())


def console_role(*, record: bool, replay: bool = False) -> Role:
    """The console's role: REPLAY on a past moment; else CONSOLE, without recording where it was not asked to."""
    if replay:
        return REPLAY
    return CONSOLE if record else CONSOLE.without(Duty.RECORD)


def monitor_for(cluster: ClusterConfig, *, attach: bool, history: int = 600) -> ClusterMonitor:
    """The one choice of monitor for a front end: attached to the cluster's collector when one runs (attach;
    collector/attach.py: its agents' lines, or our own agents while none runs), else agents of its own."""
    if attach:
        from .attach import AttachedMonitor
        return AttachedMonitor(cluster, history=history)
    from ..nodes.monitor import ClusterMonitor
    return ClusterMonitor(cluster, history=history)
