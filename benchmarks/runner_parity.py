"""Runner parity: spark-vllm-docker's own runner (`run-recipe.py --dry-run`) against `sparkconsole recipe plan`,
recipe by recipe, on mirrored public forks (issue 18's closing figures).

    .venv/bin/python benchmarks/runner_parity.py --mirror PATH/TO/FORK \\
        [--mirror DIR …] [--json OUT.json] [--verbose]
    .venv/bin/python benchmarks/runner_parity.py --smoke
        sparkconsole's side only, on a bundled recipe (solo and cluster): its plan read as the comparison reads
        it, and its steps run with the container stand-ins. The runner's side needs a fork (--mirror).

Each --mirror is a bare git dir (or a plain checkout) of a spark-vllm-docker fork. Its `run-recipe.py` and
`recipes/` are exported (git archive) into a temporary directory; nothing is copied into this repository. For
every recipe (`recipes/*.yaml`, `recipes/*/*.yaml`):

- solo: the runner's `--dry-run --solo` against `sparkconsole recipe plan FILE -T solo` on a one-node cluster file;
- cluster: the runner's `--dry-run -n IP1,…,IPn` (documentation addresses 192.0.2.x) against `sparkconsole recipe
  plan FILE -T cluster-tp2` on a cluster file of n local nodes, n = the recipe's tensor_parallel ×
  pipeline_parallel (2 when that is 1), the head's server compared;
- squeeze: a recipe written for more than two Sparks, planned on a two-node cluster file (the runner's `-n`
  with two addresses): sparkconsole should refuse in one line naming the nodes it needs (issue 18, item 4).

`--extra '--seed 42'` gives both the same extra vLLM arguments after `--`; `--lint` also runs `recipe lint
--offline` on each plan and counts the preflight rules that would refuse the launch. The recipe's environment is
compared too (the script's `export`s against the plan's `docker run -e`), reported apart from the argv verdict.

Both vLLM argvs are read as data. The runner writes the recipe's command into a bash script (printed by
--dry-run); that script is run by bash with a PATH holding only a `vllm` stand-in that records its argv, so
comments, continuations and quotes are read by bash itself. sparkconsole's plan is printed with shlex.join; the
head server's `docker run … IMAGE ARGV` line is split back with shlex (a `bash -c TEXT` command goes through the
same bash stand-in). Nothing runs for real: the runner is given docker/ssh/hf stand-ins on its PATH that only
record a call (none is called by a dry run; the report says so if one ever is), sparkconsole plans `--offline`.

Then both argvs are normalised for spelling only (each normalisation is listed in the output, with how often it
applied) and compared flag by flag: same / different (the differing flags, and a reason category) / refused
(the refusing side's one line). Exit status 0 always: it is a report, not a test (tests/test_runner_parity.py
tests the comparison itself).

The container around vLLM is compared too (benchmarks/container_parity.py): each node's `docker run` and mod steps,
the fork's launch-cluster.sh run with docker/ssh stand-ins against the plan's steps (`--no-container` skips it).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import container_parity as cp  # noqa: E402  (a sibling script of this one, not a package)

FAKE_NET = "192.0.2."          # RFC 5737 documentation addresses: never a real host
RUNNER_TIMEOUT_S = 60
BASH_OWN = {"PATH", "HOME", "PWD", "OLDPWD", "SHLVL", "_", "PARITY_LOG", "PARITY_OTHER", "PYTHONCOERCECLOCALE"}
# What a cluster launch sets on every node besides the recipe's env: the runner's launch-cluster.sh sets these
# at launch time (outside the printed script), sparkconsole's plan writes them into `docker run -e`.
LAUNCH_ENV = re.compile(r"^(VLLM_HOST_IP|NCCL_.*|GLOO_SOCKET_IFNAME|TP_SOCKET_IFNAME|UCX_NET_DEVICES|OMPI_MCA_.*|"
                        r"RAY_.*)$")

# --- normalisation: spelling only ----------------------------------------------------------------------------

NORMALISATIONS = {
    "eq": "`--flag=value` read as `--flag value`",
    "underscore": "`--flag_name` read as `--flag-name` (vLLM's argparse accepts both)",
    "alias": "`-tp` / `-pp` read as `--tensor-parallel-size` / `--pipeline-parallel-size`",
    "order": "flag order ignored (a repeated flag keeps the order of its own values: vLLM's last one wins)",
    "host": "`--host 0.0.0.0` dropped on either side (vLLM listens on all addresses without --host)",
    "executor": "cluster: `--distributed-executor-backend X` dropped on both sides: the launch's business "
                "(the runner's Ray, or none in --no-ray forks; sparkconsole's mp launch by default)",
    "multinode": "cluster: sparkconsole's `--nnodes N --node-rank 0 --master-addr A --master-port P` dropped from "
                 "the head's argv (the runner's launch-cluster.sh adds its own at launch time, outside the script)",
}
ALIASES = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size"}
MULTINODE = {"--nnodes": 1, "--node-rank": 1, "--master-addr": 1, "--master-port": 1, "--headless": 0}
_NUMBER = re.compile(r"^-\d+(\.\d+)?([eE][-+]?\d+)?$")


@dataclass
class Parsed:
    head: tuple[str, ...]                                  # vllm serve MODEL …(positionals before the first flag)
    flags: dict[str, list[tuple[str, ...]]]                # flag → each occurrence's values, in order
    applied: collections.Counter = field(default_factory=collections.Counter)


def _is_flag(tok: str) -> bool:
    return tok.startswith("-") and len(tok) > 1 and not _NUMBER.match(tok)


def normalise(argv: Sequence[str], cluster: bool) -> Parsed:
    applied: collections.Counter = collections.Counter()
    toks: list[str] = []
    for t in argv:
        if t.startswith("--") and "=" in t:
            k, _, v = t.partition("=")
            toks += [k, v]
            applied["eq"] += 1
        else:
            toks.append(t)
    head: list[str] = []
    i = 0
    while i < len(toks) and not _is_flag(toks[i]):
        head.append(toks[i])
        i += 1
    flags: dict[str, list[tuple[str, ...]]] = {}
    while i < len(toks):
        name = toks[i]
        i += 1
        vals: list[str] = []
        while i < len(toks) and not _is_flag(toks[i]):
            vals.append(toks[i])
            i += 1
        if name in ALIASES:
            name = ALIASES[name]
            applied["alias"] += 1
        if name.startswith("--") and "_" in name:
            name = "--" + name[2:].replace("_", "-")
            applied["underscore"] += 1
        if name == "--host" and vals == ["0.0.0.0"]:
            applied["host"] += 1
            continue
        if cluster and name == "--distributed-executor-backend":
            applied["executor"] += 1
            continue
        if cluster and name in MULTINODE:
            applied["multinode"] += 1
            # the flag's own values only; anything after them stays a (positional) mistake to be shown
            extra = vals[MULTINODE[name]:]
            if extra:
                flags.setdefault("(positional)", []).append(tuple(extra))
            continue
        flags.setdefault(name, []).append(tuple(vals))
    return Parsed(tuple(head), flags, applied)


def compare(runner: Sequence[str], ours: Sequence[str], cluster: bool) -> tuple[list[str], collections.Counter]:
    """The differences between two vLLM argvs after normalisation ([] when the same), and the normalisations used."""
    a, b = normalise(runner, cluster), normalise(ours, cluster)
    diffs: list[str] = []
    if a.head != b.head:
        diffs.append(f"command: runner {shlex.join(a.head)} | sparkconsole {shlex.join(b.head)}")
    for name in sorted(set(a.flags) | set(b.flags)):
        ra, rb = a.flags.get(name), b.flags.get(name)
        if ra == rb:
            continue
        show = lambda occ: "(absent)" if occ is None else " ".join(  # noqa: E731
            (shlex.join(v) if v else "(set)") for v in occ)
        diffs.append(f"{name}: runner {show(ra)} | sparkconsole {show(rb)}")
    used = a.applied + b.applied
    if list(a.flags) != list(b.flags):
        used["order"] += 1
    return diffs, used


def reason_of(diffs: Sequence[str], extra: Sequence[str] = ()) -> str:
    names = {d.split(":", 1)[0] for d in diffs}
    extra_flags = {ALIASES.get(a, a).partition("=")[0] for a in extra if _is_flag(a)}
    if names and names <= extra_flags and all(" runner (absent) | " in d for d in diffs):
        return "extra arguments lost by the runner (appended after the command's trailing comment)"
    if names <= {"--tensor-parallel-size", "--pipeline-parallel-size"}:
        return "parallelism"
    if names <= {"--port"}:
        return "port"
    if "command" in names:
        return "command"
    return "flags"


# --- running the two sides -------------------------------------------------------------------------------------

def _write_exec(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


class Sandbox:
    """Stand-ins on PATH, each recording its argv as one JSON line and doing nothing else."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "argv-bin"        # PATH for the bash that reads a launch script: `vllm` only
        self.guard = root / "guard-bin"     # prepended to the runner's PATH: what a dry run must never call
        self.log = root / "calls.jsonl"
        self.bin.mkdir(parents=True)
        self.guard.mkdir()
        rec = (f"#!{sys.executable}\nimport json, os, sys\n"
               "with open(os.environ['PARITY_LOG'], 'a') as f:\n"
               "    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + '\\n')\n")
        # The `vllm` stand-in also keeps the environment the script exported (bash's own variables left out).
        vllm = (f"#!{sys.executable}\nimport json, os, sys\n"
                f"skip = {sorted(BASH_OWN)!r}\n"
                "env = {k: v for k, v in os.environ.items() if k not in skip}\n"
                "with open(os.environ['PARITY_LOG'], 'a') as f:\n"
                "    f.write(json.dumps({'argv': sys.argv[1:], 'env': env}) + '\\n')\n")
        _write_exec(self.bin / "vllm", vllm)
        for name in ("docker", "ssh", "scp", "rsync", "hf", "huggingface-cli"):
            _write_exec(self.guard / name, rec + "sys.exit(1)\n")
        self.launch = cp.LaunchSandbox(root)      # the stand-ins launch-cluster.sh runs with (container parity)

    def guard_calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [c for c in map(json.loads, self.log.read_text().splitlines()) if c and c[0] != "vllm"]

    def bash_argv(self, script: str, work: Path) -> tuple[list[tuple[list[str], dict[str, str]]], list[str]]:
        """Run a launch script as bash does, with nothing but the `vllm` stand-in on PATH: the vllm argvs it
        would run, and any other command it names (recorded, not run)."""
        work.mkdir(parents=True, exist_ok=True)
        s, log, other = work / "launch.sh", work / "argv.jsonl", work / "other.txt"
        s.write_text(script)
        for p in (log, other):
            p.unlink(missing_ok=True)
        wrapper = ('command_not_found_handle() { printf "%s\\n" "$1" >> "$PARITY_OTHER"; return 127; }\n'
                   'source "$1"\n')
        subprocess.run(["/bin/bash", "--noprofile", "--norc", "-c", wrapper, "bash", str(s)], cwd=work,
                       env={"PATH": str(self.bin), "HOME": str(work), "PARITY_LOG": str(log),
                            "PARITY_OTHER": str(other), "PYTHONCOERCECLOCALE": "0"},
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        others = other.read_text().split() if other.exists() else []
        return [(["vllm", *c["argv"]], c["env"]) for c in calls], others


@dataclass
class Side:
    argv: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    preflight: list[str] = field(default_factory=list)     # sparkconsole: offline preflight's refusing rules
    preflight_warn: list[str] = field(default_factory=list)  # …and the rules that only warn
    preflight_lines: list[str] = field(default_factory=list)  # …their lines, as `recipe lint` prints them
    refused: str | None = None
    notes: list[str] = field(default_factory=list)
    raw: str = ""                                          # the dry run's / the plan's whole output
    script: str = ""                                       # the runner: its launch script


def export_fork(mirror: Path, dest: Path) -> tuple[str, bool]:
    """The fork's run-recipe.py and recipes/ (and what its launch-cluster.sh needs: container_parity.EXPORTED)
    into dest, with a `.env` of documentation addresses. Returns (fork name, has a runner)."""
    name = mirror.name if mirror.name != "repo" else mirror.parent.name
    name = name.split("+", 1)[0]
    dest.mkdir(parents=True)
    git_dir = mirror if (mirror / "HEAD").exists() and not (mirror / ".git").exists() else mirror / ".git"
    if not git_dir.exists():            # a plain directory (the test's stand-in fork): copied as it is
        import shutil
        for p in ("run-recipe.py", "recipes", *cp.EXPORTED):
            src = mirror / p
            if src.is_dir():
                shutil.copytree(src, dest / p)
            elif src.is_file():
                shutil.copy2(src, dest / p)
        cp.write_env_file(dest)
        return name, (dest / "run-recipe.py").is_file() and (dest / "recipes").is_dir()
    listing = subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", "--name-only", "HEAD"],
                             capture_output=True, text=True)
    present = set(listing.stdout.split())
    wanted = [p for p in ("run-recipe.py", "recipes", *cp.EXPORTED) if p in present]
    if wanted:
        arc = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar", "HEAD", *wanted],
                             capture_output=True, check=True)
        tar = dest / "export.tar"
        tar.write_bytes(arc.stdout)
        with tarfile.open(tar) as t:
            t.extractall(dest, filter="data")
        tar.unlink()
    cp.write_env_file(dest)
    return name, "run-recipe.py" in present and "recipes" in present


def recipe_files(fork_dir: Path) -> list[Path]:
    r = fork_dir / "recipes"
    return sorted([*r.glob("*.yaml"), *r.glob("*.yml"), *r.glob("*/*.yaml"), *r.glob("*/*.yml")])


def cluster_size(path: Path) -> int:
    """The nodes a recipe asks for, as the runner reads its defaults (PyYAML, the last of a repeated key)."""
    import yaml
    try:
        d = yaml.safe_load(path.read_text()) or {}
        dflt = d.get("defaults") or {}
        n = int(dflt.get("tensor_parallel") or 1) * int(dflt.get("pipeline_parallel") or 1)
    except Exception:  # noqa: BLE001 — an unreadable recipe: two nodes, and both sides say what they make of it
        return 2
    return max(n, 2)


def run_runner(fork_dir: Path, recipe: Path, mode: str, n: int, sb: Sandbox, work: Path,
               extra: Sequence[str] = (), launch: Sequence[str] = ()) -> Side:
    # -d: detached, as sparkconsole launches (it changes only the launch-cluster.sh line the dry run prints)
    args = [sys.executable, str(fork_dir / "run-recipe.py"), str(recipe), "--dry-run", "-d", *launch]
    args += ["--solo"] if mode == "solo" else ["-n", ",".join(f"{FAKE_NET}{i + 1}" for i in range(n))]
    args += ["--", *extra] if extra else []
    env = {**os.environ, "PATH": f"{sb.guard}:{os.environ.get('PATH', '/usr/bin:/bin')}", "PARITY_LOG": str(sb.log),
           "HOME": str(work)}
    env.pop("HF_TOKEN", None)
    work.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(args, cwd=fork_dir, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                         timeout=RUNNER_TIMEOUT_S)
    out = res.stdout
    m = re.search(r"=== Generated Launch Script ===\n(.*?)\n=== What would be executed ===", out, re.S)
    if res.returncode != 0 or not m:
        lines = [ln.strip() for ln in (out + res.stderr).splitlines() if ln.strip()]
        err = next((ln for ln in lines if ln.startswith("Error")), lines[-1] if lines else f"exit {res.returncode}")
        return Side(refused=err[:200])
    calls, others = sb.bash_argv(m.group(1) + "\n", work / "runner")
    side = Side(notes=[f"bash would also run: {o}" for o in others], raw=out, script=m.group(1) + "\n")
    if len(calls) != 1:
        side.refused = f"the launch script runs vllm {len(calls)} times"
        return side
    side.argv, side.env = calls[0]
    return side


def cluster_file(root: Path, n: int) -> Path:
    p = root / f"cluster-{n}.yaml"
    if not p.exists():
        # the interfaces of the runner's .env, so the cluster link variables compare value for value
        rows = "".join(f"  - {{name: node{i + 1}, address: 127.0.0.{i + 2}, local: true, eth_if: {cp.ETH_IF}, "
                       f"ib_if: '{cp.IB_IF}'}}\n" for i in range(n))
        p.write_text("nodes:\n" + rows)
    return p


_STEP = re.compile(r"^\s+\d+\. (start vLLM server|start vLLM on the Ray cluster)")


def _docker_env(words: Sequence[str]) -> dict[str, str]:
    env = {}
    for i, w in enumerate(words[:-1]):
        if w == "-e" and "=" in words[i + 1]:          # `-e NAME` alone: a secret by reference, no value
            k, _, v = words[i + 1].partition("=")
            env[k] = v
    return env


def parse_plan(text: str) -> tuple[list[str] | None, dict[str, str], list[str]]:
    """The head server's argv (after the image) and `-e` environment from `recipe plan` output, and its
    warning/note lines."""
    lines = text.splitlines()
    notes = [ln for ln in lines if ln.startswith(("warning: ", "note: "))]
    env: dict[str, str] = {}
    for i, ln in enumerate(lines):
        if not (i + 1 < len(lines) and lines[i + 1].lstrip().startswith("$ ")):
            continue
        words = shlex.split(lines[i + 1].lstrip()[2:])
        if words[:2] == ["sh", "-c"] and len(words) == 3:    # a step with the node's own expansions (its caches)
            words = shlex.split(words[2])
        if "start the container with a Ray head" in ln:
            env = _docker_env(words)
        if _STEP.match(ln):
            if words[:3] == ["docker", "exec", "-d"]:      # the Ray backend: docker exec -d NAME bash -c TEXT
                return ["bash", "-c", words[-1].split(" >> /proc/1/fd/1")[0]], env, notes
            if "--entrypoint=" in words:
                k = words.index("--entrypoint=")
                command = words[k + 2:]
                if command[3:4] == ["sparkconsole-mods-gate"]:     # sh -c GATE sparkconsole-mods-gate ARGV…
                    command = command[4:]
                return command, _docker_env(words[:k]), notes
    return None, env, notes


def run_sparkconsole(cmd: Sequence[str], recipe: Path, mode: str, cfile: Path, sb: Sandbox, work: Path,
                     extra: Sequence[str] = (), lint: bool = False, launch: Sequence[str] = ()) -> Side:
    topo = "solo" if mode == "solo" else "cluster-tp2"
    res = subprocess.run([*cmd, "recipe", "plan", str(recipe), "-T", topo, "--offline", "--cluster", str(cfile),
                          *launch, *(["--", *extra] if extra else [])],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, cwd=work.parent,
                         env={**os.environ, "XDG_CONFIG_HOME": str(work.parent / "xdg")})
    if res.returncode != 0:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()] or [f"exit {res.returncode}"]
        return Side(refused=lines[-1].removeprefix("sparkconsole: ")[:300])
    argv, env, notes = parse_plan(res.stdout)
    side = Side(notes=notes, env=env, raw=res.stdout)
    if argv is None:
        side.refused = "(no vLLM server step found in the plan output)"
        return side
    if argv[:2] == ["bash", "-c"]:                     # several commands or shell operators: read it as bash does
        calls, others = sb.bash_argv(argv[2] + "\n", work / "ours")
        side.notes += [f"bash would also run: {o}" for o in others]
        if len(calls) != 1:
            side.refused = f"the plan's shell command runs vllm {len(calls)} times"
            return side
        argv = calls[0][0]
    side.argv = argv
    if lint:
        # What `recipe launch` would say before starting anything, read offline (no node facts): its refusals.
        res = subprocess.run([*cmd, "recipe", "lint", str(recipe), "-T", topo, "--offline", "--cluster", str(cfile),
                              *(["--", *extra] if extra else [])],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, cwd=work.parent,
                             env={**os.environ, "XDG_CONFIG_HOME": str(work.parent / "xdg")})
        side.preflight = sorted({m.group(1) for m in re.finditer(r"^(?:REFUSE|BLOCK) (\w+):", res.stdout, re.M)})
        side.preflight_warn = sorted({m.group(1) for m in re.finditer(r"^WARN (\w+):", res.stdout, re.M)}
                                     - set(side.preflight))
        side.preflight_lines = [ln for ln in res.stdout.splitlines() if re.match(r"^(REFUSE|BLOCK|WARN) \w+:", ln)]
    return side


# --- one recipe, one fork, the report ----------------------------------------------------------------------------

@dataclass
class Result:
    fork: str
    recipe: str            # path inside the fork
    mode: str              # solo | cluster
    nodes: int
    outcome: str           # same | different | refused-sparkconsole | refused-runner | refused-both
    reason: str = ""
    diffs: list[str] = field(default_factory=list)
    runner: str | None = None       # a refusal's line
    sparkconsole: str | None = None
    notes: list[str] = field(default_factory=list)
    applied: dict[str, int] = field(default_factory=dict)
    container: dict[str, Any] | None = None     # container_parity.ContainerResult, where both planned
    digest: str = ""
    runner_argv: list[str] | None = None
    sparkconsole_argv: list[str] | None = None
    env_diffs: list[str] = field(default_factory=list)
    preflight: list[str] = field(default_factory=list)
    preflight_warn: list[str] = field(default_factory=list)
    preflight_lines: list[str] = field(default_factory=list)


def refusal_reason(line: str) -> str:
    low = line.lower()
    if "requires cluster mode" in low:
        return "cluster_only recipe"
    if "solo only" in low or "requires solo mode" in low:
        return "solo_only recipe"
    if "runs on" in low and "nodes" in low:
        return "parallelism needs more nodes"
    return "other"


def judge(fork: str, rel: str, mode: str, n: int, runner: Side, ours: Side, digest: str,
          extra: Sequence[str] = ()) -> Result:
    r = Result(fork, rel, mode, n, "", runner=runner.refused, sparkconsole=ours.refused,
               notes=runner.notes + ours.notes, digest=digest, runner_argv=runner.argv, sparkconsole_argv=ours.argv,
               preflight=ours.preflight, preflight_warn=ours.preflight_warn, preflight_lines=ours.preflight_lines)
    if runner.refused and ours.refused:
        r.outcome, r.reason = "refused-both", refusal_reason(ours.refused)
    elif ours.refused:
        r.outcome, r.reason = "refused-sparkconsole", refusal_reason(ours.refused)
    elif runner.refused:
        r.outcome, r.reason = "refused-runner", refusal_reason(runner.refused)
    else:
        diffs, used = compare(runner.argv or [], ours.argv or [], cluster=mode != "solo")
        r.applied = dict(used)
        if diffs:
            r.outcome, r.reason, r.diffs = "different", reason_of(diffs, extra), diffs
            if r.reason == "parallelism" and any("spreads it over" in x for x in ours.notes):
                r.reason = "parallelism (TP 1 recipe spread over the cluster, as the plan notes)"
        else:
            r.outcome = "same"
        r.env_diffs = compare_env(runner.env, ours.env)
    return r


def compare_env(runner: dict[str, str], ours: dict[str, str]) -> list[str]:
    """The recipe's environment as the runner's script exports it against sparkconsole's `docker run -e`.
    The cluster link variables are the launch's (LAUNCH_ENV), not the recipe's: left out on both sides."""
    out = []
    for k in sorted(set(runner) | set(ours)):
        if LAUNCH_ENV.match(k):
            continue
        a, b = runner.get(k), ours.get(k)
        if a != b:
            out.append(f"{k}: runner {a!r} | sparkconsole {b!r}")
    return out


@dataclass(frozen=True)
class Options:
    extra: tuple[str, ...] = ()         # extra vLLM arguments, given to both after `--`
    lint: bool = False
    launch: tuple[str, ...] = ()        # launch options given to both (--non-privileged, --no-cache-dirs)
    container: bool = True              # compare each node's container too


def check_recipe(fork: str, fork_dir: Path, recipe: Path, sc_cmd: Sequence[str], sb: Sandbox, root: Path,
                 modes: Iterable[str], opts: Options = Options()) -> list[Result]:
    extra = opts.extra
    rel = str(recipe.relative_to(fork_dir))
    digest = hashlib.sha256(recipe.read_bytes()).hexdigest()[:12]
    out = []
    for mode in modes:
        n = 1 if mode == "solo" else cluster_size(recipe)
        if mode == "squeeze":          # a recipe for more than two Sparks, on a two-node cluster file
            if n <= 2:
                continue
            n = 2
        work = root / "work" / fork / rel.replace("/", "__") / mode
        runner = run_runner(fork_dir, recipe, mode, n, sb, work, extra, opts.launch)
        ours = run_sparkconsole(sc_cmd, recipe, mode, cluster_file(root, n), sb, work, extra, opts.lint, opts.launch)
        # its lines name the file: name it as the fork does, not by the temp dir
        if ours.refused:
            ours.refused = ours.refused.replace(str(fork_dir) + "/", "").replace(str(root) + "/", "")
        ours.notes = [x.replace(str(fork_dir) + "/", "") for x in ours.notes]
        result = judge(fork, rel, mode, n, runner, ours, digest, extra)
        if opts.container and mode != "squeeze" and runner.argv and ours.argv:
            result.container = asdict(container_of(fork_dir, recipe, mode, runner, ours, sb, work))
        out.append(result)
    return out


def container_of(fork_dir: Path, recipe: Path, mode: str, runner: Side, ours: Side, sb: Sandbox,
                 work: Path) -> cp.ContainerResult:
    import yaml
    try:
        doc = yaml.safe_load(recipe.read_text()) or {}
    except Exception:  # noqa: BLE001 — both sides planned it; an odd file reads as no extra settings here
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    env = doc.get("env") if isinstance(doc.get("env"), dict) else {}
    return cp.compare_container(sb.launch, fork_dir, doc, mode, runner.raw, runner.script, ours.raw,
                                work / "container", [*runner.env, *env],
                                spread=any("spreads it over" in n for n in ours.notes))


MODES = ("solo", "cluster", "squeeze")
OUTCOMES = ("same", "different", "refused-sparkconsole", "refused-runner", "refused-both")


def summary(results: Sequence[Result]) -> dict[str, Any]:
    c = collections.Counter(r.outcome for r in results)
    return {"tried": len(results), **{o: c.get(o, 0) for o in OUTCOMES},
            "env-different": sum(1 for r in results if r.env_diffs)}


def report(results: Sequence[Result], forks: Sequence[str], skipped: dict[str, str], guard_calls: list,
           verbose: bool, extra: Sequence[str] = ()) -> str:
    out: list[str] = ["Runner parity: run-recipe.py --dry-run vs sparkconsole recipe plan (vLLM serve argv)", ""]
    out.append("Normalisations (spelling only; count = times applied over all comparisons):")
    used: collections.Counter = collections.Counter()
    for r in results:
        used.update(r.applied)
    for k, text in NORMALISATIONS.items():
        out.append(f"  - {text}  [{used.get(k, 0)}]")
    if extra:
        out.append(f"Extra vLLM arguments given to both after `--`: {shlex.join(extra)}")
    out.append("")
    for fork, why in skipped.items():
        out.append(f"{fork}: skipped ({why})")
    head = (f"{'fork':<14} {'mode':<8} {'tried':>5} {'same':>5} {'diff':>5} {'ref-sc':>6} {'ref-run':>7} "
            f"{'ref-both':>8} {'env-diff':>8}")
    out += [head, "-" * len(head)]

    def row(label: str, mode: str, rs: Sequence[Result]) -> str:
        s = summary(rs)
        return (f"{label:<14} {mode:<8} {s['tried']:>5} {s['same']:>5} {s['different']:>5} "
                f"{s['refused-sparkconsole']:>6} {s['refused-runner']:>7} {s['refused-both']:>8} "
                f"{s['env-different']:>8}")
    for fork in forks:
        for mode in MODES:
            rs = [r for r in results if r.fork == fork and r.mode == mode]
            if rs:
                out.append(row(fork, mode, rs))
    for mode in MODES:
        rs = [r for r in results if r.mode == mode]
        if rs:
            out.append(row("TOTAL", mode, rs))
    files = {(r.fork, r.recipe) for r in results}
    distinct = {r.digest for r in results}
    out.append(f"{len(files)} recipe files from {len(forks)} fork(s), {len(distinct)} distinct contents")
    out.append("")
    why: collections.Counter = collections.Counter()
    for r in results:
        if r.outcome not in ("same",):
            why[(r.mode, r.outcome, r.reason)] += 1
    pre: collections.Counter = collections.Counter()
    warn: collections.Counter = collections.Counter()
    for r in results:
        for rule in r.preflight:
            pre[(r.mode, rule)] += 1
        for rule in r.preflight_warn:
            warn[(r.mode, rule)] += 1
    if pre or warn:
        out.append("Offline preflight (`recipe lint --offline`) refusing rules on planned recipes (--force overrides):")
        for mode in MODES:
            planned = [r for r in results if r.mode == mode and r.sparkconsole_argv]
            if planned:
                clean = sum(1 for r in planned if not r.preflight)
                out.append(f"  {mode:<8} {len(planned)} planned, {clean} with no refusal; "
                           + ", ".join(f"{rule}: {k}" for (m, rule), k in sorted(pre.items()) if m == mode))
                out.append(f"  {'':<8} warning only: "
                           + (", ".join(f"{rule}: {k}" for (m, rule), k in sorted(warn.items()) if m == mode) or "none"))
        out.append("")
        out.append("Each refusal (its rule, and what `recipe lint` says on the first node it names):")
        for r in results:
            said: dict[str, str] = {}
            for ln in r.preflight_lines:
                m = re.match(r"^(?:REFUSE|BLOCK) (\w+): (?:\[[^]]+\] )?(.*?)(?: — fix: .*)?(?: \(source: .*\))?$", ln)
                if m:
                    said.setdefault(m.group(1), m.group(2))
            for rule, message in said.items():
                out.append(f"  [{r.fork}] {r.recipe} {r.mode}: {rule}: {message}")
        out.append("")
    if why:
        out.append("By reason:")
        for (mode, outcome, reason), k in sorted(why.items()):
            out.append(f"  {mode:<8} {outcome:<21} {reason}: {k}")
        out.append("")
    for r in results:
        if r.outcome == "same" and not verbose and not r.env_diffs and not any(
                n.startswith("warning") for n in r.notes):
            continue
        label = f"[{r.fork}] {r.recipe} {r.mode}" + (f" on {r.nodes} nodes" if r.mode != "solo" else "")
        out.append(f"{label}: {r.outcome}" + (f" ({r.reason})" if r.reason else ""))
        for d in r.diffs:
            out.append(f"    {d}")
        for d in r.env_diffs:
            out.append(f"    env {d}")
        if r.outcome.startswith("refused"):
            if r.runner:
                out.append(f"    runner: {r.runner}")
            if r.sparkconsole:
                out.append(f"    sparkconsole: {r.sparkconsole}")
        for note in r.notes:
            out.append(f"    {note}")
    out.append("")
    out.append("docker/ssh/hf stand-ins called by the runner's dry runs: "
               + (json.dumps(guard_calls[:5]) if guard_calls else "none (nothing would have run for real)"))
    return "\n".join(out)


def smoke(sc_cmd: Sequence[str], recipe_name: str = "gpt-oss-120b") -> None:
    from sparkconsole.recipes import find_recipe
    recipe = Path(find_recipe(recipe_name).source)
    with tempfile.TemporaryDirectory(prefix="runner-parity-smoke-") as tmp:
        root = Path(tmp)
        sb = Sandbox(root / "sandbox")
        for mode in ("solo", "cluster"):
            work = root / "work" / mode
            work.mkdir(parents=True)
            ours = run_sparkconsole(sc_cmd, recipe, mode, cluster_file(root, 1 if mode == "solo" else 2), sb, work)
            if ours.argv is None:
                print(f"{recipe_name} {mode}: refused: {ours.refused}")
                continue
            print(f"{recipe_name} {mode}: {len(normalise(ours.argv, mode != 'solo').flags)} vLLM flags, "
                  f"{len(ours.env)} -e variables, {len(ours.notes)} notes")
            calls, skipped = cp.run_plan(sb.launch, cp.plan_steps(ours.raw), work / "container")
            for node, view in cp.node_views(calls, lambda n: n).items():
                aspects = cp.run_aspects(view.run or [])
                print(f"  {node}: docker run x{view.runs}, {len(aspects)} aspects, mods {view.mods or 'none'}, "
                      f"server at call {view.start_at}; steps not run: {len(skipped)}")
    print("skipped: the runner's side and the comparison (they need a spark-vllm-docker fork: --mirror)")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mirror", action="append", type=Path,
                    help="a spark-vllm-docker fork: bare git dir or checkout (repeat)")
    ap.add_argument("--sparkconsole", default=f"{sys.executable} -m sparkconsole",
                    help="how to run sparkconsole (default: this interpreter's -m sparkconsole)")
    ap.add_argument("--mode", action="append", choices=MODES,
                    help="solo; cluster (on the nodes the recipe asks for); squeeze (a recipe for more than two "
                         "Sparks on a two-node cluster file). Default: all three")
    ap.add_argument("--extra", default="", metavar="ARGS",
                    help="extra vLLM arguments given to both after `--` (e.g. --extra '--seed 42')")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--lint", action="store_true",
                    help="also run `recipe lint --offline` on each plan and count the preflight rules that refuse "
                         "(what `recipe launch` would refuse before starting anything, without --force)")
    ap.add_argument("--no-container", action="store_true",
                    help="compare the vLLM command only, not each node's docker run and mod steps")
    ap.add_argument("--non-privileged", action="store_true",
                    help="launch both non-privileged (the runner's and sparkconsole's --non-privileged)")
    ap.add_argument("--no-cache-dirs", action="store_true",
                    help="launch both without the compile caches mounted (both sides' --no-cache-dirs)")
    ap.add_argument("--json", type=Path, help="write every result as JSON here")
    ap.add_argument("--verbose", "-v", action="store_true", help="also list the recipes planned the same")
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    args = ap.parse_args(argv)
    if args.smoke:
        smoke(shlex.split(args.sparkconsole))
        return 0
    if not args.mirror:
        ap.error("--mirror is required (a spark-vllm-docker fork), or --smoke")
    modes = args.mode or list(MODES)
    extra = shlex.split(args.extra)
    sc_cmd = shlex.split(args.sparkconsole)
    results: list[Result] = []
    forks: list[str] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="runner-parity-") as tmp:
        root = Path(tmp)
        sb = Sandbox(root / "sandbox")
        jobs = []
        for i, mirror in enumerate(args.mirror):
            fork_dir = root / "forks" / str(i)
            try:
                name, ok = export_fork(mirror, fork_dir)
            except (subprocess.CalledProcessError, OSError) as exc:
                skipped[str(mirror)] = f"cannot export: {str(exc)[:80]}"
                continue
            if not ok:
                skipped[name] = "no run-recipe.py and recipes/"
                continue
            forks.append(name)
            jobs += [(name, fork_dir, p) for p in recipe_files(fork_dir)]
        launch = [f for f, on in (("--non-privileged", args.non_privileged), ("--no-cache-dirs", args.no_cache_dirs))
                  if on]
        opts = Options(tuple(extra), args.lint, tuple(launch), not args.no_container)
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as ex:
            futs = [ex.submit(check_recipe, f, d, p, sc_cmd, sb, root, modes, opts)
                    for f, d, p in jobs]
            for fut in futs:
                results += fut.result()
        guard = sb.guard_calls()
    print(report(results, forks, skipped, guard, args.verbose, extra))
    if not args.no_container:
        print()
        print(cp.report([(r.fork, r.mode, r.recipe, r.container) for r in results if r.mode != "squeeze"], forks,
                        launch, args.verbose))
    if args.json:
        args.json.write_text(json.dumps({"forks": forks, "extra": extra, "launch": launch, "skipped": skipped,
                                         "normalisations": NORMALISATIONS,
                                         "results": [asdict(r) for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
