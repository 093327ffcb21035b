"""`sparkconsole demo` start-up, as a new user sees it in a real terminal (tmux, 200x60).

    .venv/bin/python benchmarks/demo_start.py [--runs 3] [--src DIR] [--smoke]

From spawning the command until the terminal shows:
  first_frame        the whole dashboard (nodes box and footer)
  first_temperature  a node's GPU temperature ("GPU 41°C")            target: within 1.5 s
  serving            an endpoint panel reading UP (the model answered /health through the console's monitor)
and `demo --headless`'s JSON line (its endpoints, printed once they serve). The floor printed beside them is
the console's own first full frame on a one-node replayed recording (no simulator): what any console start
costs on this machine now.

`--src DIR` (repeatable) times the sparkconsole found in DIR (a checkout of another commit) for before/after
figures from one venv, runs interleaved. Prints one JSON object; medians of --runs, taken in one go on a shared machine.

`--script` times the README's own command instead: `scripts/demo` in a fresh export of this checkout (`git
archive HEAD`, no .venv), its first call (the venv made and the package installed) and then --runs more calls
(installed: nothing to install), each to its first temperature on screen.

`--smoke`: one run of each, no warming start; `--script` is skipped there (its first call installs a venv).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.tmuxserver import TMUX, capture, kill_server, kill_session, new_session  # noqa: E402

RECORDING = ROOT / "tests" / "fixtures" / "agent-h100-load.jsonl"
POLL_S = 0.01
TEMP = re.compile(r"GPU \d+°C")
UP = re.compile(r"\bUP\b")


class Pane:
    def __init__(self, cmd: str, env: dict) -> None:
        self.name = f"scd-{uuid.uuid4().hex[:8]}"
        self.started = time.perf_counter()
        new_session(self.name, cmd, env)

    def screen(self) -> str:
        return capture(self.name)

    def wait(self, pred, timeout: float = 60.0) -> float:
        while time.perf_counter() - self.started < timeout:
            if pred(self.screen()):
                return time.perf_counter() - self.started
            time.sleep(POLL_S)
        raise TimeoutError(f"screen never matched; it shows:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run([*TMUX, "send-keys", "-t", self.name, "q"], capture_output=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and subprocess.run([*TMUX, "has-session", "-t", self.name],
                                                             capture_output=True).returncode == 0:
            time.sleep(0.1)
        kill_session(self.name)


def full_frame(screen: str) -> bool:
    return "Nodes" in screen and "Quit" in screen and "╰" in screen


def one_demo(py: str, src: Path, env: dict) -> dict:
    p = Pane(f"cd {shlex.quote(str(src))} && exec {shlex.quote(py)} -m sparkconsole demo", env)
    try:
        return {"first_frame": p.wait(full_frame), "first_temperature": p.wait(lambda s: bool(TEMP.search(s))),
                "serving": p.wait(lambda s: bool(UP.search(s)))}
    finally:
        p.close()


def one_headless(py: str, src: Path, env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen([py, "-m", "sparkconsole", "demo", "--headless", "--duration", "0.1"], cwd=src, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    took = time.perf_counter() - t0
    proc.wait(60)
    if not line.startswith("{"):
        raise RuntimeError("demo --headless printed no JSON line")
    return took


def console_floor(py: str, src: Path, env: dict, tmp: Path) -> float:
    cluster = tmp / "one.yaml"
    cluster.write_text("nodes:\n  - {name: spark1, address: 127.0.0.1}\nendpoints: []\n")
    p = Pane(f"cd {shlex.quote(str(src))} && SPARKCONSOLE_STATE_DIR={shlex.quote(str(tmp / 'state'))} exec "
             f"{shlex.quote(py)} -m sparkconsole --cluster {shlex.quote(str(cluster))} console "
             f"--replay {shlex.quote(str(RECORDING))} --replay-interval 0.5", env)
    try:
        return p.wait(full_frame)
    finally:
        p.close()


def script_starts(runs: int) -> dict:
    """`scripts/demo` from a fresh export of HEAD: the first call, then `runs` more, to the first temperature."""
    with tempfile.TemporaryDirectory(prefix="sc-demo-script-") as d:
        src = Path(d) / "checkout"
        src.mkdir()
        arc = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], capture_output=True,
                             check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=arc, check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        times = []
        for i in range(runs + 1):
            p = Pane(f"cd {shlex.quote(str(src))} && exec scripts/demo", env)
            try:
                times.append(p.wait(lambda s: bool(TEMP.search(s)), timeout=600 if i == 0 else 60))
            finally:
                p.close()
    return {"first_call_s": round(times[0], 3), "later_calls": med(times[1:]), "target_s": 1.5}


def med(xs: list[float]) -> dict:
    return {"median_s": round(statistics.median(xs), 3), "max_s": round(max(xs), 3), "runs": [round(x, 3) for x in xs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--src", type=Path, action="append", help="directory holding the sparkconsole package to time "
                    "(repeat to compare checkouts: their runs are interleaved; default: this checkout)")
    ap.add_argument("--script", action="store_true", help="time scripts/demo itself, first and later calls")
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    a = ap.parse_args()
    if a.smoke:
        a.runs = 1
        if a.script:
            print("skipped: --script (its first call makes a venv and installs the project: minutes)")
            a.script = False
    if a.script:
        print(json.dumps({"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
                          "scripts_demo_first_temperature": script_starts(a.runs)}, indent=1))
        return 0
    srcs = [p.resolve() for p in (a.src or [ROOT])]
    py = sys.executable
    keys = ("floor_console_first_frame", "first_frame", "first_temperature", "serving", "headless_json")
    runs = {src: {k: [] for k in keys} for src in srcs}
    load = []
    with tempfile.TemporaryDirectory(prefix="sc-demo-bench-") as d:
        tmp = Path(d)
        for src in srcs if not a.smoke else ():
            one_headless(py, src, {**os.environ, "PYTHONPATH": str(src)})    # warm the page cache and .pyc files
        for _ in range(a.runs):
            for src in srcs:
                env = {**os.environ, "PYTHONPATH": str(src)}
                load.append(os.getloadavg()[0])
                runs[src]["floor_console_first_frame"].append(console_floor(py, src, env, tmp))
                for k, v in one_demo(py, src, env).items():
                    runs[src][k].append(v)
                runs[src]["headless_json"].append(one_headless(py, src, env))
    out = {"cpus": os.cpu_count(), "load_avg_1m": {"min": round(min(load), 2), "max": round(max(load), 2)},
           "target_first_temperature_s": 1.5,
           "by_src": {str(src): {k: med(v) for k, v in r.items()} for src, r in runs.items()}}
    for r in out["by_src"].values():
        r["first_temperature_x_floor"] = round(r["first_temperature"]["median_s"] /
                                               r["floor_console_first_frame"]["median_s"], 2)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        kill_server()
