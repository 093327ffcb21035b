"""Running the suite on several pytest-xdist workers (pyproject's addopts: `-n auto --dist loadgroup`).

- Workers: three per CPU for the whole suite, a third of them held back until every heavy group has been handed
  out; four per CPU for the quick loop (at most 8; SPARKCONSOLE_TEST_WORKERS overrides, and then holds none back):
  most tests wait on sockets, timers and child processes rather than compute, so several per core finish sooner
  than one.
- Groups: the tests that need the docker engine run on one worker, those that need bare vLLM servers, routers
  or llama-benchy on another, so each session fixture of the heavy test bed starts once (the two groups share
  none); the Docker modules that launch vLLM run on workers of their own, each with its own engine; the
  network-namespace faults share one worker too (their address blocks are per process).
- Heavy slots: a test of a group that starts vLLM (a `testbed-*` group but the Docker group, whose containers are
  stand-ins) waits for one of a few slots (one per CPU; SPARKCONSOLE_HEAVY_SLOTS overrides), so the other workers
  go on with light tests while a few chains of vLLM launches run. Seven heavy groups on four workers once started
  up to a dozen vLLM processes at once on two cores (load average 15-47): docker commands then timed out at 30 s
  and streams at their read timeouts. The scheduler (`GroupScheduling`) hands heavy groups to no more workers than
  there are slots, longest first, and light tests to the others; once no light test is left, one more slot opens.
- `@pytest.mark.tail`: a test the heaviest minutes' load upsets (a console's pilot waiting for its own screen) runs
  once every vLLM chain has ended, beside light tests only: a light machine, not a quiet one. Each is a unit of its
  own, handed out only then (side by side, so that one that hangs until its timeout holds up only its worker).
- `@pytest.mark.alone`: a timing comparison runs with no other test in flight. Every test holds a shared lock
  while it runs; an alone test takes it exclusively, after announcing itself on a second lock so that the other
  workers' next tests wait for it instead of starving it. scripts/test goes further: it runs the `alone` tests
  after all the others, in one process, when the servers the others started are gone.
- SPARKCONSOLE_TEST_TIMELINE=FILE: each test's worker, start, end, seconds spent waiting for its locks and CPU
  seconds (the worker's own and its reaped children's), one JSON line per test (where a suite run's wall time
  went: `python -m tests.timeline FILE`).
`-n 0` runs everything in one process, where all of this is inert.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import IO

import pytest

TESTBED_FIXTURES = {"vllm_env", "tiny_model", "vllm_pool", "vllm_server", "vllm_pair",
                    "testbed_image", "testbed_base_image", "docker_engine", "vllm_router", "vllm_router_factory",
                    "litellm_router", "vllm_pd_router", "benchy"}
NETNS_MODULES = ("test_link_cut.py", "test_postmortem_link_cut.py")
# Docker modules of minutes each (vLLM containers launched one after another): each gets a worker, and with it
# a Docker engine of its own (an engine starts in under a second), instead of queueing behind the others.
DOCKER_OWN_WORKER = ("test_matrix_e2e.py", "test_container_killed.py", "test_topologies.py", "test_topologies_four.py",
                     "test_topologies_routed.py")
GROUPS_ENV = "SPARKCONSOLE_TEST_GROUPS"
_OWN_GROUPS = pytest.StashKey[str]()
_HELD_FOR_TAIL = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "alone: runs with no other test in flight (timing comparisons)")
    config.addinivalue_line("markers", "tail: runs once the vLLM chains have ended, beside light tests only")
    if not os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get(GROUPS_ENV):
        # the controller: its workers (child processes, started after this) write each test's group here
        os.environ[GROUPS_ENV] = str(Path(tempfile.gettempdir()) / f"sparkconsole-test-groups-{os.getpid()}.json")
        config.stash[_OWN_GROUPS] = os.environ[GROUPS_ENV]


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(_OWN_GROUPS, None)
    if own:
        for path in (own, f"{own}.lock", f"{own}.intent", *heavy_slot_paths(Path(own)), f"{own}.tail"):
            Path(path).unlink(missing_ok=True)
        os.environ.pop(GROUPS_ENV, None)


@pytest.hookimpl(optionalhook=True)     # xdist's hooks: absent under -p no:xdist
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    override = os.environ.get("SPARKCONSOLE_TEST_WORKERS")
    if override:
        return int(override)
    cpus = len(os.sched_getaffinity(0))
    # The quick loop (-m "not slow") starts no vLLM: its tests wait on SSH, sockets and timers. On two cores four
    # workers kept them 53 % busy (89 s), six 63 % (70-72 s), eight 63-70 s.
    if "not slow" in (config.option.markexpr or ""):
        return max(1, min(8, 4 * cpus))
    # The whole suite is CPU-bound while its vLLM chains run: two workers per core then. Three throughout (ci31-ci34)
    # ended the parallel part 30-75 s sooner, but made those minutes busier: timing checks outside `alone` and a
    # gateway reload under load showed faults that two per core had not. Its last minutes are light tests that wait
    # on simulated clocks (the CPU 40-76 % busy at two per core, ci30), so the third per core joins only then. (Five
    # busy, the Docker group's nearly idle worker not counted, ran the chains' minutes at 76-92 % CPU; the LiteLLM
    # pair's router died in one such run, ci38: back to four.)
    workers, busy = max(1, min(8, 3 * cpus)), max(1, min(8, 2 * cpus))
    config.stash[_HELD_FOR_TAIL] = max(0, workers - busy)
    return workers


TAIL = "tail"


def group_of(item: pytest.Item) -> str | None:
    if item.get_closest_marker("tail") is not None:
        return f"{TAIL} {item.nodeid}"          # a group of one: a unit the scheduler knows as the tail's
    fixtures = set(getattr(item, "fixturenames", ()))
    if "docker_engine" in fixtures:
        name = Path(str(item.path)).name
        if name in DOCKER_OWN_WORKER:
            return f"testbed-docker-{name.removesuffix('.py')}"     # its own worker, so its own engine
        return "testbed-docker"       # one engine and its image; containers of vLLM and routers
    if TESTBED_FIXTURES & fixtures:
        return "testbed-vllm"         # bare vLLM servers, the routers in front of them, llama-benchy
    if Path(str(item.path)).name in NETNS_MODULES:
        return "netns"
    return None


# Seconds of tests per heavy group in a clean-clone run (ci24, docs/TESTBED.md): the scheduler starts the longest
# chains first, so that the last one to end is not one that waited for a slot behind the others.
HEAVY_SECONDS = {"testbed-docker-test_topologies_routed": 610, "testbed-docker-test_topologies": 460,
                 "testbed-docker-test_topologies_four": 220, "testbed-vllm": 130,
                 "testbed-docker-test_container_killed": 60}
# The Docker group's containers are stand-in servers and routers, no vLLM: it keeps a worker and an engine of its
# own but takes no slot, so two chains of vLLM launches run beside it from the start.
UNSLOTTED = ("testbed-docker",)
# Work of minutes that takes no slot: handed out first, so it does not start when everything else is ending.
LONG_LIGHT = ("group testbed-docker", "tests/test_ux_fuzz.py::test_fuzz_long_on_the_serving_demo")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get(GROUPS_ENV)
    if not os.environ.get("PYTEST_XDIST_WORKER") or not path:
        return
    groups = {item.nodeid: g for item in items if (g := group_of(item))}
    tmp = f"{path}.{os.environ['PYTEST_XDIST_WORKER']}"
    Path(tmp).write_text(json.dumps(groups))
    os.replace(tmp, path)          # every worker collects the same tests: the last write is as good as the first


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's own `loadgroup` reads groups from node ids that pytest 9 no longer lets a plugin change; this
    scheduler reads them from the file the workers wrote, and balances every other test one by one."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return GroupScheduling(config, log)


class GroupScheduling:
    """Heavy groups go to at most heavy_slots() workers at a time, longest first, while light tests fill the
    others: a heavy group handed to a third worker would only wait there for a slot, holding that worker's
    light tests behind it (ci11: one worker waited 772 s, then ran the longest chain last).

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
        self.held_for_tail = config.stash.get(_HELD_FOR_TAIL, 0)
        self.waiting: list = []                                       # workers held until the tail

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
        return all(_pending(units) < 2 for units in self.assigned_work.values())

    @property
    def has_pending(self) -> bool:
        return bool(self.workqueue) or any(_pending(units) for units in self.assigned_work.values())

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
        self.assigned_work[node][self._unit_of(nodeid)][nodeid] = True
        tail_waits = any(_tail_scope(unit) for unit in self.workqueue)
        self._reschedule(node)
        self._wake_tail()
        if tail_waits and not self._chains_running():
            # the last chain ended: the tail's units go out, one per worker first, and every worker that got
            # nothing meanwhile, or sits on its last test until it knows the next, gets its two units
            self._two_units_each(sorted(self.nodes, key=lambda n: _pending(self.assigned_work[n])))

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
        return any(_heavy_scope(unit) and not all(tests.values())
                   for unit, tests in self.assigned_work.get(node, {}).items())

    def _chains_running(self) -> bool:
        return any(_heavy_scope(unit) for unit in self.workqueue) or any(self._holds_heavy(n) for n in self.nodes)

    def _chain_ending(self, node) -> bool:
        """Its heavy unit has begun, and it asks for its next unit: two tests or fewer are left of it."""
        return any(_heavy_scope(unit) and any(tests.values()) and not all(tests.values())
                   for unit, tests in self.assigned_work.get(node, {}).items())

    def _assign_work_unit(self, node) -> None:
        heavy = [unit for unit in self.workqueue if _heavy_scope(unit)]
        later = self._chains_running()
        light = [unit for unit in self.workqueue if not _heavy_scope(unit) and not (later and _tail_scope(unit))]
        others = sum(self._holds_heavy(n) for n in self.nodes if n is not node)
        if heavy and not light:
            open_tail_slot(self.config)
        # A worker whose chain is ending takes the next chain itself (its slot goes on to it): given light tests
        # first, it ran two of them (35 s, warm39) between the chains while the next one waited.
        free = not self._holds_heavy(node) or self._chain_ending(node)
        if heavy and (not light or (free and others < heavy_slots())):
            unit = max(heavy, key=lambda s: HEAVY_SECONDS.get(s.removeprefix("group "), 0))
        elif light:
            unit = next((s for s in LONG_LIGHT if s in light), None) or next((s for s in light if _tail_scope(s)), light[0])
        else:
            return          # only the tail's units are left, and chains still run: they are handed out when they end
        tests = self.workqueue.pop(unit)
        self.assigned_work.setdefault(node, {})[unit] = tests
        collected = self.registered_collections[node]
        node.send_runtest_some([collected.index(nodeid) for nodeid, done in tests.items() if not done])

    def _wake_tail(self) -> None:
        """The held workers join once every heavy group is handed out: the chains still running are the last."""
        if not self.waiting or any(_heavy_scope(unit) for unit in self.workqueue):
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
        if _pending(self.assigned_work[node]) > 2:
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


def _pending(units: dict[str, dict[str, bool]]) -> int:
    """Tests not yet done in a worker's units."""
    return sum(not done for tests in units.values() for done in tests.values())


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
    own = config.stash.get(_OWN_GROUPS, None)
    if own:
        Path(f"{own}.tail").touch()


def _lock_paths() -> tuple[Path, Path] | None:
    """A worker's two lock files, beside the controller's groups file (removed with it); None outside xdist."""
    groups = os.environ.get(GROUPS_ENV)
    if not os.environ.get("PYTEST_XDIST_WORKER") or not groups:
        return None
    return Path(f"{groups}.lock"), Path(f"{groups}.intent")


class _Locks:
    """This worker's handles on the two lock files (a shared/exclusive pair with writer preference)."""

    def __init__(self, paths: tuple[Path, Path]) -> None:
        self.main, self.intent = open(paths[0], "a"), open(paths[1], "a")

    def share(self) -> None:
        fcntl.flock(self.intent, fcntl.LOCK_SH)          # waits while an alone test is queued or running
        fcntl.flock(self.main, fcntl.LOCK_SH)
        fcntl.flock(self.intent, fcntl.LOCK_UN)

    def exclusive(self) -> None:
        fcntl.flock(self.intent, fcntl.LOCK_EX)          # new tests elsewhere now wait
        fcntl.flock(self.main, fcntl.LOCK_EX)            # for the ones in flight to end

    def release(self) -> None:
        fcntl.flock(self.main, fcntl.LOCK_UN)
        fcntl.flock(self.intent, fcntl.LOCK_UN)


class _HeavySlot:
    """One of the slots' lock files (heavy_slot_paths), held while a heavy test runs on this worker."""

    def __init__(self, groups: Path) -> None:
        self.groups = groups
        self.held: IO[str] | None = None

    def take(self) -> None:
        while True:
            for path in heavy_slot_paths(self.groups):      # read each round: the tail slot opens meanwhile
                f = open(path, "a")
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                self.held = f
                return
            time.sleep(0.5)

    def give_back(self) -> None:
        if self.held is not None:
            self.held.close()           # closing the file releases its lock
            self.held = None


_OUTCOME = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    if report.outcome != "passed" and _OUTCOME not in item.stash:      # the first that did not pass says it
        item.stash[_OUTCOME] = report.outcome if report.when == "call" else f"{report.outcome} in {report.when}"
    return report


_locks: _Locks | None = None
_slot: _HeavySlot | None = None


def _heavy_group(group: str | None) -> bool:
    return (group or "").startswith("testbed-") and group not in UNSLOTTED


def is_heavy(item: pytest.Item) -> bool:
    return _heavy_group(group_of(item))


def _tail_scope(scope: str) -> bool:
    """A scheduler's scope that is a `tail` test's own unit."""
    return scope.startswith(f"group {TAIL} ")


def _heavy_scope(scope: str) -> bool:
    """A scheduler's scope (`group NAME`, else a node id) that is a heavy group."""
    return scope.startswith("group ") and _heavy_group(scope.removeprefix("group "))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    global _locks, _slot
    paths = _lock_paths()
    if paths is None:
        yield
        return
    asked = time.time()
    if _locks is None:
        _locks = _Locks(paths)
        _slot = _HeavySlot(Path(os.environ[GROUPS_ENV]))
    assert _slot is not None
    alone = item.get_closest_marker("alone") is not None
    if not alone and is_heavy(item):
        _slot.take()        # before the shared lock: an alone test, which takes no slot, never waits on one
    if alone:
        _locks.exclusive()
    else:
        _locks.share()
    started, cpu = time.time(), _cpu_seconds()
    try:
        yield
    finally:
        _locks.release()
        _slot.give_back()
        _note_timeline(item, asked, started, _cpu_seconds() - cpu)


def _cpu_seconds() -> float:
    """This worker's CPU so far, its own and that of the child processes it has reaped (a test's CLI runs and
    simulated nodes; not the containers, which are the Docker engine's)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _note_timeline(item: pytest.Item, asked: float, started: float, cpu: float) -> None:
    path = os.environ.get("SPARKCONSOLE_TEST_TIMELINE")
    if not path:
        return
    line = json.dumps({"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER"), "group": group_of(item),
                       "waited": round(started - asked, 2), "start": round(started, 2), "end": round(time.time(), 2),
                       "cpu": round(cpu, 2), "outcome": item.stash.get(_OUTCOME, "passed")})
    with open(path, "a") as f:      # one short append per test: whole lines from every worker
        f.write(line + "\n")
