"""Preflight a community user can live with (issue 23 item 8, issue 37 item 2): gpu_memory_utilization judged
against the node's own budget (lint_memory.py, placement/budget.py) — MemTotal less the reserve less what the other
workloads measurably hold, never the container's cap, which on a GB10 holds vLLM's CPU side and not its CUDA memory
(graphistry/pygraphistry PR 1671; Blackwellboy/model-serving-minefield issue 57) — and custom_ops ["all"] judged by
whether the compile caches persist.

The figures: a GB10 reports ~121.7 GiB (gb10-facts.md); the reserve is the 8 GiB headroom floor + the 1.5 GiB
vm.min_free_kbytes; seed 004 ran 0.78 stable and saw 0.82 hit OOM on its nodes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkconsole.config import ClusterConfig
from sparkconsole.launch.lint import Facts, preflight
from sparkconsole.launch.lint_compile import compile_cache_mounted
from sparkconsole.launch.lint_memory import guards_in_place, judge, size_gib
from sparkconsole.launch.plan import make_plan
from sparkconsole.nodes.guard import evaluate_guards
from sparkconsole.nodes.samples import GuardInputs, Tick
from sparkconsole.placement.budget import GIB, node_budget, offline_budget
from sparkconsole.recipes import find_recipe
from tests.test_lint import GB10_MEM, GIB_KB, NODES, good_facts

SWAP_ON = GuardInputs(swaps=("/swap.img",), overcommit_memory=0, min_free_kbytes=1572864, swappiness=60)
GOOD_IN = {"swaps": [], "overcommit_memory": 0, "min_free_kbytes": 1572864, "swappiness": 10}


def mem_findings(frac, facts=None, recipe="gpt-oss-120b", topology="solo"):
    r = find_recipe(recipe)
    return [f for f in preflight(r, topology, NODES, facts, overrides={"gpu_memory_utilization": frac})
            if f.rule == "gpu_memory_utilization"]


def live(procs=(), cgroups=(), avail_gib=118.0, total_kb=GB10_MEM.total_kb):
    """A node's tick as the agent sends it: what runs there (GPU processes by container, cgroups)."""
    return Tick.from_json({"type": "tick", "time": 1.0, "mem": {"total_kb": total_kb,
                                                                 "available_kb": int(avail_gib * GIB_KB)},
                           "guards": GOOD_IN, "gpu_procs": {"read_at": 1.0, "procs": list(procs)},
                           "cgroups": list(cgroups)}, 2.0)


@pytest.mark.parametrize("frac", [0.93, 0.95])
def test_a_claim_over_the_node_budget_is_refused_whatever_the_cap(frac):
    [f] = mem_findings(frac, good_facts())
    assert f.severity == "refuse" and f"{frac * 121.7:.1f} GiB, over the node's budget of 112.2 GiB" in f.message
    assert "MemTotal 121.7 − 9.5 reserve" in f.message and "a GB10 freezes" in f.message
    assert "100g cap would not stop it (it holds vLLM's CPU side, not CUDA memory)" in f.message
    assert f.fix == "--set gpu_memory_utilization=0.78"
    assert "pygraphistry PR 1671" in f.source and "model-serving-minefield issue 57" in f.source
    # a bigger cap changes nothing: the cap does not hold the claim
    r = find_recipe("gpt-oss-120b")
    roomy = replace(r, container_settings=replace(r.container_settings, memory="118g"))
    [g] = [x for x in preflight(roomy, "solo", NODES, good_facts(), overrides={"gpu_memory_utilization": frac})
           if x.rule == "gpu_memory_utilization"]
    assert g.severity == "refuse"


@pytest.mark.parametrize("frac", [0.83, 0.85, 0.9])
def test_what_the_cap_refused_before_is_now_judged_by_the_node(frac):
    """0.85 and 0.9 were refused as "over the container's 100g cap: OOM-killed while the model loads". The cap never
    held the claim; the node's budget (112.2 GiB) does, so they are warnings now, each saying why."""
    [f] = mem_findings(frac, good_facts())
    assert f.severity == "warn" and "above 0.78 of the memory, where a published two-node run saw OOM" in f.message
    with_cpu = frac * 121.7 + 5 > 112.2
    assert ("with vLLM's own CPU side (~5 GiB)" in f.message) is with_cpu
    assert ("the budget has room (112.2 GiB)" in f.message) is not with_cpu


@pytest.mark.parametrize("frac", [0.7, 0.75, 0.78])
def test_what_seed_004_ran_stable_passes(frac):
    assert mem_findings(frac, good_facts()) == []
    assert mem_findings(frac, good_facts(), "deepseek-v4-flash", "cluster-tp2") == []


def test_what_other_workloads_hold_comes_off_the_budget():
    """An embedder holding 12 GiB of GPU memory and 2 GiB in its cgroup, and a process in no container with 4 GiB:
    a 0.78 claim that fits an empty node is refused beside them, naming each."""
    tick = live([{"pid": 1, "used_b": 12 * GIB, "container": "embedder"}, {"pid": 2, "used_b": 4 * GIB, "where": "host"}],
                [{"name": "embedder", "current_b": 2 * GIB, "max_b": 8 * GIB}])
    [f] = mem_findings(0.78, good_facts(ticks={"spark1": tick}))
    assert f.severity == "refuse" and "over the node's budget of 94.2 GiB" in f.message
    assert "− 18.0 held by other workloads (embedder 14.0, GPU processes in no container 4.0)" in f.message
    assert f.fix == "--set gpu_memory_utilization=0.73, or stop what holds the memory"
    assert mem_findings(0.75, good_facts(ticks={"spark1": tick}))[0].severity == "warn"     # + its CPU side
    assert mem_findings(0.73, good_facts(ticks={"spark1": tick})) == []


def test_the_launch_s_own_container_is_not_held_against_it():
    """A relaunch replaces the container of the same name: what it holds now is not counted."""
    tick = live([{"pid": 1, "used_b": 90 * GIB, "container": "vllm_node"}],
                [{"name": "vllm_node", "current_b": 3 * GIB}])
    assert mem_findings(0.78, good_facts(ticks={"spark1": tick})) == []
    other = live([{"pid": 1, "used_b": 90 * GIB, "container": "someone-else"}],
                 [{"name": "someone-else", "current_b": 3 * GIB}])
    assert mem_findings(0.78, good_facts(ticks={"spark1": other}))[0].severity == "refuse"


def test_a_workload_not_fully_measured_is_said():
    tick = live([], [{"name": "embedder", "reason": "no memory cgroup file (a cgroup v1 host without the memory "
                                                    "controller)"}])
    tick = replace(tick, gpu_procs=None)
    [f] = mem_findings(0.93, good_facts(ticks={"spark1": tick}))
    assert "not all of embedder's memory is measured (GPU: the node's agent sent no per-process GPU reading" in \
        f.message


def test_two_servers_on_one_node_are_summed():
    b = offline_budget("n")
    assert judge([0.4, 0.4], 121.7, b, "100g", True) is None             # 97.4 GiB + 5 fits 112.2
    sev, msg, fix = judge([0.5, 0.45], 121.7, b, "100g", True)
    assert sev == "refuse" and "0.5 + 0.45 × 121.7 GiB = 115.6 GiB for 2 servers" in msg
    assert fix == "--set gpu_memory_utilization=0.44"                    # (112.2 − 5) / 2 / 121.7
    assert judge([0.3, 0.3], 121.7, b, None, True) is None


def test_the_node_s_own_total_and_reserve_are_the_budget():
    small = replace(GB10_MEM, total_kb=int(110 * GIB_KB))
    tick = live(total_kb=int(110 * GIB_KB))
    # 0.9 × 110 = 99.0 GiB of a 100.5 GiB budget (110 − 8 − 1.5): a warning with the CPU side; 0.93 is refused
    [f] = mem_findings(0.9, good_facts(mem={"spark1": small}, ticks={"spark1": tick}))
    assert f.severity == "warn" and "× 110.0 GiB = 99.0 GiB" in f.message and "(a GB10)" not in f.message
    assert mem_findings(0.93, good_facts(mem={"spark1": small}, ticks={"spark1": tick}))[0].severity == "refuse"
    # the node's own min_free_kbytes is its reserve: a 4 GiB one takes 2.5 GiB more off
    big_reserve = replace(tick, guards=replace(tick.guards, min_free_kbytes=4 << 20))
    assert node_budget("spark1", big_reserve, 8.0).free_b == int(110 * GIB) - 12 * GIB
    # offline: a GB10, said
    [f] = mem_findings(0.93, None)
    assert "(a GB10)" in f.message and "the node was not read: a GB10 assumed" in f.message


def test_guard_state_and_sizes():
    assert guards_in_place(None) is None
    assert guards_in_place(evaluate_guards(SWAP_ON, GB10_MEM, (), "vllm_node")) is False
    assert guards_in_place(good_facts().guards["spark1"]) is True
    assert (size_gib("100g"), size_gib("512m"), size_gib("1t"), size_gib(None)) == (100.0, 0.5, 1024.0, None)


CUSTOM_ALL = ["--compilation-config", '{"cudagraph_mode":"PIECEWISE","custom_ops":["all"]}']
CACHES = ("/srv/caches/vllm:/workspace/.cache/vllm", "/srv/caches/tilelang:/workspace/.tilelang",   # node:container
          "/srv/caches/b12x:/workspace/.cache/b12x")


def custom_ops(recipe, facts=None, caches=False):
    """The custom_ops_all finding; caches: the launch mounts the node's compile caches (its default)."""
    ov = {"extra_args": CUSTOM_ALL, **({} if caches else {"no_cache_dirs": True})}
    return [f for f in preflight(recipe, "solo", NODES, facts or Facts(), overrides=ov) if f.rule == "custom_ops_all"]


def test_custom_ops_all_is_refused_without_a_persistent_compile_cache():
    [f] = custom_ops(find_recipe("llama-3.1-8b"))
    assert f.severity == "refuse" and "no persistent compile cache is mounted" in f.message
    assert "~/.cache/vllm" in f.fix and "persistent volume" in f.source


def test_with_the_compile_caches_mounted_it_is_said_when_the_compiled_path_is_safe():
    r = find_recipe("llama-3.1-8b")
    cached = replace(r, container_settings=replace(r.container_settings, volumes=CACHES))
    plan = make_plan(cached, "solo", ClusterConfig(nodes=NODES, endpoints=()), {"no_cache_dirs": True})
    assert compile_cache_mounted(plan)
    [f] = custom_ops(cached)
    assert f.severity == "warn" and "safe once they hold this model's kernels" in f.message
    # the launch's own mounts of the node's caches (the runner's, on by default) count the same
    assert compile_cache_mounted(make_plan(r, "solo", ClusterConfig(nodes=NODES, endpoints=()), {}))
    assert [f.severity for f in custom_ops(r, caches=True)] == ["warn"]
    # one cache of the three is not enough (TileLang's kernels compile during the load)
    half = replace(r, container_settings=replace(r.container_settings, volumes=CACHES[:1]))
    assert [f.severity for f in custom_ops(half)] == ["refuse"]
    # the fact, when the caller knows it, wins over the plan's volumes
    assert [f.severity for f in custom_ops(r, Facts(compile_cache_mounted=True))] == ["warn"]


def test_a_claim_in_gib_is_judged_like_a_fraction():
    # Issue 39: `--gpu-memory-utilization-gb 108` (newer vLLM, used by published recipes) passed preflight, judged
    # neither against the cap nor the budget that judge 0.85. It is an exact GiB target, which wins over the
    # fraction; the node's budget here is 112.2 GiB.
    r = find_recipe("gpt-oss-120b")

    def mem(extra, facts=None):
        return [f for f in preflight(r, "solo", NODES, facts or good_facts(), overrides={"extra_args": extra})
                if f.rule in ("gpu_memory_utilization", "memory_fit", "weights_over_claim")]
    [f] = mem(["--gpu-memory-utilization-gb", "108"])
    assert f.severity == "warn" and f.message.startswith("--gpu-memory-utilization-gb 108 = 108.0 GiB: with vLLM's "
                                                         "own CPU side (~5 GiB) it is 113.0 GiB, over the node's budget")
    assert "above 0.78 of the memory" in f.message
    assert f.fix.startswith("--gpu-memory-utilization-gb 94")            # 0.78 × 121.7 GiB, rounded down
    [f] = mem(["--gpu-memory-utilization-gb=115"])                       # over the budget itself
    assert f.severity == "refuse" and "--gpu-memory-utilization-gb 115 = 115.0 GiB, over the node's budget" in f.message
    assert mem(["--gpu-memory-utilization-gb", "90"]) == []
    # a fraction beside it is overruled, as vLLM does
    assert mem(["--gpu-memory-utilization", "0.2", "--gpu-memory-utilization-gb", "90"]) == []
    # the GiB figure is the budget the model must fit in, not the default fraction
    [f] = mem(["--gpu-memory-utilization-gb", "40"])
    assert f.rule == "weights_over_claim" and "over the claim 40.0 GiB" in f.message
