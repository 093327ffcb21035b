"""Root conftest: registers the real test bed's fixtures (tests/testbed/*) for every test, and routes the heavy
modules to the `slow` marker so `pytest -m "not slow"` stays a quick check (the README's command runs them all)."""

import os
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.parallel",
    "tests.testbed.sshd",
    "tests.testbed.docker",
    "tests.testbed.model",
    "tests.testbed.vllm",
    "tests.testbed.routers",
    "tests.testbed.benchy",
    "tests.testbed.llamacpp",
]

# Whole modules that start simulated clusters, tmux, or thousands of hypothesis cases: minutes of CPU on 2 cores.
# (test_sim_accuracy: simulated engines run at length for a scorecard, 14 CPU s.) Single tests of more than ~10 CPU s
# carry @pytest.mark.slow themselves.
HEAVY = ("tests/faults/", "tests/test_demo.py", "tests/test_sim_node.py", "tests/test_sim_http.py",
         "tests/test_sim_accuracy.py", "tests/test_matrix_e2e.py", "tests/test_tui_tmux.py", "tests/test_tui_sshd.py")


def pytest_collection_modifyitems(config, items):
    root = Path(str(config.rootpath))
    for item in items:
        rel = Path(str(item.path)).relative_to(root).as_posix() if str(item.path).startswith(str(root)) else ""
        if rel.startswith(HEAVY):
            item.add_marker(pytest.mark.slow)


# The memory estimate asks the Hub only when nothing says offline (placement/modelinfo.py): never from a test,
# nor from the commands tests start (they inherit this environment).
os.environ["HF_HUB_OFFLINE"] = "1"
