"""Preflight: refuse launches known to freeze or crash DGX Spark nodes, unless --force. Pure: no I/O.

Each rule cites where the gotcha was met. Facts gathered from the nodes (OOM-guard results, image IDs,
memory) come in through `Facts`, so the rules stay testable without a cluster.

Severities: "refuse" (launch refused unless --force), "block" (refused even with --force: compromised
router releases), "warn" (shown, never refuses).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .. import severity
from ..config import ClusterConfig, NodeConfig, check_address
from ..errors import UserError
from ..placement.estimate import MemoryEstimate, estimate_plan, gib
from ..recipes import Recipe
from ..runtimes import RUNTIMES, SGLANG, VLLM, Runtime, has_flag, model_source, parallel
from . import lint_memory, lint_topology, lint_workloads
from .argv import flag_value
from .findings import PREFLIGHT_DOC as PREFLIGHT_DOC
from .findings import Facts as Facts
from .findings import Finding as Finding
from .findings import dedupe, servers, tp
from .lint_compile import _cluster_eager, _custom_ops
from .lint_container import container_options
from .plan import make_plan
from .routers import compromised_versions
from .steps import Plan

GIB = 1024 ** 3
GB10_MEMTOTAL_GIB = lint_memory.GB10_MEMTOTAL_GIB

# Published material a user can find by its title or number (the evidence `recipe lint --explain` prints).
SRC_DEEPSEEK = "the published run 'Two-Node DGX Spark Cluster: Running DeepSeek V4 Flash'"
SRC_MXFP4 = ("eugr/spark-vllm-docker recipes/openai-gpt-oss-120b.yaml: --mxfp4-layers moe,qkv,o,lm_head is "
             "solo_only (\"Only solo now\")")
SRC_MDNS = ("the published two-Spark topology runs ('Solo vs Cluster: Where Two Sparks Beat One', 'GPT-OSS-120B: "
            "Topology Benchmark on DGX Spark'): mDNS (.local) names crashed runs at c64, and they do not resolve "
            "inside containers")
SRC_LEAST_BUSY = ("'Solo vs Cluster: Where Two Sparks Beat One': least-busy over identical backends oscillates "
                  "and starves one backend (c64 decode 338 t/s vs 568 t/s with simple-shuffle)")
SRC_COMPROMISED = ("LiteLLM 1.82.7 and 1.82.8 were compromised releases (a supply-chain attack through LiteLLM's "
                   "CI, disclosed by LiteLLM)")
SRC_GUARDS = ("an OOM on a GB10's unified memory freezes the whole host (NVIDIA/open-gpu-kernel-modules#1358; "
              f"{SRC_DEEPSEEK}); the mitigations published with it: swap off, overcommit 0, "
              "container cap, min_free_kbytes 1.5 GiB, drop caches before the load (the cap holds the container's "
              "CPU side only: CUDA memory is not charged to it on a GB10, graphistry/pygraphistry PR 1671, "
              "Blackwellboy/model-serving-minefield issue 57)")
SRC_IMAGE = "eugr/spark-vllm-docker launch-cluster.sh: verify_cluster_image_consistency (same image ID on every node)"
SRC_MEMORY = ("a GB10 reports MemTotal ~121.7 GiB (leptonai/gpud#1170, Syllo/nvtop#449) and an OOM wedges it "
              f"(NVIDIA/open-gpu-kernel-modules#1358); {SRC_DEEPSEEK}: ~75 GiB loaded per node")
SRC_TP = "a GB10 node has one GPU: tensor × pipeline parallel must equal the number of nodes"


def facts_from_monitors(monitors: Mapping[str, Any], *, headroom_floor_gib: float = 8.0) -> Facts:
    """Facts from NodeMonitors (nodes/monitor.py): last tick's memory and GPUs, guard results."""
    evaluate_guards: Callable[..., Iterable[Any]] | None
    try:
        from ..nodes.guard import evaluate_guards as evaluate
        evaluate_guards = evaluate
    except ImportError:          # telemetry's guard rules not present: guards stay unknown
        evaluate_guards = None
    guards, mem, unified, boots, ticks = {}, {}, {}, {}, {}
    for name, nm in monitors.items():
        boot = getattr(getattr(nm, "info", None), "boot_id", None)
        if boot:
            boots[name] = boot
        last = getattr(nm, "last", None)
        if last is None:
            continue
        ticks[name] = last
        if last.mem is not None:
            mem[name] = last.mem
        if last.gpus:
            unified[name] = any(g.unified for g in last.gpus)
        if evaluate_guards is not None:
            guards[name] = list(evaluate_guards(last.guards, last.mem, getattr(nm, "containers", ()),
                                                nm.config.container))
    return Facts(guards=guards, mem=mem, unified=unified, headroom_floor_gib=headroom_floor_gib, boot_ids=boots,
                 ticks=ticks)


def preflight(recipe: Recipe, topology: str, nodes: Sequence[NodeConfig],
              facts: Facts | Mapping[str, Any] | None = None, *,
              overrides: Mapping[str, Any] | None = None, plan: Plan | None = None) -> list[Finding]:
    """Every rule's findings for this recipe × topology on these nodes. `facts` is a Facts, or a mapping of
    node name → NodeMonitor (the console's live monitors), or None (offline: node facts unchecked)."""
    if facts is not None and not isinstance(facts, Facts):
        facts = facts_from_monitors(facts)
    facts = facts or Facts()
    # the reader's and the planner's own words: no evidence beyond the line itself
    findings: list[Finding] = [Finding("recipe", "warn", w, "") for w in recipe.warnings]
    findings += _compromised(recipe)
    if plan is None:
        cluster = ClusterConfig(nodes=tuple(nodes), endpoints=(), source="<preflight>")
        try:
            # the plan picks its nodes from these (head first), as a launch on this cluster would
            plan = make_plan(recipe, topology, cluster, dict(overrides or {}))
        except UserError as err:
            if any(f.rule == "router_compromised" for f in findings):
                return findings          # the plan refused for the same reason
            return [*findings, Finding("plan", "refuse", str(err), "")]
    used = [n for n in nodes if n.name in plan.nodes]
    for rule in (_gpu_mem, _custom_ops, _cluster_eager, _mxfp4_lm_head, _tp_nodes, _mdns, _router, _guards,
                 _images, _memory, _model_missing, _metrics_off, container_options, _budget):
        findings.extend(rule(recipe, plan, used, facts))
    for topo_rule in lint_topology.RULES:
        findings.extend(topo_rule(plan, used, facts))
    return findings


def _budget(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    """The nodes' budgets beside what runs (launch/lint_workloads.py), as placement found them."""
    return [Finding(n.rule, n.severity, n.message, lint_workloads.SRC_BUDGET, n.fix, n.node)
            for n in lint_workloads.budget_notes(facts.placement)]


def refusals(findings: Iterable[Finding], *, force: bool = False) -> list[Finding]:
    """The findings that stop a launch: all refusing ones, or with --force only the blocking ones."""
    return [f for f in findings if f.severity == "block" or (f.severity == "refuse" and not force)]


def runtime_of(plan: Plan) -> Runtime:
    """The runtime the plan's servers run: each rule asks its flags in that runtime's words."""
    return RUNTIMES.get(plan.runtime, RUNTIMES[VLLM])


# --- rules ------------------------------------------------------------------------------------------------------

def _gpu_mem(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    """The claims of the servers on each node, summed, judged against the node's budget (lint_memory.py): MemTotal
    less the reserve less what the other workloads measurably hold — never the container's cap. Each runtime's own
    claim (SGLang's mem_fraction_static); llama.cpp claims no share up front: the memory fit judges it."""
    from ..placement.budget import node_budget, offline_budget
    runtime = runtime_of(plan)
    if not runtime.claim_fraction:
        return []
    cap_text = recipe.container_settings.memory if recipe.container_settings.gpus is not None else None
    claims: dict[str, list[lint_memory.Claim]] = {}
    ours: dict[str, set[str]] = {}
    for key, argv in plan.server_args.items():
        svc = plan.service(key)
        ours.setdefault(svc.node, set()).add(svc.container)
        if not facts.unified.get(svc.node, True):
            continue
        total_kb = getattr(facts.mem.get(svc.node), "total_kb", None)
        # the runtime's fraction of the total, or vLLM's --gpu-memory-utilization-gb: GiB, which wins over it
        claim = lint_memory.claim_of(argv, total_kb / 1048576 if total_kb else GB10_MEMTOTAL_GIB,
                                     fraction_flags=runtime.claim_fraction, gib_flags=runtime.claim_gib)
        if claim is not None:
            claims.setdefault(svc.node, []).append(claim)
    out = []
    for node, cs in claims.items():
        total_kb = getattr(facts.mem.get(node), "total_kb", None)
        total = total_kb / 1048576 if total_kb else GB10_MEMTOTAL_GIB
        tick = facts.ticks.get(node)
        if tick is not None:
            # the plan's own containers are replaced by this launch: what they hold now is not held against it
            budget = node_budget(node, tick, facts.headroom_floor_gib, exclude=ours.get(node, ()))
        else:
            budget = offline_budget(node, int(total * GIB), headroom_floor_gib=facts.headroom_floor_gib,
                                    reason="what runs on the node was not read" if total_kb else
                                    "the node was not read: a GB10 assumed, nothing held")
        got = lint_memory.judge(cs, total, budget, cap_text, bool(total_kb))
        if got and got[0] == "refuse" and facts.placement is not None:
            # the nodes were read and the launch placed beside what runs: a claim over the room is the placement's
            # one refusal (memory_budget), which counts MemAvailable too; said once, not three times
            continue
        if got:
            message, fix = got[1], got[2]
            if runtime.name == SGLANG:   # the same claim, in SGLang's words
                message = message.replace("gpu_memory_utilization", "mem_fraction_static")
                fix = fix.replace("gpu_memory_utilization", "mem_fraction_static")
            out.append(Finding("gpu_memory_utilization", got[0], message, lint_memory.SRC_BUDGET, fix, node))
    return dedupe(out)


def _mxfp4_lm_head(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    """A warning, not a refusal: the upstream recipe keeps lm_head in MXFP4 for solo only ("Only solo now"), which
    says it was not made to work with TP > 1, not that it freezes a node. A recipe whose author set TP 2 on purpose
    is theirs to run."""
    if plan.runtime != VLLM:
        return []
    out = []
    for node, argv in servers(plan):
        layers = flag_value(argv, "--mxfp4-layers") or ""
        if "lm_head" in [x.strip() for x in layers.split(",")] and tp(argv) > 1:
            out.append(Finding("mxfp4_lm_head_tp", "warn",
                               f"MXFP4 lm_head with tensor parallel {tp(argv)}: the upstream recipe runs it on one "
                               "node only; with TP > 1 it may fail to load or give wrong output (not a known freeze)",
                               SRC_MXFP4, "drop lm_head from --mxfp4-layers (e.g. moe,qkv,o) for TP>1", node))
    return dedupe(out)




def _parallel_fix(recipe: Recipe, plan: Plan, runtime: Runtime, tp: int, pp: int, want: int) -> str:
    """A fix that changes the plan: `--set KEY=N` only for the size that is wrong and only where the recipe's
    command takes it from that placeholder; else where the size really comes from (a number written in the
    command, or the arguments after --), in the runtime's own flags."""
    if (plan.topology != "cluster-tp2" and tp * pp == len(plan.nodes) and "cluster-tp2" in recipe.topologies
            and not recipe.solo_only):
        # a recipe written for parallelism over the nodes, asked for one-node servers: the topology is wrong
        return "use --topology cluster-tp2 (the recipe's parallelism spans the nodes)"
    target = {"tensor_parallel": want // pp, "pipeline_parallel": pp} if want % pp == 0 else \
        {"tensor_parallel": want, "pipeline_parallel": 1}
    have = {"tensor_parallel": tp, "pipeline_parallel": pp}
    flags = {"tensor_parallel": runtime.tp, "pipeline_parallel": runtime.pp}
    fixes = []
    for key, value in target.items():
        if have[key] == value or not flags[key]:
            continue
        flag = flags[key][0]
        command = recipe.command or ""
        from_placeholder = "{" + key + "}" in command and str(have[key]) == str(plan.params.get(key, 1))
        written = re.search(rf"(^|\s)({'|'.join(map(re.escape, flags[key]))})(\s+|=)\d", command)
        if from_placeholder:
            fixes.append(f"--set {key}={value}")
        elif written and "{" + key + "}" not in command:
            fixes.append(f"the recipe's command writes {flag} {have[key]} itself, which --set cannot change: "
                         f"write {{{key}}} there instead of the number")
        else:       # the arguments after -- come last and win
            fixes.append(f"the arguments after -- give {flag} {have[key]}: drop it, or give {value}")
    return "; ".join(fixes)


def _tp_nodes(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    out = []
    runtime = runtime_of(plan)
    for key, argv in plan.server_args.items():
        want = len(plan.nodes) if plan.topology == "cluster-tp2" else 1
        tp, pp = parallel(runtime, argv)
        if tp * pp != want:
            out.append(Finding("parallel_size", "refuse",
                               f"tensor parallel {tp} × pipeline parallel {pp} ≠ {want} GPU(s) for "
                               f"{plan.topology}", SRC_TP, _parallel_fix(recipe, plan, runtime, tp, pp, want),
                               plan.service(key).node))
    return dedupe(out)


def _mdns(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    out = []
    for n in nodes:
        try:
            check_address(n.address, None, ("nodes", n.name, "address"))
        except UserError:
            out.append(Finding("mdns_address", "refuse", f"node address {n.address!r} is an mDNS name", SRC_MDNS,
                               "write the node's IP address in the cluster file", n.name))
    for s in plan.steps:
        for a in s.argv:
            for word in re.split(r"[\s,=/:@\"']+", a):
                if word.lower().rstrip(".").endswith(".local") and len(word) > 6:
                    out.append(Finding("mdns_address", "refuse", f"command uses the mDNS name {word!r}", SRC_MDNS,
                                       "use the IP address instead", s.node))
    return dedupe(out)


def _router(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    out = []
    if plan.router == "least-busy" and plan.topology == "2x-solo":
        out.append(Finding("least_busy_identical", "refuse", "least-busy routing over identical backends",
                           SRC_LEAST_BUSY, "use --router simple-shuffle (or vllm-router)"))
    return out


def _compromised(recipe: Recipe) -> list[Finding]:
    """Checked on every recipe, router used or not: a compromised pin must not sit in a file waiting its turn."""
    out = []
    for name, impl in (("litellm", recipe.router.litellm), ("vllm_router", recipe.router.vllm_router)):
        bad = compromised_versions(impl, litellm=name == "litellm")
        if bad:
            out.append(Finding("router_compromised", "block", f"router {name} pinned to LiteLLM {bad[0]}",
                               SRC_COMPROMISED, "pin a known-good LiteLLM (e.g. 1.106.2) in sparkconsole.router.litellm"))
    return out


def _guards(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    out = []
    drops_cache = any("drop_caches" in " ".join(st.argv) for st in plan.steps)
    if recipe.container_settings.memory is None and recipe.container_settings.gpus is not None:
        out.append(Finding("oom_guards", "refuse", "the recipe starts vLLM without a container memory cap: a "
                           "runaway of its CPU side (Python, compile workers, host buffers) would take the host's "
                           "memory instead of the container being killed (the cap does not hold its GPU memory)",
                           SRC_GUARDS, "set sparkconsole.container.memory (e.g. 100g) in the recipe"))
    for n in nodes:
        results = facts.guards.get(n.name)
        if results is None:
            if facts.guards:
                out.append(Finding("oom_guards", "warn", "OOM guards unknown (no telemetry from this node)",
                                   SRC_GUARDS, None, n.name))
            continue
        for g in results:
            key = getattr(g, "key", "")
            text = f"{getattr(g, 'title', key)}: {getattr(g, 'reason', '')}".strip()
            if key == "container_cap" or (key == "page_cache" and drops_cache):
                # Before a launch the container does not exist yet: the plan's own --memory is what counts. A plan
                # that drops the page cache before the load fixes that guard itself.
                continue
            # The guard's own severity, as the dashboard and `status` draw it (severity.py): one judgement.
            sev = severity.preflight_of_guard(g)
            if sev is not None:
                out.append(Finding("oom_guards", sev, text, SRC_GUARDS, severity.guard_fix(g), n.name))
        mem = facts.mem.get(n.name)
        cap = lint_memory.size_gib(recipe.container_settings.memory)
        total = getattr(mem, "total_kb", None)
        if cap is not None and total and cap >= total / 1048576:
            out.append(Finding("oom_guards", "refuse", f"container cap {recipe.container_settings.memory} is not below "
                               f"the host's {total / 1048576:.1f} GiB: it cannot fire before the host runs out",
                               SRC_GUARDS, "lower sparkconsole.container.memory", n.name))
    return out


def _images(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    if plan.topology not in ("cluster-tp2", "disagg") or not facts.image_ids:
        return []
    out = []
    ids = {n.name: facts.image_ids.get(n.name) for n in nodes}
    for node, iid in ids.items():
        if not iid:
            out.append(Finding("image_missing", "refuse", f"image {plan.image} is not on this node", SRC_IMAGE,
                               f"sparkconsole image pull {shlex.quote(plan.image)} --node {node} --yes", node))
    present = {i for i in ids.values() if i}
    if len(present) > 1:
        detail = ", ".join(f"{k}={(v or 'absent')[:19]}" for k, v in ids.items())
        out.append(Finding("image_mismatch", "refuse", f"image {plan.image} differs between nodes ({detail})",
                           SRC_IMAGE, f"sparkconsole image pull {shlex.quote(plan.image)} --from {plan.nodes[0]} "
                                      + " ".join(f"--node {n}" for n in plan.nodes[1:]) + " --yes"))
    return out


def plan_model(plan: Plan) -> str | None:
    """What the plan's servers load (a Hub id, or a path on the node), in its runtime's words."""
    return model_source(runtime_of(plan), next(iter(plan.server_args.values()), ()))


def memory_estimates(recipe: Recipe, plan: Plan, facts: Facts) -> list[MemoryEstimate]:
    """The memory fit of every server of the plan (placement/estimate.py) from what was learned of the nodes."""
    totals = {n: int(kb) * 1024 for n, mem in facts.mem.items() if (kb := getattr(mem, "total_kb", None))}
    return estimate_plan(recipe, plan, totals, info=facts.model_info)


def _memory(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    """The weights alone over the claim (refused); weights + one full-length sequence's KV + overhead over the claim
    (refused); the claim over what the node has available now (refused, GPU nodes, when no placement judged it)."""
    out = []
    for e in memory_estimates(recipe, plan, facts):
        src = f"{SRC_MEMORY}; the model: {e.source}"
        claim = f"the claim {gib(e.claim_b)}" if e.claim_b is not None else f"the node's {gib(e.total_b)}"
        if e.weights_exceed_claim:
            out.append(Finding("weights_over_claim", "refuse",
                               f"the weights alone are {gib(e.weights_b)} on this node, over {claim}", src,
                               "claim more (gpu_memory_utilization / mem_fraction_static), use more nodes, or a "
                               "smaller model", e.node))
        elif e.fits is False:
            out.append(Finding("memory_fit", "refuse",
                               f"weights {gib(e.weights_b)} + KV for one {e.max_model_len}-token sequence "
                               f"{gib(e.kv_b)} + overhead {gib(e.overhead_b)} = {gib(e.need_b)} on this node, over "
                               f"{claim}", src, "lower max_model_len, use more nodes, or a smaller model", e.node))
        avail_kb = getattr(facts.mem.get(e.node), "available_kb", None)
        # (with the launch placed beside what runs, the placement judged the claim against MemAvailable already)
        if facts.placement is None and avail_kb is not None and e.claim_b is not None and recipe.container_settings.gpus is not None:
            spare = avail_kb / 1048576 - facts.headroom_floor_gib
            if e.claim_b / GIB > spare:
                out.append(Finding("memory_headroom", "refuse",
                                   f"the server would take {gib(e.claim_b)} but only {avail_kb / 1048576:.1f} GiB is "
                                   f"available (keeping {facts.headroom_floor_gib:g} GiB free)", SRC_MEMORY,
                                   "stop what holds the memory, drop the page cache, or claim less", e.node))
    return dedupe(out)


SRC_METRICS = ("SGLang docs (production_metrics.md): /metrics with --enable-metrics; llama.cpp tools/server: /metrics "
               "with --metrics")


SRC_HOST = "SGLang ServerArgs and llama.cpp's llama-server: --host defaults to 127.0.0.1"


def _metrics_off(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    """SGLang and llama-server publish no /metrics unless asked (the console's endpoint panel would stay empty), and
    bind 127.0.0.1 unless told otherwise (no other machine would reach them)."""
    runtime = runtime_of(plan)
    out = []
    flag = {"sglang": "--enable-metrics", "llama-cpp": "--metrics"}.get(plan.runtime)
    argvs = [argv for key, argv in plan.server_args.items() if plan.service(key).url]
    if flag is not None and not all(has_flag(argv, flag) for argv in argvs):
        out.append(Finding("metrics_off", "warn", f"{runtime.title} serves no /metrics without {flag}: the console "
                           "shows no queue, KV or token figures and the silent-stall alert cannot fire", SRC_METRICS,
                           f"add {flag} to the command"))
    if runtime.default_host and not all(has_flag(argv, "--host") for argv in argvs):
        out.append(Finding("listen_address", "refuse", f"{runtime.title} listens on {runtime.default_host} without "
                           "--host: the console, the router and every client off the node get no answer",
                           SRC_HOST,
                           "add --host {host} (0.0.0.0, or the node's address) to the command"))
    return out


SRC_MODEL = "spark-vllm-docker run-recipe.py --setup and hf-download.sh --distribute: every node needs the weights"


def _model_missing(recipe: Recipe, plan: Plan, nodes: list[NodeConfig], facts: Facts) -> list[Finding]:
    source = plan_model(plan)
    out = []
    for node in facts.model_missing:
        if node not in plan.nodes or not source:
            continue
        fix = (f"copy {source} to that node (same path)" if source.startswith(("/", "~/"))
               else f"sparkconsole model pull {shlex.quote(source)} --node {node} --yes")
        out.append(Finding("model_missing", "refuse", f"model {source} is not on this node", SRC_MODEL, fix, node))
    return out
