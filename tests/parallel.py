"""Running the suite on several pytest-xdist workers (pyproject's addopts: `-n auto --dist loadgroup`).

- Workers: twice the CPUs (at most 8; SPARKCONSOLE_TEST_WORKERS overrides): most tests wait on sockets, timers
  and child processes rather than compute, so two per core finish sooner than one.
- Groups: every test that needs the heavy test bed (vLLM servers, routers, the docker engine and its image,
  llama-benchy) runs on one worker, so each session fixture starts once; the network-namespace faults share
  one worker too (their address blocks are per process).
- `@pytest.mark.alone`: a test that measures timings runs with no other test in flight. Every test holds a
  shared lock while it runs; an `alone` test takes it exclusively, after announcing itself on a second lock so
  that the other workers' next tests wait for it instead of starving it.
Without xdist (`-n 0`, `-p no:xdist`) all of this is inert.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

import pytest

TESTBED_FIXTURES = {"vllm_env", "tiny_model", "vllm_pool", "vllm_server", "vllm_pair", "vllm_container", "testbed_image",
                    "testbed_base_image", "docker_engine", "vllm_router", "vllm_router_factory", "litellm_router",
                    "vllm_pd_router", "benchy"}
NETNS_MODULES = ("test_link_cut.py",)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "alone: runs with no other test in flight (timing comparisons)")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    override = os.environ.get("SPARKCONSOLE_TEST_WORKERS")
    if override:
        return int(override)
    return max(1, min(8, 2 * len(os.sched_getaffinity(0))))


@pytest.hookimpl(tryfirst=True)      # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if TESTBED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("testbed"))
        elif Path(str(item.path)).name in NETNS_MODULES:
            item.add_marker(pytest.mark.xdist_group("netns"))


def _lock_paths() -> tuple[Path, Path] | None:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    base = Path(tempfile.gettempdir()) / f"sparkconsole-tests-{run}"
    return base.with_suffix(".lock"), base.with_suffix(".intent")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    paths = _lock_paths()
    if paths is None:
        yield
        return
    alone = item.get_closest_marker("alone") is not None
    with open(paths[0], "a") as main, open(paths[1], "a") as intent:
        if alone:
            fcntl.flock(intent, fcntl.LOCK_EX)          # new tests elsewhere now wait
            fcntl.flock(main, fcntl.LOCK_EX)            # for the ones in flight to end
        else:
            fcntl.flock(intent, fcntl.LOCK_SH)          # waits while an `alone` test is queued or running
            fcntl.flock(main, fcntl.LOCK_SH)
            fcntl.flock(intent, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(main, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(intent, fcntl.LOCK_UN)
