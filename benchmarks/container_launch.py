"""Both launches of one recipe run with stand-ins, nothing for real (benchmarks/container_parity.py compares
what they did).

The runner's side: the launch-cluster.sh command line that `run-recipe.py --dry-run -d` prints (its mods resolved
against the checkout, as run-recipe.py does, and the dry run's launch script) is run by a real bash, with stand-ins
first on PATH: `docker` records its argv and answers what the script asks (`docker ps`: nothing running,
`docker image inspect`: one fixed id, anything else: success), `ssh HOST CMD` records the host and runs CMD through
bash with the same stand-ins (so a worker's `docker run` is recorded under that worker), `scp`/`rsync` record
and succeed, `sleep` returns at once, and `ip`, `ibdev2netdev`, `nc`, `nvidia-smi`, `sudo`, `curl`, `wget`, `hf`
record and fail (the fork's `.env` names the nodes, interfaces and local address, so nothing is probed). No real
docker, ssh or network is ever reached.

sparkconsole's side: the plan's steps, in their execution order, each run by bash under the node's name with the
same stand-ins and the same HOME, so `"${HF_HOME:-$HOME/.cache/huggingface}"` is expanded as the node's shell
expands it. Only `docker` and `mkdir` steps run (any other is listed, not run).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

FAKE_NET = "192.0.2."               # RFC 5737 documentation addresses: the runner's nodes, never a real host
ETH_IF = "enp1s0f1np1"
IB_IF = "rocep1s0f1,roceP2p1s0f1"
ENV_FILE = {"CLUSTER_NODES": f"{FAKE_NET}1,{FAKE_NET}2", "ETH_IF": ETH_IF, "IB_IF": IB_IF, "LOCAL_IP": f"{FAKE_NET}1"}
EXPORTED = ("launch-cluster.sh", "autodiscover.sh", "mods")     # besides run-recipe.py and recipes/
IMAGE_ID = "sha256:" + "0" * 64
LAUNCH_TIMEOUT_S = 60
GUARDED = ("ip", "ibdev2netdev", "nc", "nvidia-smi", "sudo", "curl", "wget", "hf", "huggingface-cli")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"

# Stand-ins. A call is recorded as NUL-separated fields (tool, node, argc, argv…), so any argument survives.
_RECORD = 'printf \'%s\\0\' "$(basename "$0")" "${PARITY_NODE-}" "$#" "$@" >> "$PARITY_CALLS"\n'
DOCKER = ("#!/bin/bash\n" + _RECORD
          + f'if [ "$1" = image ] && [ "$2" = inspect ]; then echo {IMAGE_ID}; fi\nexit 0\n')
# ssh [options] HOST [COMMAND…]: the remote shell joins COMMAND with spaces and runs it, as sshd does.
SSH = r'''#!/bin/bash
while [ $# -gt 0 ]; do
  case "$1" in
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
printf '%s\0' ssh "$host" "$#" "$@" >> "$PARITY_CALLS"
[ $# -eq 0 ] && exit 0
cd "$HOME" && PARITY_NODE=$host exec bash -c "$*"
'''
SUCCEED = "#!/bin/bash\n" + _RECORD + "exit 0\n"
FAIL = "#!/bin/bash\n" + _RECORD + "exit 1\n"


@dataclass(frozen=True)
class Call:
    tool: str
    node: str            # "" on the machine the launch runs on; else the ssh host (runner) or plan node (ours)
    argv: tuple[str, ...]


class LaunchSandbox:
    def __init__(self, root: Path) -> None:
        self.bin = root / "launch-bin"
        self.bin.mkdir(parents=True)
        scripts = {"docker": DOCKER, "ssh": SSH, "scp": SUCCEED, "rsync": SUCCEED, "sleep": "#!/bin/sh\nexit 0\n",
                   **{g: FAIL for g in GUARDED}}
        for name, text in scripts.items():
            p = self.bin / name
            p.write_text(text)
            p.chmod(0o755)

    def env(self, home: Path, calls: Path, **extra: str) -> dict[str, str]:
        # A clean environment: nothing of this machine's (HF_HOME, VLLM_SPARK_*, a real PATH first) leaks in.
        return {"PATH": f"{self.bin}:{SYSTEM_PATH}", "HOME": str(home), "PARITY_CALLS": str(calls),
                "LANG": "C.UTF-8", **extra}


def read_calls(path: Path) -> list[Call]:
    if not path.exists():
        return []
    fields = path.read_bytes().split(b"\0")
    out, i = [], 0
    while i + 2 < len(fields):
        tool, node, n = fields[i].decode(), fields[i + 1].decode(), int(fields[i + 2])
        out.append(Call(tool, node, tuple(f.decode("utf-8", "replace") for f in fields[i + 3:i + 3 + n])))
        i += 3 + n
    return out


def write_env_file(fork_dir: Path) -> None:
    (fork_dir / ".env").write_text("".join(f"{k}={v}\n" for k, v in ENV_FILE.items()))


# --- the runner's side ------------------------------------------------------------------------------------------

def launch_command(dry_run_out: str, fork_dir: Path, script: Path) -> list[str] | None:
    """The launch-cluster.sh argv run-recipe.py would execute, from its dry run's "What would be executed"."""
    m = re.search(r"launch-cluster\.sh is called with:\n(.*?)(?:\n\s*\n|\Z)", dry_run_out, re.S)
    if not m:
        return None
    words = shlex.split(re.sub(r"\s\\\s*\n", " ", m.group(1)))
    if not words or not words[0].endswith("launch-cluster.sh"):
        return None
    out = [str(fork_dir / "launch-cluster.sh")]
    i = 1
    while i < len(words):
        w = words[i]
        if w == "--apply-mod" and i + 1 < len(words):
            p = Path(words[i + 1]).expanduser()
            out += [w, str(p if p.is_absolute() else fork_dir / p)]     # run-recipe.py: SCRIPT_DIR / mod
            i += 2
        elif w == "--launch-script" and i + 1 < len(words):
            out += [w, str(script)]
            i += 2
        else:
            out.append(w)
            i += 1
    return out


@dataclass
class Launch:
    calls: list[Call] = field(default_factory=list)
    refused: str | None = None
    mods: list[str] = field(default_factory=list)       # --apply-mod paths, as given to launch-cluster.sh
    stray: list[Call] = field(default_factory=list)     # guarded tools the script reached


def run_runner_launch(sb: LaunchSandbox, fork_dir: Path, dry_run_out: str, script_text: str, work: Path) -> Launch:
    work.mkdir(parents=True, exist_ok=True)
    script, calls, home = work / "launch-script.sh", work / "runner-calls.bin", work / "home"
    home.mkdir(exist_ok=True)
    script.write_text(script_text)
    calls.unlink(missing_ok=True)
    argv = launch_command(dry_run_out, fork_dir, script)
    if argv is None:
        return Launch(refused="(the dry run prints no launch-cluster.sh command)")
    if not (fork_dir / "launch-cluster.sh").is_file():
        return Launch(refused="(the fork has no launch-cluster.sh)")
    # LOCAL_IP in the environment too: a runner whose autodiscover.sh reads no .env takes it from there.
    try:
        res = subprocess.run(["/bin/bash", *argv], cwd=fork_dir, capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, env=sb.env(home, calls, LOCAL_IP=ENV_FILE["LOCAL_IP"]),
                             timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Launch(refused=f"(launch-cluster.sh still running after {LAUNCH_TIMEOUT_S} s with the stand-ins)")
    rec = read_calls(calls)
    launch = Launch(calls=[c for c in rec if c.tool not in GUARDED], stray=[c for c in rec if c.tool in GUARDED],
                    mods=[argv[i + 1] for i, w in enumerate(argv[:-1]) if w == "--apply-mod"])
    if res.returncode != 0:
        lines = [ln.strip() for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
        launch.refused = next((ln for ln in lines if ln.startswith("Error")), lines[-1] if lines else
                              f"exit {res.returncode}")[:200]
    return launch


def runner_node(host: str) -> str:
    """The runner's node as the plan names it: the launching machine is the head (node1); a worker is its ssh host,
    192.0.2.K, which the plan's cluster file calls nodeK."""
    if host.startswith(FAKE_NET):
        return f"node{host[len(FAKE_NET):]}"
    return "node1"


# --- sparkconsole's side ----------------------------------------------------------------------------------------

_NODE = re.compile(r"^\[(\S+)(?: [^\]]*)?\]$")
_STEP = re.compile(r"^\s+(\d+)\. (.*)$")
_MOD_COPY = re.compile(r"^mod (\S+): copy its (\d+) file\(s\) in \((dir|zip) (.*)\)$")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class PlanStep:
    number: int
    node: str
    what: str
    line: str


def plan_steps(text: str) -> list[PlanStep]:
    """Every step of `recipe plan` output, in execution order (the plan groups them by node, numbered by order)."""
    steps, node, lines = [], "", text.splitlines()
    for i, ln in enumerate(lines):
        m = _NODE.match(ln)
        if m:
            node = m.group(1)
            continue
        s = _STEP.match(ln)
        if s and i + 1 < len(lines) and lines[i + 1].lstrip().startswith("$ "):
            steps.append(PlanStep(int(s.group(1)), node, s.group(2), lines[i + 1].lstrip()[2:]))
    return sorted(steps, key=lambda s: s.number)


def _command_word(line: str) -> str:
    words = shlex.split(line)
    if words[:2] == ["sh", "-c"] and len(words) >= 3:
        words = shlex.split(words[2])
    return next((w for w in words if not _ASSIGN.match(w)), "")


def run_plan(sb: LaunchSandbox, steps: Sequence[PlanStep], work: Path) -> tuple[list[Call], list[str]]:
    """Each docker/mkdir step run as its node's shell runs it, with the stand-ins; the others only listed."""
    calls, home = work / "plan-calls.bin", work / "home"
    home.mkdir(parents=True, exist_ok=True)
    calls.unlink(missing_ok=True)
    skipped = []
    for s in steps:
        if _command_word(s.line) not in ("docker", "mkdir"):
            skipped.append(f"{s.node}: {s.what}")
            continue
        try:
            subprocess.run(["/bin/bash", "--noprofile", "--norc", "-c", s.line], cwd=home, capture_output=True,
                           stdin=subprocess.DEVNULL, env=sb.env(home, calls, PARITY_NODE=s.node), timeout=30)
        except subprocess.TimeoutExpired:
            skipped.append(f"{s.node}: {s.what} (timed out)")
    return read_calls(calls), skipped


def plan_mod_copies(steps: Sequence[PlanStep]) -> dict[tuple[str, str], tuple[str, int]]:
    """(node, mod) → (source, files) from the plan's copy steps."""
    out = {}
    for s in steps:
        m = _MOD_COPY.match(s.what)
        if m:
            out[(s.node, m.group(1))] = (m.group(4), int(m.group(2)))
    return out
