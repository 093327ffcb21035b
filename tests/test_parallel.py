"""tests/parallel.py's scheduler (tests/scheduling.py) against the installed pytest-xdist. It implements xdist's
public `Scheduling` protocol and drives the workers through `WorkerController`'s public methods only; an xdist that changes either
fails here, by name, instead of the suite hanging or running a test twice. The hand-out itself is checked with
workers that record what they are sent (xdist's own workers are processes; the whole suite runs on them)."""

from __future__ import annotations

import inspect
import json

import pytest

xdist = pytest.importorskip("xdist")

from tests import scheduling  # noqa: E402
from tests.scheduling import GroupScheduling  # noqa: E402


def test_the_scheduler_implements_xdists_scheduling_protocol():
    from xdist.scheduler.protocol import Scheduling
    wanted = {name: member for name, member in vars(Scheduling).items() if not name.startswith("_")}
    assert wanted, "xdist.scheduler.protocol.Scheduling has no members: the protocol moved"
    for name, member in wanted.items():
        ours = getattr(GroupScheduling, name, None)
        assert ours is not None, f"xdist's Scheduling protocol now has {name}; tests/scheduling.py's scheduler lacks it"
        assert isinstance(ours, property) == isinstance(member, property), name
        if callable(member):
            assert list(inspect.signature(ours).parameters) == list(inspect.signature(member).parameters), name


def test_xdists_worker_controller_keeps_what_the_scheduler_calls():
    from xdist.workermanage import WorkerController, parse_tx_spec_config
    assert list(inspect.signature(WorkerController.send_runtest_some).parameters) == ["self", "indices"]
    assert list(inspect.signature(WorkerController.shutdown).parameters) == ["self"]
    assert isinstance(WorkerController.shutting_down, property)
    assert list(inspect.signature(parse_tx_spec_config).parameters) == ["config"]


def test_xdist_calls_the_hook_that_makes_the_scheduler():
    from xdist import newhooks
    assert list(inspect.signature(newhooks.pytest_xdist_make_scheduler).parameters) == ["config", "log"]


class Worker:
    """Records what the scheduler sends it, as xdist's WorkerController would pass it on to its process."""

    def __init__(self, name: str) -> None:
        self.name, self.sent, self.shutting_down = name, [], False
        self.gateway = type("Gateway", (), {"id": name})()

    def send_runtest_some(self, indices) -> None:
        self.sent.append(list(indices))

    def shutdown(self) -> None:
        self.shutting_down = True


class Cache(dict):
    """pytest's cache as the scheduler uses it (get with a default, set)."""

    def set(self, key, value) -> None:
        self[key] = json.loads(json.dumps(value))       # stored as JSON, as pytest's is


class Config:
    def __init__(self, workers: int) -> None:
        self.option = type("Option", (), {"loadscopereorder": True, "numprocesses": workers, "tx": [],
                                          "dist": "loadgroup"})()
        self.stash = {}
        self.cache = Cache()

    def getvalue(self, name):
        return getattr(self.option, name)


def scheduler(tmp_path, monkeypatch, groups: dict[str, str], collection: list[str], n: int, *, held: int = 0,
              clock=None, seconds: dict[str, float] | None = None):
    """A GroupScheduling over `n` recording workers, two heavy slots, the groups file the workers would write, `held`
    workers kept for the tail, its clock `clock` if given, `seconds` remembered from a last run; scheduled:
    (the scheduler, its workers)."""
    path = tmp_path / "groups.json"
    path.write_text(json.dumps(groups))
    monkeypatch.setenv(scheduling.GROUPS_ENV, str(path))
    monkeypatch.setenv("SPARKCONSOLE_HEAVY_SLOTS", "2")
    monkeypatch.setattr("xdist.workermanage.parse_tx_spec_config", lambda config: ["popen"] * n)
    config = Config(n)
    if held:
        config.stash[scheduling.HELD_FOR_TAIL] = held
    if seconds:
        config.cache.set(scheduling.SECONDS_KEY, seconds)
    sched = GroupScheduling(config)
    if clock is not None:
        sched.clock = clock
    workers = [Worker(f"gw{i}") for i in range(n)]
    for w in workers:
        sched.add_node(w)
        sched.add_node_collection(w, collection)
    assert sched.collection_is_completed
    sched.schedule()
    return sched, workers


def finish_next(sched: GroupScheduling, w: Worker, collection: list[str]) -> None:
    """The worker's next test ends, as xdist reports it."""
    nodeid = next(n for tests in sched.assigned_work[w].values() for n, done in tests.items() if not done)
    sched.mark_test_complete(w, collection.index(nodeid))


def test_heavy_groups_go_longest_first_to_the_slots_and_light_tests_to_the_other_workers(tmp_path, monkeypatch):
    groups = {f"t.py::heavy_{g}_{i}": f"testbed-docker-test_{g}" for g in ("topologies", "topologies_routed",
                                                                            "topologies_four") for i in range(2)}
    groups |= {f"t.py::docker_{i}": "testbed-docker" for i in range(3)}
    collection = [*groups, *(f"t.py::light_{i}" for i in range(6))]
    sched, workers = scheduler(tmp_path, monkeypatch, groups, collection, 4)

    def units(w: Worker) -> list[str]:
        return list(sched.assigned_work[w])
    first = [units(w)[0] for w in workers]
    # the two longest chains on two workers, the Docker group (no slot) handed out first of the light work
    assert first[:2] == ["group testbed-docker-test_topologies", "group testbed-docker-test_topologies_routed"]
    assert first[2] == "group testbed-docker"
    assert first[3].startswith("t.py::light_")
    assert sum(scheduling.heavy_scope(u) for w in workers for u in units(w)) == 2      # the slots, no more
    # every test is sent once, to the worker that holds its unit
    sent = sorted(collection[i] for w in workers for batch in w.sent for i in batch)
    assert len(sent) == len(set(sent))
    # the light tests run out: the last heavy group goes to a third worker, through the tail slot
    own = tmp_path / "own-groups"
    monkeypatch.setattr(sched.config, "stash", {scheduling.OWN_GROUPS: str(own)})
    for w in workers[2:]:
        while scheduling.pending(sched.assigned_work[w]):
            finish_next(sched, w, collection)
    assert "group testbed-docker-test_topologies_four" in units(workers[2]) + units(workers[3])
    assert own.with_name("own-groups.tail").exists()
    assert not sched.workqueue and sched.has_pending and not sched.tests_finished


def test_workers_held_for_the_tail_join_once_every_heavy_group_is_handed_out(tmp_path, monkeypatch):
    groups = {f"t.py::heavy_{g}_{i}": f"testbed-docker-test_{g}" for g in ("topologies", "topologies_routed",
                                                                            "topologies_four") for i in range(2)}
    collection = [*groups, *(f"t.py::light_{i}" for i in range(12))]
    sched, workers = scheduler(tmp_path, monkeypatch, groups, collection, 6, held=2)
    held = workers[4:]
    assert all(w.sent == [] for w in held) and all(w.sent for w in workers[:4])

    # the first chain ends a test at a time: the held workers stay idle while a heavy group (topologies_four) is
    # queued, and join once it is handed out, with light tests still left for them
    first_chain = workers[0]
    while any(scheduling.heavy_scope(u) for u in sched.workqueue):
        assert all(w.sent == [] for w in held)
        finish_next(sched, first_chain, collection)
    assert "group testbed-docker-test_topologies_four" in sched.assigned_work[first_chain]
    # each has two tests or more: an xdist worker runs a test only once it knows the next one
    assert all(sum(map(len, w.sent)) >= 2 for w in held), [w.sent for w in held]
    assert not any(scheduling.heavy_scope(u) for w in held for u in sched.assigned_work[w])
    # everything ends: every worker, held or not, is shut down and every test was sent exactly once
    while sched.has_pending:
        finish_next(sched, next(w for w in workers if scheduling.pending(sched.assigned_work[w])), collection)
    assert sched.tests_finished and all(w.shutting_down for w in workers)
    sent = sorted(collection[i] for w in workers for batch in w.sent for i in batch)
    assert sent == sorted(collection)


def test_the_tail_units_wait_for_every_chain_to_end_and_go_one_per_worker(tmp_path, monkeypatch):
    groups = {f"t.py::heavy_{i}": "testbed-docker-test_topologies" for i in range(3)}
    groups |= {f"t.py::tail_{i}": f"{scheduling.TAIL} t.py::tail_{i}" for i in range(3)}
    collection = [*groups, *(f"t.py::light_{i}" for i in range(2))]
    sched, workers = scheduler(tmp_path, monkeypatch, groups, collection, 3)
    chain = next(w for w in workers if "group testbed-docker-test_topologies" in sched.assigned_work[w])

    def tails(w: Worker) -> list[str]:
        return [u for u in sched.assigned_work[w] if scheduling.tail_scope(u)]

    # the light tests end: the other workers idle, and the tail's units stay queued while the chain runs
    for w in workers:
        while w is not chain and scheduling.pending(sched.assigned_work[w]):
            finish_next(sched, w, collection)
    assert len(sched.workqueue) == 3 and not any(tails(w) for w in workers)
    for _ in range(2):
        finish_next(sched, chain, collection)
        assert len(sched.workqueue) == 3
    finish_next(sched, chain, collection)     # the chain's last test: the tail's units go out, one per worker
    assert not sched.workqueue and [len(tails(w)) for w in workers] == [1, 1, 1]
    # every worker is told to shut down, so each runs the one test it holds (xdist runs a last test then)
    assert sched.tests_finished and all(w.shutting_down for w in workers)


def test_a_worker_whose_chain_is_ending_takes_the_next_chain_before_light_tests(tmp_path, monkeypatch):
    groups = {f"t.py::routed_{i}": "testbed-docker-test_topologies_routed" for i in range(3)}
    groups |= {f"t.py::topo_{i}": "testbed-docker-test_topologies" for i in range(5)}
    groups |= {f"t.py::four_{i}": "testbed-docker-test_topologies_four" for i in range(3)}
    collection = [*groups, *(f"t.py::light_{i}" for i in range(10))]
    sched, workers = scheduler(tmp_path, monkeypatch, groups, collection, 4)
    routed = next(w for w in workers if "group testbed-docker-test_topologies_routed" in sched.assigned_work[w])
    assert list(sched.assigned_work[routed]) == ["group testbed-docker-test_topologies_routed"]    # nothing queued
    sched.mark_test_complete(routed, collection.index("t.py::routed_0"))          # two left: it asks for more
    assert list(sched.assigned_work[routed]) == ["group testbed-docker-test_topologies_routed",
                                                 "group testbed-docker-test_topologies_four"]
    assert sum(map(len, routed.sent)) == 6 and sched.workqueue and all(
        not scheduling.heavy_scope(u) for u in sched.workqueue)


def test_the_longest_chain_left_goes_to_the_slot_that_will_be_free_first(tmp_path, monkeypatch):
    """Topologies' worker asks for its next chain while the other slot is due to end first: it takes the shorter
    chain and leaves the longer for the other (on the code before, it took the longest at once)."""
    groups = {f"t.py::topo_{i}": "testbed-docker-test_topologies" for i in range(5)}
    groups |= {f"t.py::routed_{i}": "testbed-docker-test_topologies_routed" for i in range(3)}
    groups |= {f"t.py::four_{i}": "testbed-docker-test_topologies_four" for i in range(3)}
    groups |= {f"t.py::vllm_{i}": "testbed-vllm" for i in range(3)}
    groups |= {f"t.py::killed_{i}": "testbed-docker-test_container_killed" for i in range(3)}
    collection = [*groups, *(f"t.py::light_{i}" for i in range(10))]
    now = [0.0]
    sched, workers = scheduler(tmp_path, monkeypatch, groups, collection, 4, clock=lambda: now[0])

    def holder(group: str) -> Worker:
        return next(w for w in workers if f"group {group}" in sched.assigned_work[w])
    topo, routed = holder("testbed-docker-test_topologies"), holder("testbed-docker-test_topologies_routed")
    now[0] = 200                                     # routed's chain ends first (due at 300): it takes the longest
    finish_next(sched, routed, collection)
    assert "group testbed-docker-test_topologies_four" in sched.assigned_work[routed]
    now[0] = 380                                     # topologies is due at 460, routed's slot at 300 + 140
    for _ in range(3):
        finish_next(sched, topo, collection)
    assert list(sched.assigned_work[topo])[-1] == "group testbed-docker-test_container_killed"
    assert "group testbed-vllm" in sched.workqueue
    for _ in range(4):                               # routed's last test and four's first: two left, it asks
        finish_next(sched, routed, collection)
    assert list(sched.assigned_work[routed])[-1] == "group testbed-vllm"


def test_a_run_remembers_each_tests_seconds_and_the_next_hands_out_the_longest_first(tmp_path, monkeypatch):
    groups = {f"t.py::topo_{i}": "testbed-docker-test_topologies" for i in range(2)}
    groups |= {f"t.py::routed_{i}": "testbed-docker-test_topologies_routed" for i in range(2)}
    collection = [*groups, *(f"t.py::light_{i}" for i in range(6))]
    sched, workers = scheduler(tmp_path, monkeypatch, groups, collection, 3)
    while sched.has_pending:                            # a first run: no seconds remembered, collection order
        w = next(w for w in workers if scheduling.pending(sched.assigned_work[w]))
        nodeid = next(n for tests in sched.assigned_work[w].values() for n, done in tests.items() if not done)
        sched.mark_test_complete(w, collection.index(nodeid), duration=30.0 if nodeid == "t.py::light_4" else
                                 400.0 if "routed" in nodeid else 0.5)
    sched.remember()
    seconds = sched.config.cache[scheduling.SECONDS_KEY]
    assert seconds["t.py::light_4"] == 30.0 and seconds["t.py::light_0"] == 0.5 and len(seconds) == len(collection)

    # the next run: the light test of 30 s goes out first, and the routed chain (800 s remembered, against
    # HEAVY_SECONDS' 300 for it and 460 for topologies) is taken as the longest
    sched, workers = scheduler(tmp_path, monkeypatch, groups, collection, 3, seconds=seconds)
    first = [list(sched.assigned_work[w])[0] for w in workers]
    assert first[0] == "group testbed-docker-test_topologies_routed", first
    assert first[2] == "t.py::light_4", first
    # a run of some of the tests keeps the others' seconds
    sched.mark_test_complete(workers[2], collection.index("t.py::light_4"), duration=12.0)
    sched.remember()
    assert sched.config.cache[scheduling.SECONDS_KEY] == {**seconds, "t.py::light_4": 12.0}


@pytest.mark.parametrize("kept", [[1, 2], "x", {"t.py::light_1": "30", "t.py::light_2": None, "t.py::light_3": -4}])
def test_seconds_kept_in_another_shape_order_nothing_and_stop_nothing(tmp_path, monkeypatch, kept):
    collection = [f"t.py::light_{i}" for i in range(6)]
    sched, workers = scheduler(tmp_path, monkeypatch, {}, collection, 2, seconds=kept)
    assert sched.config.cache[scheduling.SECONDS_KEY] == kept and sched.seconds_before == {}
    assert [list(sched.assigned_work[w])[0] for w in workers] == ["t.py::light_0", "t.py::light_1"]
