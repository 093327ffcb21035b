"""Preflight a community user can live with (issue 23 item 8): gpu_memory_utilization judged from the node's own
budget (lint_memory.py) instead of a flat 0.78, and custom_ops ["all"] judged by whether the compile caches persist.

The figures are seed 004's: a GB10 reports ~121.7 GiB (gb10-facts.md), the container is capped at 100 GiB, 0.78
ran stable (94.9 GiB: 5.1 GiB left under the cap), 0.82 hit OOM (99.8 GiB: 0.2 GiB left).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkconsole.config import ClusterConfig
from sparkconsole.launch.lint import Facts, preflight
from sparkconsole.launch.lint_compile import compile_cache_mounted
from sparkconsole.launch.lint_memory import guards_in_place, judge, size_gib
from sparkconsole.launch.plan import make_plan
from sparkconsole.launch.recipe import find_recipe
from sparkconsole.nodes.guard import evaluate_guards
from sparkconsole.nodes.samples import GuardInputs
from tests.test_lint import GB10_MEM, GIB_KB, NODES, good_facts

SWAP_ON = GuardInputs(swaps=("/swap.img",), overcommit_memory=0, min_free_kbytes=1572864, swappiness=60)


def mem_findings(frac, facts=None, recipe="gpt-oss-120b", topology="solo"):
    r = find_recipe(recipe)
    return [f for f in preflight(r, topology, NODES, facts, overrides={"gpu_memory_utilization": frac})
            if f.rule == "gpu_memory_utilization"]


@pytest.mark.parametrize("frac", [0.83, 0.85, 0.9])
def test_a_claim_over_the_container_cap_is_refused_as_an_oom_kill_at_load(frac):
    [f] = mem_findings(frac, good_facts())
    assert f.severity == "refuse" and f"{frac * 121.7:.1f} GiB, over the container's 100g cap" in f.message
    assert "OOM-killed while the model loads" in f.message
    assert f.fix.startswith("--set gpu_memory_utilization=0.78")       # (100 − 5) / 121.7, rounded down
    assert "leptonai/gpud#1170" in f.source and "Running DeepSeek V4 Flash" in f.source


@pytest.mark.parametrize("frac", [0.80, 0.82])
def test_close_to_the_cap_is_a_warning_while_the_guards_hold(frac):
    [f] = mem_findings(frac, good_facts())
    assert f.severity == "warn" and "the OOM guards are in place" in f.message
    assert f"leaves {100 - frac * 121.7:.1f} GiB of the container's 100g cap" in f.message


def test_close_to_the_cap_is_refused_where_the_guards_are_not_in_place():
    facts = good_facts(guards={"spark1": evaluate_guards(SWAP_ON, GB10_MEM, (), "vllm_node")})
    [f] = mem_findings(0.82, facts)
    assert f.severity == "refuse" and "can take the host down" in f.message
    # offline (no facts): said, not refused
    [f] = mem_findings(0.82, None)
    assert f.severity == "warn" and "were not read" in f.message and "(a GB10)" in f.message


@pytest.mark.parametrize("frac", [0.7, 0.75, 0.78])
def test_what_seed_004_ran_stable_passes(frac):
    assert mem_findings(frac, good_facts()) == []
    assert mem_findings(frac, good_facts(), "deepseek-v4-flash", "cluster-tp2") == []


def test_the_node_s_own_total_is_the_budget():
    small = replace(GB10_MEM, total_kb=int(110 * GIB_KB))
    # 0.87 × 110 = 95.7 GiB: 4.3 GiB left under the cap, a warning; on a 121.7 GiB node it is over the cap
    [f] = mem_findings(0.87, good_facts(mem={"spark1": small}))
    assert f.severity == "warn" and "× 110.0 GiB = 95.7 GiB" in f.message and "(a GB10)" not in f.message
    [f] = mem_findings(0.87, good_facts())
    assert f.severity == "refuse"


def test_a_bigger_cap_takes_a_bigger_claim_and_no_cap_is_judged_against_the_host():
    r = find_recipe("gpt-oss-120b")
    roomy = replace(r, container_settings=replace(r.container_settings, memory="110g"))
    findings = preflight(roomy, "solo", NODES, good_facts(), overrides={"gpu_memory_utilization": 0.85})
    assert [f for f in findings if f.rule == "gpu_memory_utilization"] == []
    # no cap: the host keeps the headroom floor (8 GiB) and the min_free_kbytes reserve (1.5 GiB)
    assert judge(0.9, 121.7, None, None, True, 8.0, True) is None
    sev, msg, fix = judge(0.93, 121.7, None, None, True, 8.0, True)
    assert sev == "refuse" and "wedges the host" in msg and "gpu_memory_utilization=0.92" in fix


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
    # Issue 39: `--gpu-memory-utilization-gb 108` (newer vLLM, used by published recipes) passed preflight, over the
    # same 100g cap that refuses 0.85. It is an exact GiB target, which wins over the fraction.
    r = find_recipe("gpt-oss-120b")

    def mem(extra, facts=None):
        return [f for f in preflight(r, "solo", NODES, facts or good_facts(), overrides={"extra_args": extra})
                if f.rule in ("gpu_memory_utilization", "memory_fit")]
    [f] = mem(["--gpu-memory-utilization-gb", "108"])
    assert f.severity == "refuse" and "--gpu-memory-utilization-gb 108 = 108.0 GiB, over the container's 100g cap" \
        in f.message
    assert f.fix.startswith("--gpu-memory-utilization-gb 95 ")           # 100 GiB − the 5 GiB vLLM itself needs
    [f] = mem(["--gpu-memory-utilization-gb=97"])                        # 3 GiB left under the cap
    assert f.severity == "warn" and "leaves 3.0 GiB" in f.message
    assert mem(["--gpu-memory-utilization-gb", "95"]) == []
    # the GiB figure is the budget the model must fit in, not the default fraction
    [f] = mem(["--gpu-memory-utilization-gb", "40"])
    assert f.rule == "memory_fit" and "--gpu-memory-utilization-gb 40 = 40.0 GiB" in f.message
