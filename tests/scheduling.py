"""Which worker runs what (tests/parallel.py's plugin asks this module): the kinds of unit (a heavy group that
starts vLLM, a `tail` test's own unit, a light test), the heavy slots' count and lock files, and the xdist
scheduler that hands the units out (GroupScheduling).

- Heavy slots: a test of a group that starts vLLM (a `testbed-*` group but the Docker group, whose containers are
  stand-ins) waits for one of a few slots (one per CPU; SPARKCONSOLE_HEAVY_SLOTS overrides), so the other workers
  go on with light tests while a few chains of vLLM launches run. Seven heavy groups on four workers once started
  up to a dozen vLLM processes at once on two cores (load average 15-47): docker commands then timed out at 30 s
  and streams at their read timeouts. The scheduler hands heavy groups to no more workers than there are slots,
  the longest to the slot free first, and light tests to the others; once no light test is left, one more slot
  opens.
- Workers held for the tail (pytest_xdist_auto_num_workers) get their first units once every heavy group has been
  handed out; a `tail` test's unit goes out once every chain has ended.
- A run keeps each test's seconds in pytest's cache (`remember`, at the run's end); the next run hands its units
  out longest first by them and expects a chain's seconds from them. A fresh clone has none: collection order and
  HEAVY_SECONDS.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

GROUPS_ENV = "SPARKCONSOLE_TEST_GROUPS"     # the controller's file of each test's group, which the workers write
OWN_GROUPS = pytest.StashKey[str]()         # the controller's own groups file (it removes it at the end)
HELD_FOR_TAIL = pytest.StashKey[int]()      # how many workers wait for the tail
TAIL = "tail"


# Seconds of tests per heavy group (the median of ci41-ci43 and warm42-43, docs/TESTBED.md): the scheduler hands
# the longest chain to the slot that will be free first, so that the last one to end is not one that waited for a
# slot behind the others, nor one that began while the other slot was about to be free.
HEAVY_SECONDS = {"testbed-docker-test_topologies": 460, "testbed-docker-test_topologies_routed": 300,
                 "testbed-docker-test_topologies_four": 140, "testbed-vllm": 105,
                 "testbed-docker-test_container_killed": 70}
# pytest's cache key of each test's seconds in the last run that ran it (a run's durations, kept by the controller
# at its end): the next run orders the light units longest first and takes a heavy group's expected seconds from
# them. A fresh clone has none: the units keep their order and HEAVY_SECONDS stands.
SECONDS_KEY = "sparkconsole/test-seconds"
# The seconds a test not yet remembered is counted for (most of the suite's tests take one or less).
UNKNOWN_SECONDS = 1.0
# The Docker group's containers are stand-in servers and routers, no vLLM: it keeps a worker and an engine of its
# own but takes no slot, so two chains of vLLM launches run beside it from the start.
UNSLOTTED = ("testbed-docker",)
# Work of minutes that takes no slot: handed out first, so it does not start when everything else is ending.
LONG_LIGHT = ("group testbed-docker", "tests/test_ux_fuzz.py::test_fuzz_long_on_the_serving_demo")


def heavy_group(group: str | None) -> bool:
    return (group or "").startswith("testbed-") and group not in UNSLOTTED


def tail_scope(scope: str) -> bool:
    """A scheduler's scope that is a `tail` test's own unit."""
    return scope.startswith(f"group {TAIL} ")


def heavy_scope(scope: str) -> bool:
    """A scheduler's scope (`group NAME`, else a node id) that is a heavy group."""
    return scope.startswith("group ") and heavy_group(scope.removeprefix("group "))


class GroupScheduling:
    """Heavy groups go to at most heavy_slots() workers at a time, the longest left to the slot free first
    (_next_chain), while light tests fill the others: a heavy group handed to a third worker would only wait there
    for a slot, holding that worker's light tests behind it (ci11: one worker waited 772 s, then ran the longest
    chain last).

    A scheduler of xdist's public `Scheduling` protocol (xdist/scheduler/protocol.py; what `DSession` calls) that
    drives its workers through `WorkerController`'s `send_runtest_some`, `shutdown` and `shutting_down`, and
    reads nothing private of xdist's (tests/test_parallel.py checks that protocol against the installed xdist).
    The work units and the hand-out follow xdist's `loadscope`: a unit is a group (`group NAME`) or a single
    test, the units ordered by size, and a worker gets its next unit once two or fewer of its tests are left.
    The workers held for the tail (pytest_xdist_auto_num_workers) get their first unit once no heavy group is left
    to hand out."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        from xdist.workermanage import parse_tx_spec_config

        self.config = config
        self.log = log.groupsched if log is not None else (lambda *args: None)
        self.numnodes = len(parse_tx_spec_config(config))
        self.collection: list[str] | None = None
        self.workqueue: dict[str, dict[str, bool]] = {}              # unit -> {node id: done}, in hand-out order
        self.assigned_work: dict = {}                                 # worker -> its units, as workqueue's
        self.registered_collections: dict = {}                        # worker -> the node ids it collected
        self.groups: dict[str, str] | None = None
        self.held_for_tail = config.stash.get(HELD_FOR_TAIL, 0)
        self.waiting: list = []                                       # workers held until the tail
        self.clock = time.monotonic
        self.free_at: dict = {}                                       # worker -> when its chains should end
        self.seconds_before = _kept_seconds(config)
        self.seconds_now: dict[str, float] = {}                      # this run's, as the workers report them

    # --- the protocol ---------------------------------------------------------------------------------------
    @property
    def nodes(self) -> list:
        return list(self.assigned_work)

    @property
    def collection_is_completed(self) -> bool:
        return len(self.registered_collections) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        if not self.collection_is_completed or self.workqueue:
            return False
        return all(pending(units) < 2 for units in self.assigned_work.values())

    @property
    def has_pending(self) -> bool:
        return bool(self.workqueue) or any(pending(units) for units in self.assigned_work.values())

    def add_node(self, node) -> None:
        assert node not in self.assigned_work
        self.assigned_work[node] = {}

    def remove_node(self, node) -> str | None:
        """A worker that ended (done, or crashed): its unfinished units go back to the queue; returns the test it
        was running, if any."""
        units = self.assigned_work.pop(node)
        crashed = next((nodeid for unit in units.values() for nodeid, done in unit.items() if not done), None)
        if crashed is None:
            return None
        self.workqueue.update(units)
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed

    def add_node_collection(self, node, collection) -> None:
        assert node in self.assigned_work
        if self.collection_is_completed:       # a worker added later: its collection must be the same
            assert self.collection
            if list(collection) != self.collection:
                self.log(f"{node.gateway.id} collected other tests than the first workers; it gets none")
                return
        self.registered_collections[node] = list(collection)

    def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
        nodeid = self.registered_collections[node][item_index]
        self.seconds_now[nodeid] = round(duration, 2)
        self.assigned_work[node][self._unit_of(nodeid)][nodeid] = True
        tail_waits = any(tail_scope(unit) for unit in self.workqueue)
        self._reschedule(node)
        self._wake_tail()
        if tail_waits and not self._chains_running():
            # the last chain ended: the tail's units go out, one per worker first, and every worker that got
            # nothing meanwhile, or sits on its last test until it knows the next, gets its two units
            self._two_units_each(sorted(self.nodes, key=lambda n: pending(self.assigned_work[n])))

    def mark_test_pending(self, item: str) -> None:
        raise NotImplementedError

    def remove_pending_tests_from_node(self, node, indices) -> None:
        raise NotImplementedError

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:       # called again: workers added since
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._same_collections():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        units: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            units.setdefault(self._unit_of(nodeid), {})[nodeid] = False
        if getattr(self.config.option, "loadscopereorder", True):     # larger units first, as loadscope does
            units = dict(sorted(units.items(), key=lambda kv: -len(kv[1])))
        if self.seconds_before:
            # longest first, as the last run timed them: a test of 18 s handed out in the run's last 20 s held its
            # end (warm43); the short ones left for the end fill the workers evenly
            units = dict(sorted(units.items(), key=lambda kv: -self._remembered(kv[1])))
        self.workqueue = units
        for _ in range(len(self.nodes) - len(self.workqueue)):     # more workers than units
            self.assigned_work.popitem()[0].shutdown()
        held = min(self.held_for_tail, len(self.nodes) - 1)
        self.waiting = self.nodes[len(self.nodes) - held:] if held > 0 else []
        for node in self.nodes:
            if node not in self.waiting:
                self._assign_work_unit(node)
        for node in self.nodes:
            self._reschedule(node)
        self._wake_tail()
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()

    # --- the hand-out -----------------------------------------------------------------------------------------
    def _unit_of(self, nodeid: str) -> str:
        if self.groups is None:
            try:
                self.groups = json.loads(Path(os.environ[GROUPS_ENV]).read_text())
            except (KeyError, OSError, ValueError):
                self.groups = {}
        group = self.groups.get(nodeid)
        return f"group {group}" if group else nodeid

    def _holds_heavy(self, node) -> bool:
        return any(heavy_scope(unit) and not all(tests.values())
                   for unit, tests in self.assigned_work.get(node, {}).items())

    def _chains_running(self) -> bool:
        return any(heavy_scope(unit) for unit in self.workqueue) or any(self._holds_heavy(n) for n in self.nodes)

    def _chain_ending(self, node) -> bool:
        """Its heavy unit has begun, and it asks for its next unit: two tests or fewer are left of it."""
        return any(heavy_scope(unit) and any(tests.values()) and not all(tests.values())
                   for unit, tests in self.assigned_work.get(node, {}).items())

    def _assign_work_unit(self, node) -> None:
        heavy = [unit for unit in self.workqueue if heavy_scope(unit)]
        later = self._chains_running()
        light = [unit for unit in self.workqueue if not heavy_scope(unit) and not (later and tail_scope(unit))]
        others = sum(self._holds_heavy(n) for n in self.nodes if n is not node)
        if heavy and not light:
            open_tail_slot(self.config)
        # A worker whose chain is ending takes the next chain itself (its slot goes on to it): given light tests
        # first, it ran two of them (35 s, warm39) between the chains while the next one waited.
        free = not self._holds_heavy(node) or self._chain_ending(node)
        if heavy and (not light or (free and others < heavy_slots())):
            unit = self._next_chain(node, heavy)
        elif light:
            unit = next((s for s in LONG_LIGHT if s in light), None) or next((s for s in light if tail_scope(s)), light[0])
        else:
            return          # only the tail's units are left, and chains still run: they are handed out when they end
        tests = self.workqueue.pop(unit)
        self.assigned_work.setdefault(node, {})[unit] = tests
        collected = self.registered_collections[node]
        node.send_runtest_some([collected.index(nodeid) for nodeid, done in tests.items() if not done])

    def _next_chain(self, node, heavy: list[str]) -> str:
        """Longest first, to the worker that will be free first: a worker asking while its chain ends takes the
        longest left only if no other chain is due to end before its own, else the next longest, which leaves the
        longest for the worker free sooner. Taking the longest at once (ci41-warm43), the topologies worker took
        the vLLM group 60-90 s before its own chain ended; the other slot, free 25-60 s sooner, got the shortest
        and sat idle for the run's last 50-70 s of chains."""
        now = self.clock()

        def due(n) -> float:
            return max(now, self.free_at.get(n, now)) if self._holds_heavy(n) else now
        mine = due(node)
        ahead = sum(due(n) < mine for n in self.nodes if n is not node and self._holds_heavy(n))
        ranked = sorted(heavy, key=lambda s: -self._expected(s))
        unit = ranked[min(ahead, len(ranked) - 1)]
        self.free_at[node] = mine + self._expected(unit)
        return unit

    def _expected(self, unit: str) -> float:
        """A heavy unit's expected seconds: the last run's, if it ran every test of it, else HEAVY_SECONDS (0 for
        a group it does not know)."""
        tests = self.workqueue.get(unit, {})
        if tests and all(t in self.seconds_before for t in tests):
            return self._remembered(tests)
        return HEAVY_SECONDS.get(unit.removeprefix("group "), 0)

    def _remembered(self, tests) -> float:
        return sum(self.seconds_before.get(t, UNKNOWN_SECONDS) for t in tests)

    def remember(self) -> None:
        """This run's seconds into pytest's cache, over the last run's (a run of some tests keeps the others')."""
        cache = getattr(self.config, "cache", None)
        if cache is not None and self.seconds_now:
            cache.set(SECONDS_KEY, {**self.seconds_before, **self.seconds_now})

    def _wake_tail(self) -> None:
        """The held workers join once every heavy group is handed out: the chains still running are the last."""
        if not self.waiting or any(heavy_scope(unit) for unit in self.workqueue):
            return
        waiting, self.waiting = self.waiting, []
        self._two_units_each([n for n in waiting if n in self.assigned_work])

    def _two_units_each(self, nodes: list) -> None:
        """Each of `nodes` (in order, one unit per round) topped up to two units, as schedule() gives every worker
        at first: an xdist worker runs a test only once it knows the next one (or is told to shut down), so a
        worker sent one single test would sit on it."""
        for node in nodes + nodes:
            self._reschedule(node)

    def _reschedule(self, node) -> None:
        if node.shutting_down or node in self.waiting:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if pending(self.assigned_work[node]) > 2:
            return
        self._assign_work_unit(node)

    def _same_collections(self) -> bool:
        (first, col), *rest = self.registered_collections.items()
        same = True
        for node, collection in rest:
            if collection == col:
                continue
            same = False
            missing, extra = sorted(set(col) - set(collection)), sorted(set(collection) - set(col))
            msg = (f"{first.gateway.id} and {node.gateway.id} collected different tests "
                   f"(only on the first: {missing[:5]}; only on the second: {extra[:5]})")
            self.log(msg)
            self.config.hook.pytest_collectreport(
                report=pytest.CollectReport(nodeid=node.gateway.id, outcome="failed", longrepr=msg, result=[]))
        return same


def pending(units: dict[str, dict[str, bool]]) -> int:
    """Tests not yet done in a worker's units."""
    return sum(not done for tests in units.values() for done in tests.values())


def _kept_seconds(config) -> dict[str, float]:
    """The last run's seconds per test from pytest's cache; what is not a test's number is left out (a cache
    written by hand or by another version orders nothing, and never stops the run)."""
    cache = getattr(config, "cache", None)
    kept = cache.get(SECONDS_KEY, {}) if cache is not None else {}
    if not isinstance(kept, dict):
        return {}
    return {k: float(v) for k, v in kept.items()
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}


def heavy_slots() -> int:
    override = os.environ.get("SPARKCONSOLE_HEAVY_SLOTS")
    return max(1, int(override)) if override else max(1, len(os.sched_getaffinity(0)))


def heavy_slot_paths(groups: Path) -> list[Path]:
    """The slots' lock files, beside the controller's groups file; one more once the tail slot is open."""
    return [Path(f"{groups}.heavy{i}") for i in range(heavy_slots() + Path(f"{groups}.tail").exists())]


def open_tail_slot(config: pytest.Config) -> None:
    """Once no light test is left to hand out, a heavy group may start on a third worker: the slots' chains wait
    on health checks, polls and sleeps, which two chains alone leave idle (ci22's last two minutes: the CPU 57-80 %
    busy, against 90-99 % while light tests ran beside them)."""
    own = config.stash.get(OWN_GROUPS, None)
    if own:
        Path(f"{own}.tail").touch()
