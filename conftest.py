"""Root conftest: registers the real test bed's fixtures (tests/testbed/*) for every test."""

pytest_plugins = [
    "tests.testbed.sshd",
    "tests.testbed.docker",
    "tests.testbed.model",
    "tests.testbed.vllm",
    "tests.testbed.routers",
    "tests.testbed.benchy",
]
