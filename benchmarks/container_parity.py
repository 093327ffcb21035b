"""Container parity: each node's `docker run` and mod steps, as spark-vllm-docker's own launch-cluster.sh would run
them, against `sparkconsole recipe plan` (benchmarks/runner_parity.py runs it for every recipe it compares;
docs/RECIPES_PARITY.md, "The container"). Both launches run with stand-ins (benchmarks/container_launch.py).

Per node, both `docker run`s are read into aspects (privileged, capabilities, devices, ulimits, ipc/shm, memory,
pids, gpus, network, name, entrypoint, each `-e` variable, each `-v` target, labels, the command), and the mod
steps into: which mods ran (in order), from which source, how many files, and whether all ran before the node's
server started. Each aspect is the same, a listed deliberate difference (DELIBERATE: its reason), or different.
"""

from __future__ import annotations

import collections
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# what runner_parity.py needs of the launches, through this module
from container_launch import (  # noqa: F401
    ETH_IF,
    EXPORTED,
    IB_IF,
    Call,
    Launch,
    LaunchSandbox,
    plan_mod_copies,
    plan_steps,
    run_plan,
    run_runner_launch,
    runner_node,
    write_env_file,
)

GATE_MARK = "sparkconsole-mods-gate"
RELEASE_MARK = ".sparkconsole-mods-applied"


# --- each node's container, read into aspects -------------------------------------------------------------------

NO_VALUE = {"-d", "--detach", "--rm", "--privileged", "--init", "-i", "-t", "-it", "--interactive", "--tty",
            "--read-only", "-P", "--publish-all", "--oom-kill-disable"}
ALIAS = {"-e": "--env", "-v": "--volume", "-l": "--label", "-p": "--publish", "--detach": "-d", "-w": "--workdir",
         "-u": "--user", "-m": "--memory"}
SINGLE = {"--ipc", "--shm-size", "--memory", "--memory-swap", "--pids-limit", "--gpus", "--network", "--name",
          "--entrypoint", "--workdir", "--user", "--runtime"}


def run_aspects(args: Sequence[str]) -> dict[str, str]:
    """`docker run`'s arguments (after `run`) as aspect → value: one aspect per option, per `-e` variable and per
    `-v` target; list options (capabilities, devices, labels, …) sorted."""
    out: dict[str, str] = {}
    lists: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-"):
            break
        if a.startswith("--") and "=" in a:
            name, _, value = a.partition("=")
            i += 1
        elif a in NO_VALUE:
            name, value = a, "yes"
            i += 1
        else:
            name, value = a, (args[i + 1] if i + 1 < len(args) else "")
            i += 2
        name = ALIAS.get(name, name)
        if name == "--env":
            k, eq, v = value.partition("=")
            out[f"env {k}"] = v if eq else "(by reference)"
        elif name == "--volume":
            src, _, dst = value.partition(":")
            dst, _, opts = dst.partition(":")
            out[f"volume {dst}"] = src + (f" ({opts})" if opts else "")
        elif name == "--ulimit":
            k, _, v = value.partition("=")
            out[f"ulimit {k}"] = v
        elif name in SINGLE or name in NO_VALUE:
            out[name.lstrip("-")] = value
        else:
            lists.setdefault(name.lstrip("-"), []).append(value)
    for k, vs in lists.items():
        out[k] = " ".join(sorted(vs))
    if i < len(args):
        out["image"] = args[i]
        out["command"] = command_summary(args[i + 1:])
    return out


def command_summary(cmd: Sequence[str]) -> str:
    """The container's main process, in short: the vLLM argv itself is compared in the vLLM-command table."""
    if GATE_MARK in cmd:
        rest = list(cmd[cmd.index(GATE_MARK) + 1:])
        return "(mods gate) " + " ".join(rest[:2]) + " …"
    if list(cmd[:2]) == ["vllm", "serve"]:
        return "vllm serve …"
    return shlex.join(cmd) if len(cmd) <= 4 else shlex.join(cmd[:4]) + " …"


@dataclass
class NodeView:
    run: list[str] | None = None        # docker run's arguments, after `run`
    runs: int = 0
    mods: list[str] = field(default_factory=list)        # run.sh executed, in order
    mod_at: list[int] = field(default_factory=list)
    start_at: int | None = None         # where the node's server (vLLM or a Ray node) starts


def node_views(calls: Sequence[Call], node_of: Callable[[str], str]) -> dict[str, NodeView]:
    """Each node's docker calls read in order: its `docker run`, the mods' run.sh, and where its server starts."""
    views: dict[str, NodeView] = {}
    counts: dict[str, int] = {}
    for c in calls:
        if c.tool != "docker" or not c.argv:
            continue
        node = node_of(c.node)
        v = views.setdefault(node, NodeView())
        at = counts[node] = counts.get(node, 0) + 1
        a, text = c.argv, " ".join(c.argv)
        if a[0] == "run":
            v.run, v.runs = list(a[1:]), v.runs + 1
            if GATE_MARK not in a and not _idle(a[1:]) and v.start_at is None:
                v.start_at = at                  # the container's command is the server itself
        elif a[0] == "exec":
            if "./run.sh" in text:
                dest = a[a.index("mod") + 1] if "mod" in a[:-1] else (re.findall(r"cd (\S+)", text) or [""])[0]
                v.mods.append(dest.rstrip("/").rsplit("/", 1)[-1])
                v.mod_at.append(at)
            elif v.start_at is None and (("touch" in a and any(RELEASE_MARK in w for w in a))
                                         or (re.search(r"exec-script[^ ]*\.sh", text) and "chmod" not in a)
                                         or "ray start" in text):
                v.start_at = at
    return views


def _idle(args: Sequence[str]) -> bool:
    """The runner's container command: idle until vLLM is started in it with docker exec."""
    cmd = run_aspects(args).get("command", "")
    return cmd.startswith(("sleep ", "earlyoom"))


# --- the comparison ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Context:
    mode: str                           # solo | cluster
    recipe: Mapping[str, Any]           # the recipe file as PyYAML reads it
    recipe_env: frozenset[str]          # the recipe's variables: compared with the vLLM command, not here
    spread: bool = False                # the plan spreads a recipe of parallelism 1 over the cluster (its note)


@dataclass(frozen=True)
class Rule:
    id: str
    reason: str
    test: Callable[[str, str | None, str | None, Context], bool]


LINK_ENV = re.compile(r"^env (VLLM_HOST_IP|NCCL_SOCKET_IFNAME|NCCL_IB_HCA|NCCL_IB_DISABLE|UCX_NET_DEVICES|"
                      r"OMPI_MCA_btl_tcp_if_include|GLOO_SOCKET_IFNAME|TP_SOCKET_IFNAME|MN_IF_NAME|RAY_\w+)$")
# What forwis's newer launch-cluster.sh sets and the older runners (a3refaat, wentbackward) do not: sparkconsole
# starts every container as the newest runner does.
NEWER_RUNNER = {"ulimit nofile": "1048576:1048576", "volume /root/.tilelang": "$HOME/.tilelang", "entrypoint": ""}


def _sc(ctx: Context) -> Mapping[str, Any]:
    sc = ctx.recipe.get("sparkconsole") if isinstance(ctx.recipe, Mapping) else None
    return sc if isinstance(sc, Mapping) else {}


def _sc_container(ctx: Context) -> Mapping[str, Any]:
    c = _sc(ctx).get("container")
    return c if isinstance(c, Mapping) else {}


DELIBERATE: tuple[Rule, ...] = (
    Rule("memory-cap", "a memory cap on every container, swap equal to it (`--memory` = `--memory-swap`): a "
         "unified-memory runaway is an OOM-kill of the container, not a frozen Spark (seed 004); the runner caps "
         "memory only with --non-privileged (110g, swap 10g more)",
         lambda a, r, o, c: a in ("memory", "memory-swap") and o is not None),
    Rule("tp1-spread", "a recipe of parallelism 1 asked for a cluster: sparkconsole spreads it by tensor parallel "
         "over the cluster's nodes and says so in the plan (the vLLM table's difference 1); the newer runners "
         "(forwis, wentbackward) trim such a launch to the head alone, a3refaat's starts an idle worker",
         lambda a, r, o, c: a == "container" and r is None and o == "started" and c.spread),
    Rule("no-rm", "no `--rm`: a dead server's container stays, so its log can still be read",
         lambda a, r, o, c: a == "rm" and r == "yes" and o is None),
    Rule("labels", "sparkconsole's `--label sparkconsole.*`: the console groups one launch's containers across "
         "nodes and finds where it serves",
         lambda a, r, o, c: a == "label" and o is not None
         and all(x.startswith("sparkconsole.") for x in set(o.split()) - set((r or "").split()))),
    Rule("main-process", "vLLM is the container's main process (its exit is the container's exit, which launch "
         "health reads), held by the mods gate until the mods are applied; the runner starts the container idle "
         "and runs vLLM in it with `docker exec`",
         lambda a, r, o, c: a == "command"),
    Rule("init", "`--init` where the recipe asks for it (sparkconsole.container.init)",
         lambda a, r, o, c: a == "init" and o == "yes" and r is None and bool(_sc_container(c).get("init"))),
    Rule("recipe-volume", "the recipe's own volumes (sparkconsole.container.volumes, e.g. the test bed's)",
         lambda a, r, o, c: a.startswith("volume ") and r is None and o is not None
         and any(str(v).split(":", 1)[0] == o.split(" (", 1)[0] for v in _sc_container(c).get("volumes") or ())),
    Rule("secret-ref", "`-e HF_TOKEN` by reference: the token from the docker client's environment on the node "
         "(gated models), never a value in the plan; unset, the container gets none",
         lambda a, r, o, c: a.startswith("env ") and o == "(by reference)" and r is None),
    Rule("solo-link-env", "solo: the runner sets its node-to-node link variables on one node too, where no rank "
         "talks to another; sparkconsole sets them for cluster launches only",
         lambda a, r, o, c: c.mode == "solo" and o is None and bool(LINK_ENV.match(a))),
    Rule("ray-env", "Ray's variables (`RAY_*`), set by the runner whatever its backend: sparkconsole's default mp "
         "launch runs no Ray (its `--backend ray` sets its own)",
         lambda a, r, o, c: c.mode != "solo" and a.startswith("env RAY_") and o is None),
    Rule("mn-if-name", "`MN_IF_NAME`: read by nothing in vLLM, NCCL or the forks' mods (a name from the upstream's "
         "run-cluster-node.sh)", lambda a, r, o, c: a == "env MN_IF_NAME" and o is None),
    Rule("b12x-cache", "the node's `~/.cache/b12x` mounted like the other compile caches: the B12X image family's "
         "CuTeDSL kernels, which compile again on every launch without it (some forks' runners mount it; issue 39)",
         lambda a, r, o, c: a == "volume /root/.cache/b12x" and r is None and o == "$HOME/.cache/b12x"),
    Rule("newer-runner", "as forwis's newer launch-cluster.sh (`--ulimit nofile=1048576:1048576`, ~/.tilelang "
         "mounted, `--entrypoint=`); this fork's older runner lacks it",
         lambda a, r, o, c: r is None and a in NEWER_RUNNER and o == NEWER_RUNNER[a]),
)


def classify(aspect: str, runner: str | None, ours: str | None, ctx: Context) -> str:
    """"same", a DELIBERATE rule's id, or "different"."""
    if runner == ours:
        return "same"
    return next((rule.id for rule in DELIBERATE if rule.test(aspect, runner, ours, ctx)), "different")


@dataclass
class ContainerResult:
    verdict: str = "not-compared"       # same | deliberate | different | not-compared
    why: str = ""                       # not compared: the side that could not run
    nodes: int = 0
    same: int = 0                       # aspects the same, over all nodes
    deliberate: dict[str, int] = field(default_factory=dict)     # rule id → aspects
    different: list[str] = field(default_factory=list)
    listed: list[str] = field(default_factory=list)              # each deliberate difference, with its rule
    mods: list[str] = field(default_factory=list)                # the mods the head applies (runner's order)
    skipped: list[str] = field(default_factory=list)             # plan steps not run (neither docker nor mkdir)
    stray: list[str] = field(default_factory=list)               # guarded tools the runner reached


class Normaliser:
    """Spelling only: the shared HOME as `$HOME`, each side's node addresses as {nodeK}."""

    def __init__(self, home: Path, ours_addresses: Mapping[str, str]) -> None:
        self.home = str(home)
        self.ours = sorted(((a, n) for n, a in ours_addresses.items()), key=lambda x: -len(x[0]))

    def runner(self, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.replace(self.home, "$HOME")
        return re.sub(r"(?<![\d.])192\.0\.2\.(\d+)(?![\d.])", r"{node\1}", v)

    def sparkconsole(self, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.replace(self.home, "$HOME")
        for addr, node in self.ours:
            v = re.sub(rf"(?<![\d.]){re.escape(addr)}(?![\d.])", "{" + node + "}", v)
        return v


def plan_addresses(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"^\[(\S+) (\S+)\]$", text, re.M)}


def _files(path: Path) -> int | None:
    if path.is_dir():
        return sum(1 for p in path.rglob("*") if not p.is_dir())
    return None


def _rel(path: str, fork_dir: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(fork_dir.resolve()))
    except ValueError:
        return path


def node_aspects(node: str, rv: NodeView | None, ov: NodeView | None, launch: Launch,
                 copies: Mapping[tuple[str, str], tuple[str, int]], fork_dir: Path,
                 norm: Normaliser, ctx: Context) -> list[tuple[str, str | None, str | None]]:
    """(aspect, runner's value, sparkconsole's value) of one node, both normalised."""
    out: list[tuple[str, str | None, str | None]] = []
    ra = run_aspects(rv.run) if rv and rv.run else {}
    oa = run_aspects(ov.run) if ov and ov.run else {}
    out.append(("container", "started" if ra else None, "started" if oa else None))
    if not (rv and ov and ra and oa):
        return out                      # a node only one side starts: that is the difference, not its options
    if rv.runs != 1 or ov.runs != 1:
        out.append(("docker runs", str(rv.runs), str(ov.runs)))
    for k in sorted((set(ra) | set(oa)) - {f"env {e}" for e in ctx.recipe_env}):
        out.append((k, norm.runner(ra.get(k)), norm.sparkconsole(oa.get(k))))

    def before(v: NodeView) -> str:
        if not v.mods:
            return "(no mods)"
        return "yes" if v.start_at is not None and all(i < v.start_at for i in v.mod_at) else "no"
    out.append(("mods", ", ".join(rv.mods) or "(none)", ", ".join(ov.mods) or "(none)"))
    out.append(("mods before the server starts", before(rv), before(ov)))
    runner_src = {Path(p).stem if p.endswith(".zip") else Path(p).name: p for p in launch.mods}
    for name in sorted(set(rv.mods) | set(ov.mods)):
        src = runner_src.get(name)
        ours = copies.get((node, name))
        out.append((f"mod {name} source", _rel(src, fork_dir) if src else None,
                    _rel(ours[0], fork_dir) if ours else None))
        n = _files(Path(src)) if src else None
        if n is not None or ours:
            out.append((f"mod {name} files", str(n) if n is not None else None, str(ours[1]) if ours else None))
    return out


def _show(v: str | None) -> str:
    return "(absent)" if v is None else "(empty)" if v == "" else v


def compare_container(sb: LaunchSandbox, fork_dir: Path, recipe: Mapping[str, Any], mode: str, dry_run_out: str,
                      script_text: str, plan_out: str, work: Path, recipe_env: Sequence[str] = (),
                      spread: bool = False) -> ContainerResult:
    """One recipe in one mode: both launches run with the stand-ins, each node's container compared."""
    launch = run_runner_launch(sb, fork_dir, dry_run_out, script_text, work)
    res = ContainerResult(stray=[shlex.join([c.tool, *c.argv]) for c in launch.stray])
    if launch.refused:
        res.why = f"the runner's launch-cluster.sh: {launch.refused}"
        return res
    steps = plan_steps(plan_out)
    ours_calls, res.skipped = run_plan(sb, steps, work)
    rviews, oviews = node_views(launch.calls, runner_node), node_views(ours_calls, lambda n: n)
    norm = Normaliser(work / "home", plan_addresses(plan_out))
    ctx = Context(mode, recipe, frozenset(recipe_env), spread)
    copies = plan_mod_copies(steps)
    nodes = sorted(set(rviews) | set(oviews), key=lambda n: (len(n), n))
    res.nodes = len(nodes)
    res.mods = rviews[nodes[0]].mods if nodes and nodes[0] in rviews else []
    for node in nodes:
        for aspect, r, o in node_aspects(node, rviews.get(node), oviews.get(node), launch, copies, fork_dir, norm, ctx):
            verdict = classify(aspect, r, o, ctx)
            if verdict == "same":
                res.same += 1
                continue
            line = f"{node} {aspect}: runner {_show(r)} | sparkconsole {_show(o)}"
            if verdict == "different":
                res.different.append(line)
            else:
                res.deliberate[verdict] = res.deliberate.get(verdict, 0) + 1
                res.listed.append(f"{line} [{verdict}]")
    res.verdict = "different" if res.different else "deliberate" if res.deliberate else "same"
    return res


# --- the report -------------------------------------------------------------------------------------------------

def report(rows: Sequence[tuple[str, str, str, Mapping[str, Any] | None]], forks: Sequence[str],
           launch: Sequence[str] = (), verbose: bool = False) -> str:
    """rows: (fork, mode, recipe, ContainerResult as a dict, or None where either side refused the recipe)."""
    out = ["The container: launch-cluster.sh (docker/ssh stand-ins) vs sparkconsole recipe plan, each node's "
           "docker run and mod steps", f"Launch options given to both: {shlex.join(launch) if launch else '(none)'}",
           ""]
    head = (f"{'fork':<14} {'mode':<8} {'planned':>7} {'same':>5} {'delib':>5} {'diff':>5} {'n/c':>4}   "
            f"aspects same/deliberate/different")
    out += [head, "-" * len(head)]

    def row(label: str, mode: str, rs: Sequence[Mapping[str, Any]]) -> str:
        v = collections.Counter(r["verdict"] for r in rs)
        same = sum(r["same"] for r in rs)
        delib = sum(sum(r["deliberate"].values()) for r in rs)
        diff = sum(len(r["different"]) for r in rs)
        return (f"{label:<14} {mode:<8} {len(rs):>7} {v['same']:>5} {v['deliberate']:>5} {v['different']:>5} "
                f"{v['not-compared']:>4}   {same}/{delib}/{diff}")
    for fork in [*forks, "TOTAL"]:
        for mode in ("solo", "cluster"):
            rs = [c for f, m, _, c in rows if c and m == mode and fork in (f, "TOTAL")]
            if rs:
                out.append(row(fork, mode, rs))
    done = [(f, m, rec, c) for f, m, rec, c in rows if c and c["verdict"] != "not-compared"]
    out += _findings(rows, done, verbose)
    return "\n".join(out)


def _findings(rows: Sequence[tuple[str, str, str, Mapping[str, Any] | None]],
              done: Sequence[tuple[str, str, str, Mapping[str, Any]]], verbose: bool) -> list[str]:
    out = ["", "Deliberate differences (recipe × mode where each applies; aspects over all nodes):"]
    by_rule: dict[str, list[int]] = {}
    for _, _, _, c in done:
        for rule, k in c["deliberate"].items():
            by_rule.setdefault(rule, [0, 0])
            by_rule[rule][0] += 1
            by_rule[rule][1] += k
    for rule in DELIBERATE:
        if rule.id in by_rule:
            out.append(f"  {rule.id}: {by_rule[rule.id][0]} ({by_rule[rule.id][1]}) — {rule.reason}")
    diffs: dict[str, list[tuple[str, str]]] = {}
    for f, m, rec, c in done:
        for d in c["different"]:
            diffs.setdefault(d.split(" ", 1)[1], []).append((f"{f}:{m}", f"[{f}] {rec} {m}"))
    out += ["", "Different (recipe × mode × node where found):" if diffs else "Different: none"]
    for d, where in sorted(diffs.items(), key=lambda kv: -len(kv[1])):
        forks_seen = ", ".join(f"{k} {n}" for k, n in sorted(collections.Counter(w for w, _ in where).items()))
        out.append(f"  {d}: {len(where)} ({forks_seen})")
        recipes = sorted({r for _, r in where})
        if len(recipes) <= 5 or verbose:
            out += [f"      {r}" for r in recipes]
    with_mods = [c for _, _, _, c in done if c["mods"]]
    out += ["", f"Mods: {len(with_mods)} recipe × mode with mods compared ({sum(len(c['mods']) for c in with_mods)} "
                f"mod applications on the head); mod aspects different in "
                f"{sum(1 for c in with_mods if any(' mod' in d for d in c['different']))}"]
    nc = collections.Counter(c["why"] for _, _, _, c in rows if c and c["verdict"] == "not-compared")
    for why, k in nc.most_common():
        out.append(f"Not compared ({k}): {why}")
    stray = sorted({s for _, _, _, c in rows if c for s in c["stray"]})
    skipped = sorted({s.split(": ", 1)[1] for _, _, _, c in rows if c for s in c["skipped"]})
    out.append("Guarded tools (ip, ibdev2netdev, nc, nvidia-smi, sudo, curl, wget, hf) the runner reached: "
               + ("; ".join(stray[:5]) if stray else "none"))
    out.append("Plan steps not run (neither docker nor mkdir): " + ("; ".join(skipped[:5]) if skipped else "none"))
    for f, m, rec, c in done if verbose else ():
        out.append(f"[{f}] {rec} {m}: {c['verdict']}")
        out += [f"    {d}" for d in (*c["different"], *c["listed"])]
    return out
