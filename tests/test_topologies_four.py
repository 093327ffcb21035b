"""A recipe written for four Sparks, on four test nodes: tensor parallel 4 over 127.0.0.2–.5, launched by
`sparkconsole recipe launch` over real SSH, every rank in a container on the test bed's real Docker engine, and
real tokens streamed through all four ranks.

The four "nodes" share this machine's cores (two on CI). With fewer cores than ranks, two ranks share a core:
preflight refuses that (cpu_threads_bind), so the module first checks the refusal, then launches with --force: one
launch, shared by the checks of `TestTensorParallel4` in order, the rank killed and the stop last."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest

from tests.test_topologies import names_on, stream_chat, topology_bed, watch_launch

pytestmark = pytest.mark.slow
ADDRESSES4 = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


@pytest.fixture(scope="module")
def bed4(docker_engine, testbed_base_image, vllm_env, tiny_model, vllm_router_env, litellm_env):
    with topology_bed(docker_engine, vllm_env, tiny_model, vllm_router_env, litellm_env, ADDRESSES4) as b:
        yield b


def tp4_args(bed4) -> list[str]:
    return bed4.recipe_args("-T", "cluster-tp2", "--set", "tensor_parallel=4")


@pytest.mark.timeout(900)         # the bed's set-up: four sshd nodes, the model pulled into three
def test_tensor_parallel_4_on_four_nodes_sharing_two_cores_is_refused_by_preflight(bed4):
    if len(os.sched_getaffinity(0)) >= 4:
        pytest.skip("a core for each rank: nothing to refuse")
    refused = bed4.sc("recipe", "launch", *tp4_args(bed4), "--yes")
    assert refused.returncode == 2, refused.stdout[-2000:]
    assert re.search(r"cpu_threads_bind: node1, node2, node3, node4 run CPU ranks on one machine",
                     refused.stdout + refused.stderr), refused.stdout[-3000:]
    assert all(names_on(bed4, i) == [] for i in range(4))      # refused: nothing started anywhere


class TestTensorParallel4:
    """One TP 4 launch (--force) shared by its checks, in order; the rank killed and the stop last."""

    @pytest.fixture(scope="class")
    def tp4(self, bed4):
        launch = bed4.sc("recipe", "launch", *tp4_args(bed4), "--yes", "--force")
        assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
        yield launch
        bed4.clear("tp4")

    @pytest.mark.timeout(1500)
    def test_every_rank_is_ready_with_its_rank_and_the_one_engine_runs_all_four(self, bed4, tp4):
        assert tp4.returncode == 0, tp4.stdout[-3000:] + tp4.stderr[-3000:]
        assert re.search(r"node1\s+ready\s+server ready after [\d.]+ s at " + re.escape(bed4.url(0)), tp4.stdout)
        for i in range(2, 5):
            assert re.search(rf"node{i}\s+ready\s+worker ready", tp4.stdout), tp4.stdout[-2000:]
        for i, container in enumerate(bed4.containers):
            a = bed4.engine.inspect(container)["Args"]
            assert a[a.index("--tensor-parallel-size") + 1] == "4" and a[a.index("--nnodes") + 1] == "4"
            assert a[a.index("--node-rank") + 1] == str(i) and ("--headless" in a) == (i > 0)
            assert a[a.index("--master-addr") + 1] == ADDRESSES4[0]
        assert all(names_on(bed4, i) == sorted(bed4.containers) for i in range(4))   # one engine behind all four

    def test_tokens_stream_through_all_four_ranks(self, bed4, tp4, tiny_model):
        chunks, tokens = asyncio.run(stream_chat(bed4.url(0), tiny_model.name, 16))
        assert tokens == 16 and chunks >= 16 // 4       # in pieces; a loaded machine merges some (tests/test_topologies.py)

    def test_the_console_reads_the_four_ranks_as_one_serving_launch(self, bed4, tp4):
        group, _ = asyncio.run(watch_launch(bed4, "SERVING", members=4))
        assert sorted(m.node for m in group.members) == ["node1", "node2", "node3", "node4"]
        assert {m.ranks for m in group.members} == {4}           # judged on every rank its labels count

    @pytest.mark.timeout(900)
    def test_a_killed_rank_reads_broken_in_status_and_in_the_console(self, bed4, tp4):
        bed4.engine.run(["kill", bed4.containers[2]])           # node3's rank
        deadline = time.monotonic() + 120
        while True:
            status = bed4.sc("recipe", "status", *tp4_args(bed4), timeout=120)
            if status.returncode == 1 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert status.returncode == 1 and "BROKEN" in status.stdout and "node3" in status.stdout, status.stdout
        group, events = asyncio.run(watch_launch(bed4, "BROKEN", members=4))
        assert "worker on node3" in group.reason and "every rank" in group.reason

    @pytest.mark.timeout(600)
    def test_stop_leaves_nothing_on_any_node(self, bed4, tp4):
        stop = bed4.sc("recipe", "stop", *tp4_args(bed4), "--yes", timeout=300)
        assert stop.returncode == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
        assert all(names_on(bed4, i) == [] for i in range(4))
