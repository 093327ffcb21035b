"""Running the suite on several pytest-xdist workers (pyproject's addopts: `-n auto --dist loadgroup`).

- Workers: three per CPU for the whole suite, a third of them held back until every heavy group has been handed
  out; four per CPU for the quick loop (at most 8; SPARKCONSOLE_TEST_WORKERS overrides, and then holds none back):
  most tests wait on sockets, timers and child processes rather than compute, so several per core finish sooner
  than one.
- Groups: the tests that need the docker engine run on one worker, those that need bare vLLM servers, routers
  or llama-benchy on another, so each session fixture of the heavy test bed starts once (the two groups share
  none); the Docker modules that launch vLLM run on workers of their own, each with its own engine; the
  network-namespace faults share one worker too (their address blocks are per process).
- Heavy slots and the hand-out (tests/scheduling.py): a test of a group that starts vLLM waits for one of a few
  slots (one per CPU), and the scheduler hands heavy groups to no more workers than there are slots, the longest
  to the slot free first, light tests to the others. A run keeps each test's seconds in pytest's cache, and the
  next one hands its units out longest first by them.
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

from tests.scheduling import GROUPS_ENV, HELD_FOR_TAIL, OWN_GROUPS, TAIL, GroupScheduling, heavy_group, heavy_slot_paths

TESTBED_FIXTURES = {"vllm_env", "tiny_model", "vllm_pool", "vllm_server", "vllm_pair",
                    "testbed_image", "testbed_base_image", "docker_engine", "vllm_router", "vllm_router_factory",
                    "litellm_router", "vllm_pd_router", "benchy"}
NETNS_MODULES = ("test_link_cut.py", "test_postmortem_link_cut.py")
# Docker modules of minutes each (vLLM containers launched one after another): each gets a worker, and with it
# a Docker engine of its own (an engine starts in under a second), instead of queueing behind the others.
DOCKER_OWN_WORKER = ("test_matrix_e2e.py", "test_container_killed.py", "test_topologies.py", "test_topologies_four.py",
                     "test_topologies_routed.py")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "alone: runs with no other test in flight (timing comparisons)")
    config.addinivalue_line("markers", "tail: runs once the vLLM chains have ended, beside light tests only")
    if not os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get(GROUPS_ENV):
        # the controller: its workers (child processes, started after this) write each test's group here
        os.environ[GROUPS_ENV] = str(Path(tempfile.gettempdir()) / f"sparkconsole-test-groups-{os.getpid()}.json")
        config.stash[OWN_GROUPS] = os.environ[GROUPS_ENV]


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(OWN_GROUPS, None)
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
    config.stash[HELD_FOR_TAIL] = max(0, workers - busy)
    return workers


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
    config.stash[_SCHEDULER] = GroupScheduling(config, log)
    return config.stash[_SCHEDULER]


_SCHEDULER = pytest.StashKey[GroupScheduling]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller keeps this run's seconds per test for the next run's order (GroupScheduling.remember)."""
    sched = session.config.stash.get(_SCHEDULER, None)
    if sched is not None:
        sched.remember()


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


def is_heavy(item: pytest.Item) -> bool:
    return heavy_group(group_of(item))


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
