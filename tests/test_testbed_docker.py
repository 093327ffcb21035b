"""The test bed's Docker engine is a real one: it runs containers from the imported image, enforces caps."""

from __future__ import annotations

import time

import pytest

from tests.testbed.docker import DockerEngine, TestbedImage, host_mounts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plain_image(testbed_base_image: str) -> TestbedImage:
    return TestbedImage(name=testbed_base_image, mounts=host_mounts(), env=(("HOME", "/root"),))


def test_engine_answers_on_its_own_socket(docker_engine: DockerEngine) -> None:
    info = docker_engine.run(["info", "--format", "{{.DockerRootDir}} {{.Name}}"]).stdout.split()
    assert info[0].startswith(str(docker_engine.root))
    assert docker_engine.host == f"unix://{docker_engine.socket}"
    assert docker_engine.pid and docker_engine.proc.poll() is None


def test_container_runs_host_python_from_readonly_mounts(docker_engine: DockerEngine, plain_image: TestbedImage) -> None:
    argv = plain_image.run_argv("tb-py", ["python3", "-c", "import os; print(os.getpid(), os.getcwd())"],
                                memory="128m", detach=False)
    out = docker_engine.run(argv).stdout.split()
    # --init makes docker-init PID 1, so the program is not PID 1
    assert out[0] != "1"
    argv = plain_image.run_argv("tb-ro", ["sh", "-c", "touch /usr/tb-probe"], memory="128m", detach=False)
    proc = docker_engine.run(argv, check=False)
    assert proc.returncode != 0 and "Read-only file system" in proc.stderr


def test_memory_cap_is_enforced(docker_engine: DockerEngine, plain_image: TestbedImage) -> None:
    argv = plain_image.run_argv("tb-oom", ["python3", "-c", "b = bytearray(256 * 2**20); b[::4096] = b'x' * len(b[::4096])"],
                                memory="64m")
    argv[argv.index("--memory") + 1:argv.index("--memory") + 2] = ["64m", "--memory-swap", "64m"]
    since = str(int(time.time()) - 1)
    docker_engine.run(argv)
    docker_engine.run(["wait", "tb-oom"], timeout=60)
    state = docker_engine.inspect("tb-oom")
    assert state["HostConfig"]["Memory"] == 64 * 2**20
    assert state["State"]["ExitCode"] == 137, state["State"]
    # The kernel's OOM killer did it, as Docker saw: its `oom` event. The State's OOMKilled flag is that event too,
    # but when dockerd handles the exit first it can stay false (seen once in a full run; moby's known race, e.g.
    # kubernetes#19825), so the event is what is asserted, the flag only said.
    events = docker_engine.run(["events", "--since", since, "--until", str(int(time.time()) + 1), "--filter",
                                "container=tb-oom", "--filter", "event=oom", "--format", "{{.Action}}"],
                               timeout=30).stdout.split()
    assert "oom" in events, (events, state["State"])
    docker_engine.run(["rm", "-f", "tb-oom"])
