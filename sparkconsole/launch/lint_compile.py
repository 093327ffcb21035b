"""Preflight rules on what vLLM compiles: custom_ops ["all"] and CUDA graphs across nodes (seed 004). Pure.

seed 004's two-Spark lockup came when CUDA graphs were enabled, and its cause was `custom_ops: ["all"]`: the
fusion kernels compiled (nvcc, TileLang) during the load with ~3 GiB free, and both hosts froze. PIECEWISE graphs
then ran safely, and the seed names a persistent kernel cache as what makes the compiled path usable. So
custom_ops ["all"] is refused unless the compile caches persist (and then said: safe once the cache holds the
model's kernels), and full graphs on a cluster are a warning carrying the PIECEWISE fix.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .argv import flag_value, has_flag
from .findings import Facts, Finding, dedupe, servers

if TYPE_CHECKING:
    from ..config import NodeConfig
    from ..recipes import Recipe
    from .steps import Plan

SRC_CUSTOM_OPS = ("the published run 'Two-Node DGX Spark Cluster: Running DeepSeek V4 Flash': custom_ops "
                  "[\"all\"] made TileLang/nvcc compile fusion kernels during the load, exhausting RAM and freezing "
                  "both nodes; usable only with the compiled kernels cached on a persistent volume")
SRC_EAGER = ("the same published run: its TP=2 lockup when CUDA graphs were enabled was custom_ops [\"all\"] "
             "compiling during the load (refused by custom_ops_all), and PIECEWISE graphs then ran safely; 'Solo vs "
             "Cluster: Where Two Sparks Beat One' and 'GPT-OSS-120B: Topology Benchmark on DGX Spark' ran the "
             "cluster with --enforce-eager")
# Container paths of the compile caches mounted from the node (vLLM's torch.compile cache, TileLang's kernels: the
# compiler of the published freeze; the B12X image family's CuTeDSL kernels): all must persist for custom_ops
# ["all"] to skip compiling during the load.
COMPILE_CACHES = (".cache/vllm", ".tilelang", ".cache/b12x")


def _custom_ops(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    if plan.runtime != "vllm":
        return []        # vLLM's compilation config; another runtime's command has none
    out = []
    cached = facts.compile_cache_mounted if facts.compile_cache_mounted is not None else compile_cache_mounted(plan)
    fix = "drop custom_ops and use --compilation-config '{\"cudagraph_mode\":\"PIECEWISE\"}'"
    for node, argv in servers(plan):
        ops = compilation_config(argv).get("custom_ops")
        if isinstance(ops, str):
            ops = [ops]
        if not (isinstance(ops, (list, tuple)) and any(str(o).strip().lower() == "all" for o in ops)):
            continue
        if cached:
            out.append(Finding("custom_ops_all", "warn", 'compilation config has custom_ops ["all"], with the '
                                    "compile caches on persistent volumes: safe once they hold this model's kernels "
                                    "(a launch that compiled them before); the first launch still compiles during "
                                    "the load", SRC_CUSTOM_OPS,
                                    "fill the cache once with a lower gpu_memory_utilization, or " + fix, node))
        else:
            out.append(Finding("custom_ops_all", "refuse", 'compilation config has custom_ops ["all"] and no '
                                    "persistent compile cache is mounted: the fusion kernels compile during the load",
                                    SRC_CUSTOM_OPS, fix + ", or mount the compile caches (" +
                                    ", ".join("~/" + c for c in COMPILE_CACHES) + ")", node))
    return dedupe(out)


def compile_cache_mounted(plan: Plan) -> bool:
    """Whether every server's container mounts the compile caches (COMPILE_CACHES) from the node."""
    if not plan.server_args:
        return False
    for st in plan.steps:
        if tuple(st.argv[:2]) != ("docker", "run") or not (st.service is None or st.service in plan.server_args):
            continue
        targets = [v.split(":")[1].rstrip("/") for f, v in zip(st.argv, st.argv[1:], strict=False) if f in ("-v", "--volume")
                   and v.count(":") >= 1]
        targets += [a.split("=", 1)[1].split(":")[1].rstrip("/") for a in st.argv
                    if a.startswith(("-v=", "--volume=")) and a.count(":") >= 1]
        if not all(any(t.endswith("/" + c) for t in targets) for c in COMPILE_CACHES):
            return False
    return True


def _cluster_eager(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    if plan.topology != "cluster-tp2" or plan.runtime != "vllm":
        return []
    out = []
    for node, argv in servers(plan):
        mode = str(compilation_config(argv).get("cudagraph_mode", "")).upper()
        if not has_flag(argv, "--enforce-eager") and mode != "PIECEWISE":
            out.append(Finding("cluster_cudagraphs", "warn",
                                    "cluster launch with full CUDA graphs"
                                    + (f" (cudagraph_mode {mode})" if mode else " (vLLM's default mode)")
                                    + ": PIECEWISE is the mode a published two-node run ran safely", SRC_EAGER,
                                    "--compilation-config '{\"cudagraph_mode\":\"PIECEWISE\"}' (or --enforce-eager)",
                                    node))
    return dedupe(out)


def compilation_config(argv: Sequence[str]) -> dict[str, Any]:
    """--compilation-config / -cc as JSON (or a Python literal), plus dotted -cc.key=value forms."""
    out: dict[str, Any] = {}
    raw = flag_value(argv, "--compilation-config", "-cc")
    if raw:
        out.update(_literal(raw) if isinstance(_literal(raw), dict) else {})
    for i, a in enumerate(argv):
        m = re.match(r"^(?:--compilation-config|-cc)\.([A-Za-z_]+)(?:=(.*))?$", a)
        if m:
            val = m.group(2) if m.group(2) is not None else (argv[i + 1] if i + 1 < len(argv) else "")
            out[m.group(1)] = _literal(val)
    return out


def _literal(text: str) -> Any:
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return text
