"""Telemetry figures: node-side agent cost (on a GPU machine) and console-side staleness over SSH (here).

    python benchmarks/telemetry.py device --out DIR [--load-s 35]
        On a machine with an NVIDIA GPU: CPU time per tick of the NVML path vs spawning nvidia-smi per tick
        (targets: <= 2 ms/tick with NVML, >= 10x less CPU than nvidia-smi), the whole agent process's CPU per
        tick, and recordings of the agent's own output idle and under a matmul load (DIR/agent-h100-*.jsonl).
        Uses only the standard library, the agent and the machine's pynvml (+ torch for the load).

    python benchmarks/telemetry.py agent-cost [--agent FILE ...] [--n 2000] [--out DIR]
        The agent's CPU per tick against its floors, measured in one run: NVML (when the machine has a GPU) — the
        in-process cost of exactly the calls a tick makes, each timed alone — and the host readings against
        reading the same /proc files in a loop; then the whole agent process per tick (start-up measured
        apart and taken out). Several --agent files (e.g. the agent before and after a change) are measured
        side by side. Standard library and the machine's pynvml only.

    python benchmarks/telemetry.py ssh [--seconds 20] [--interval 0.1] [--nodes 2]
        Here: two real sshd nodes on loopback, the ClusterMonitor streaming agents over SSH; staleness =
        console receive time - node sample time per tick, p50/p99 (target: p99 within 50 ms), and the console's
        parse cost per line against the budget of 32 nodes at 2 Hz.

    python benchmarks/telemetry.py --smoke
        A few seconds: agent-cost and ssh at their smallest (device needs an NVIDIA GPU and says it skipped).

Prints one JSON object of figures (also written to DIR/bench-*.json when --out is given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "sparkconsole" / "agent"
# the agent run in place, as a node runs it (from ROOT: the device machine need not have the package installed)
AGENT_ARGV = [sys.executable, "-m", "sparkconsole.agent"]


def _load_agent(path: Path = AGENT, name: str = "sc_agent"):
    """The agent by path: its package folder (sparkconsole/agent/), or one agent.py file as older checkouts have it.
    The device machine need not have the package's dependencies."""
    import importlib.util
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(name, path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod          # its modules import each other by the package's name
    spec.loader.exec_module(mod)
    return mod


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ---------------------------------------------------------------- device

def per_tick_cpu(fn, n: int) -> dict:
    """CPU (this process + children it waited for) and wall time per call of fn, in ms."""
    for _ in range(min(5, n)):
        fn()
    c0, k0, w0 = time.process_time(), _children_cpu(), time.perf_counter()
    for _ in range(n):
        fn()
    c1, k1, w1 = time.process_time(), _children_cpu(), time.perf_counter()
    return {"n": n, "cpu_ms": round(((c1 - c0) + (k1 - k0)) / n * 1000, 4), "wall_ms": round((w1 - w0) / n * 1000, 4)}


def agent_process_cpu(source: str, ticks: int, interval: float) -> dict:
    """The whole agent as a process: CPU seconds per tick (startup included, then amortised)."""
    k0, w0 = _children_cpu(), time.perf_counter()
    r = subprocess.run([*AGENT_ARGV, "--gpu-source", source, "--count", str(ticks), "--interval",
                        str(interval), "--containers", "none"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    k1, w1 = _children_cpu(), time.perf_counter()
    lines = r.stdout.splitlines()
    return {"source": source, "ticks": ticks, "rc": r.returncode, "lines": len(lines),
            "cpu_ms_per_tick": round((k1 - k0) / max(ticks, 1) * 1000, 4), "wall_s": round(w1 - w0, 2),
            "first_errors": next((json.loads(x).get("errors") for x in lines[1:2]), None)}


def record(out: Path, name: str, seconds: float, interval: float = 0.5) -> subprocess.Popen:
    fh = open(out / name, "w")  # noqa: SIM115 — closed when the process ends
    return subprocess.Popen([*AGENT_ARGV, "--gpu-source", "nvml", "--interval", str(interval),
                             "--count", str(int(seconds / interval)), "--containers", "none"], stdout=fh,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)


LOAD = """
import sys, time, torch
secs = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t0 = time.time(); n = 0
while time.time() - t0 < secs:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize(); n += 20
print(f"{n} matmuls, {n * 2 * 8192**3 / (time.time() - t0) / 1e12:.0f} TFLOP/s")
"""


def smi_csv(agent) -> str:
    r = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(agent.SMI_FIELDS), "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=30)
    return r.stdout


def device(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    agent = _load_agent()
    figs: dict = {"host": platform.node(), "python": sys.version.split()[0]}
    try:
        import pynvml
        figs["pynvml"] = getattr(pynvml, "__version__", "?")
    except ImportError as exc:
        figs["pynvml"] = f"missing: {exc}"
    errors: list = []
    figs["failures"] = {}

    def step(name, fn):
        """One measurement; a failure is recorded and the rest still runs (device time is scarce)."""
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            figs["failures"][name] = f"{type(exc).__name__}: {exc}"[:300]
        (out / "bench-device.json").write_text(json.dumps(figs, indent=1, default=str))

    # 1. Per-tick cost in-process: the GPU readings alone, then a whole tick (/proc too).
    srcs: dict = {}

    def nvml_cost():
        nv = srcs["nvml"] = agent.NvmlSource()
        figs["nvml_hello"] = nv.hello()
        figs["nvml_sample"] = per_tick_cpu(lambda: nv.sample(errors), args.n)
        figs["nvml_whole_tick"] = per_tick_cpu(lambda: agent.make_tick(0, nv, "/proc", errors), args.n)
        figs["nvml_first_tick"] = nv.sample(errors)
        figs["nvml_unsupported"] = sorted(map(list, nv.unsupported))
        figs["nvml_errors"] = errors[:5]

    def smi_cost():
        smi = agent.SmiSource()
        figs["smi_sample"] = per_tick_cpu(lambda: smi.sample(errors), args.n_smi)
        figs["smi_vs_nvml_cpu_ratio"] = round(figs["smi_sample"]["cpu_ms"] / max(figs["nvml_sample"]["cpu_ms"], 1e-9), 1)
    step("nvml_cost", nvml_cost)
    step("smi_cost", smi_cost)

    # 2. The agent as a process (what a node pays): NVML vs nvidia-smi vs no GPU, amortised over many ticks.
    def process_cost():
        figs["agent_process"] = [agent_process_cpu(s, t, 0.02) for s, t in (("none", 300), ("nvml", 300),
                                                                            ("nvidia-smi", 60))]
        (out / "smi-idle.csv").write_text(smi_csv(agent))
    step("process_cost", process_cost)

    # 3. Recordings: idle, then a load run with idle before and a cool-down after.
    def recordings():
        p = record(out, "agent-h100-idle.jsonl", args.idle_s)
        p.wait()
        total = 5 + args.load_s + 10
        p = record(out, "agent-h100-load.jsonl", total)
        time.sleep(5)
        load = subprocess.Popen([sys.executable, "-c", LOAD, str(args.load_s)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(args.load_s * 0.8)
        (out / "smi-load.csv").write_text(smi_csv(agent))
        lo, le = load.communicate()
        figs["load"] = (lo.strip() or le.strip()[-300:])
        p.wait()
        q = subprocess.run(["nvidia-smi", "-q", "-d", "PERFORMANCE,TEMPERATURE,POWER"], capture_output=True, text=True)
        (out / "smi-q-after-load.txt").write_text(q.stdout)
        ticks = [json.loads(x) for x in (out / "agent-h100-load.jsonl").read_text().splitlines()[1:]]
        g = [t["gpus"][0] for t in ticks if t.get("gpus")]
        figs["load_recording"] = {
            "ticks": len(ticks), "temp_first": g[0].get("temp_c") if g else None,
            "temp_max": max((x.get("temp_c", 0) for x in g), default=None),
            "power_max_w": max((x.get("power_w", 0) for x in g), default=None),
            "ticks_with_sw_power_cap": sum("sw_power_cap" in x.get("reasons", ()) for x in g),
            "reason_us_last": g[-1].get("reason_us") if g else None,
        }
    step("recordings", recordings)
    return figs


# ---------------------------------------------------------------- agent cost vs floors

PROC_FILES_PER_TICK = ("meminfo", "pressure/memory", "swaps", "sys/vm/overcommit_memory", "sys/vm/min_free_kbytes",
                       "sys/vm/swappiness")


def proc_floor(n: int) -> dict:
    """Reading the files a tick's host readings come from, nothing else: open, read, close."""
    paths = [Path("/proc") / p for p in PROC_FILES_PER_TICK]
    paths = [p for p in paths if p.exists()]

    def read_all():
        for p in paths:
            with open(p, "rb") as fh:
                fh.read()

    def read_two():       # the two that change from tick to tick (memory, pressure)
        for p in paths[:2]:
            with open(p, "rb") as fh:
                fh.read()
    devnull = open(os.devnull, "w")  # noqa: SIM115
    line = "x" * 1000

    def wake():          # what any timed loop pays per tick: one line written and flushed, one short sleep
        devnull.write(line + "\n")
        devnull.flush()
        time.sleep(0.01)
    return {"all_files": per_tick_cpu(read_all, n), "meminfo_and_pressure": per_tick_cpu(read_two, n),
            "write_and_sleep_10ms": per_tick_cpu(wake, min(n, 300)), "files": [str(p) for p in paths]}


def nvml_floor(n: int) -> dict:
    """The NVML calls a tick makes, straight through pynvml in a loop (no dicts, no error handling): per call and
    together. The same readings as NvmlSource.sample, including the reason counters' field-values call."""
    import pynvml as nv
    nv.nvmlInit()
    hs = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    ids = [74, 76, 269, 270, 271]
    calls = {
        "temperature": lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "reasons": reasons,
        "field_values(5 counters)": lambda h: nv.nvmlDeviceGetFieldValues(h, ids),
        "power": nv.nvmlDeviceGetPowerUsage,
        "power_limit": nv.nvmlDeviceGetEnforcedPowerLimit,
        "sm_clock": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "utilization": nv.nvmlDeviceGetUtilizationRates,
        "memory": nv.nvmlDeviceGetMemoryInfo,
    }
    ok = {}
    for name, fn in calls.items():
        try:
            fn(hs[0])
            ok[name] = fn
        except nv.NVMLError:
            pass
    per_call = {name: per_tick_cpu(lambda fn=fn: [fn(h) for h in hs], n) for name, fn in ok.items()}

    def every(names):
        fns = [ok[x] for x in names if x in ok]
        return lambda: [fn(h) for h in hs for fn in fns]
    per_tick = [k for k in ok if k != "power_limit"]      # power limit: read every 10 s by the new agent
    # A candidate: power in the counters' field-values call (185: the 1 s average nvmlDeviceGetPowerUsage gives on
    # Ampere and newer; 186: instant). Its cost and its values beside the power call's, for the record.
    both = ids + [185, 186]
    cand: dict = {}
    try:
        cand["field_values(counters+power)"] = per_tick_cpu(lambda: [nv.nvmlDeviceGetFieldValues(h, both) for h in hs], n)
        fv = nv.nvmlDeviceGetFieldValues(hs[0], both)
        cand["power_usage_mw"] = nv.nvmlDeviceGetPowerUsage(hs[0])
        cand["field_185_186"] = [(f.nvmlReturn, int(f.value.uiVal)) for f in fv[-2:]]
    except Exception as exc:  # noqa: BLE001
        cand["error"] = str(exc)[:200]
    return {"gpus": len(hs), "per_call": per_call, "candidate": cand,
            "all_calls_of_a_tick_before": per_tick_cpu(every(list(ok)), n),
            "all_calls_of_a_tick_now": per_tick_cpu(every(per_tick), n),
            "six_calls_no_counters": per_tick_cpu(every(["temperature", "reasons", "power", "sm_clock", "utilization",
                                                         "memory"]), n)}


def _agent_run(path: Path) -> tuple[list[str], Path]:
    """(argv, cwd) that run the agent at `path`: a package folder as a module from the checkout holding it, an older
    checkout's agent.py as a script."""
    if path.is_dir():
        return [sys.executable, "-m", f"{path.parent.name}.{path.name}"], path.parent.parent
    return [sys.executable, str(path)], ROOT


def process_cost(path: Path, source: str, ticks: int, interval: float) -> dict:
    """The agent as a process: CPU per tick with its start-up (the same command with --count 1) taken out."""
    argv, cwd = _agent_run(path)

    def run(count: int) -> float:
        k0 = _children_cpu()
        r = subprocess.run([*argv, "--gpu-source", source, "--count", str(count), "--interval",
                            str(interval), "--containers", "none"], capture_output=True, text=True, timeout=600, cwd=cwd)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-300:])
        return _children_cpu() - k0
    starts = sorted(run(1) for _ in range(5))
    start = starts[2]
    total = run(ticks)
    return {"source": source, "ticks": ticks, "startup_cpu_ms": round(start * 1000, 2),
            "cpu_ms_per_tick_with_startup": round(total / ticks * 1000, 4),
            "cpu_ms_per_tick_steady": round(max(total - start, 0) / (ticks - 1) * 1000, 4)}


def agent_cost(args) -> dict:
    paths = [Path(p).resolve() for p in (args.agent or [AGENT])]
    errors: list = []
    figs: dict = {"host": platform.node(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
                  "floors": {"proc": proc_floor(args.n)}, "agents": {}, "failures": {}}
    try:
        figs["floors"]["nvml"] = nvml_floor(args.n)
        gpu = True
    except Exception as exc:  # noqa: BLE001 — no GPU here: the host half still means something
        figs["failures"]["nvml_floor"] = f"{type(exc).__name__}: {exc}"[:300]
        gpu = False
    for k, path in enumerate(paths):
        agent = _load_agent(path, f"sc_agent_{k}")
        f: dict = {}
        none = agent.NoGpu()
        f["host_tick"] = per_tick_cpu(lambda: agent.make_tick(0, none, "/proc", errors), args.n)
        if gpu:
            try:
                nv = agent.NvmlSource()
                f["nvml_sample"] = per_tick_cpu(lambda: nv.sample(errors), args.n)
                f["nvml_whole_tick"] = per_tick_cpu(lambda: agent.make_tick(0, nv, "/proc", errors), args.n)
                f["tick_bytes"] = len(json.dumps(agent.make_tick(0, nv, "/proc", errors), separators=(",", ":")))
                if hasattr(agent, "REASON_COUNTERS_REFRESH_S"):     # the worst case: counters read every tick
                    keep, agent.REASON_COUNTERS_REFRESH_S = agent.REASON_COUNTERS_REFRESH_S, 0.0
                    f["nvml_sample_counters_every_tick"] = per_tick_cpu(lambda: nv.sample(errors), args.n)
                    agent.REASON_COUNTERS_REFRESH_S = keep
            except Exception as exc:  # noqa: BLE001
                figs["failures"][f"{path.name}:nvml"] = f"{type(exc).__name__}: {exc}"[:300]
        f["process"] = [process_cost(path, s, args.ticks, 0.01) for s in (("none", "nvml") if gpu else ("none",))]
        if gpu and args.ticks_2hz:       # as a node runs it: 2 Hz, so refreshes fall where they would
            f["process_2hz"] = process_cost(path, "nvml", args.ticks_2hz, 0.5)
        figs["agents"][str(path)] = f
    nvf = figs["floors"].get("nvml")
    for f in figs["agents"].values():
        if nvf and "nvml_sample" in f:
            f["nvml_sample_x_floor"] = round(f["nvml_sample"]["cpu_ms"] / nvf["all_calls_of_a_tick_before"]["cpu_ms"], 2)
            steady = next(p for p in f["process"] if p["source"] == "nvml")["cpu_ms_per_tick_steady"]
            f["process_tick_x_nvml_floor"] = round(steady / nvf["all_calls_of_a_tick_before"]["cpu_ms"], 2)
            if "process_2hz" in f:
                f["process_2hz_tick_x_nvml_floor"] = round(
                    f["process_2hz"]["cpu_ms_per_tick_steady"] / nvf["all_calls_of_a_tick_before"]["cpu_ms"], 2)
        f["host_tick_x_proc_floor"] = round(f["host_tick"]["cpu_ms"] / figs["floors"]["proc"]["all_files"]["cpu_ms"], 2)
    figs["errors"] = errors[:5]
    return figs


# ---------------------------------------------------------------- ssh (here)

async def ssh_staleness(seconds: float, interval: float, n_nodes: int = 2) -> dict:
    import tempfile

    sys.path.insert(0, str(ROOT))
    from sparkconsole.nodes.monitor import ClusterMonitor
    from tests.testbed.sshd import start_sshd_nodes

    root = Path(tempfile.mkdtemp(prefix="sc-bench-sshd-"))
    cluster = start_sshd_nodes(root / "nodes")
    try:
        # n_nodes console-side nodes spread over the two sshd servers: one SSH connection and agent each,
        # GPU readings replayed from the real H100 recording so every line has a realistic size.
        from dataclasses import replace
        replay = ROOT / "tests" / "fixtures" / "agent-h100-load.jsonl"
        base = cluster.cluster_config(interval_s=interval,
                                      agent_args=("--containers", "none", "--gpu-source", f"replay:{replay}"))
        nodes = tuple(replace(base.nodes[i % 2], name=f"n{i:02d}", role="head" if i == 0 else "worker")
                      for i in range(n_nodes))
        cfg = replace(base, nodes=nodes)
        mon = ClusterMonitor(cfg, history=100000)
        await mon.start()
        import asyncio
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20 and any(nm.last is None for nm in mon.nodes.values()):
            await asyncio.sleep(0.05)
        first = time.monotonic() - t0
        for nm in mon.nodes.values():
            nm.history.clear()
        c0, w0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        console_cpu = (time.process_time() - c0) / (time.perf_counter() - w0)
        lat = [(t.received - t.time) * 1000 for nm in mon.nodes.values() for t in nm.history]
        missed = sum(max(0, (nm.history[-1].seq - nm.history[0].seq + 1) - len(nm.history))
                     for nm in mon.nodes.values() if nm.history)
        await mon.stop()
    finally:
        cluster.stop()
    return {"nodes": n_nodes, "interval_s": interval, "console_cpu_pct_of_a_core": round(console_cpu * 100, 1), "ticks": len(lat), "missed_seqs": missed,
            "first_tick_s": round(first, 2), "staleness_ms_p50": round(pct(lat, 0.5), 2),
            "staleness_ms_p99": round(pct(lat, 0.99), 2), "staleness_ms_max": round(max(lat), 2)}


def parse_cost(n: int = 20000) -> dict:
    sys.path.insert(0, str(ROOT))
    from sparkconsole.config import NodeConfig
    from sparkconsole.nodes.monitor import NodeMonitor
    fix = ROOT / "tests" / "fixtures" / "agent-h100-load.jsonl"
    lines = [x for x in fix.read_text().splitlines() if '"tick"' in x] if fix.exists() else []
    if not lines:
        return {"skipped": "no recorded ticks"}
    nm = NodeMonitor(NodeConfig(name="n", address="127.0.0.1"), None, interval=0.5, history=600)
    t0 = time.process_time()
    for i in range(n):
        nm.handle_line(lines[i % len(lines)])
    per = (time.process_time() - t0) / n
    return {"us_per_line": round(per * 1e6, 2), "line_bytes": round(statistics.mean(map(len, lines))),
            "cpu_share_32_nodes_2hz": f"{per * 64 * 100:.3f}%"}


def ssh(args) -> dict:
    import asyncio
    figs = asyncio.run(ssh_staleness(args.seconds, args.interval, args.nodes))
    figs["parse"] = parse_cost(getattr(args, "parse_lines", 20000))
    return figs


def smoke() -> dict:
    """Each mode at its smallest, where it can run here."""
    figs: dict = {"device": {"skipped": "needs an NVIDIA GPU and its NVML (run it on a GPU machine)"}}
    figs["agent-cost"] = agent_cost(argparse.Namespace(agent=None, n=50, ticks=5, ticks_2hz=0))
    figs["ssh"] = ssh(argparse.Namespace(seconds=1.0, interval=0.1, nodes=2, parse_lines=500))
    return figs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    sub = ap.add_subparsers(dest="mode")
    d = sub.add_parser("device")
    d.add_argument("--out", required=True)
    d.add_argument("--n", type=int, default=500)
    d.add_argument("--n-smi", type=int, default=30)
    d.add_argument("--idle-s", type=float, default=10)
    d.add_argument("--load-s", type=float, default=35)
    c = sub.add_parser("agent-cost")
    c.add_argument("--agent", action="append", help="agent to measure: its package folder, or an older checkout's agent.py (repeat; default: this checkout's)")
    c.add_argument("--n", type=int, default=2000)
    c.add_argument("--ticks", type=int, default=500)
    c.add_argument("--ticks-2hz", type=int, default=30, help="ticks of the 2 Hz process run (0: skip)")
    c.add_argument("--out")
    s = sub.add_parser("ssh")
    s.add_argument("--seconds", type=float, default=20)
    s.add_argument("--interval", type=float, default=0.1)
    s.add_argument("--nodes", type=int, default=2, help="console-side nodes over the two sshd servers")
    s.add_argument("--out")
    args = ap.parse_args()
    if args.smoke:
        print(json.dumps(smoke(), indent=1, default=str))
        return 0
    if args.mode is None:
        ap.error("a mode is needed: device, agent-cost or ssh (or --smoke)")
    figs = {"device": device, "agent-cost": agent_cost, "ssh": ssh}[args.mode](args)
    text = json.dumps(figs, indent=1, default=str)
    print(text)
    if getattr(args, "out", None):
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"bench-{args.mode}.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
