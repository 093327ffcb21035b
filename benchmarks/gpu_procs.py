"""Per-process GPU memory, for real: what the agent reads per process against allocations of a known size, the
workload each is mapped to, and what the reading costs per tick.

    python3 benchmarks/gpu_procs.py device --out DIR       # on a machine with an NVIDIA GPU, as root
        Two processes allocate 1 GiB and 3 GiB with the CUDA driver API (ctypes: cuMemAlloc, nothing to install),
        each moved into a memory cgroup laid out as Docker lays one out (cgroup v2: system.slice/docker-<id>.scope;
        v1: memory/docker/<id>) with a 1 GiB cap, and listed by a stand-in `docker` on PATH. The real agent
        (`--gpu-source nvml`) then reads them; its `gpu_procs`, `cgroups` and nodes/workload_memory.py's figures
        are compared with the allocations. A third process ends between NVML's read and the mapping (the "gone"
        case). Writes DIR/gpu-procs-h200.json (the raw NVML answers, the /proc/PID/cgroup texts, the agent's
        ticks: tests/fixtures/nvidia-h200-gpu-procs.json is this file) and DIR/bench-gpu-procs.json (the cost).
    python3 benchmarks/gpu_procs.py --smoke                # here: the mapping's cost on this machine's processes

Cost figures (CPU ms): one nvmlDeviceGetComputeRunningProcesses per GPU; the whole reading (list + mapping,
mapping cached); a whole tick with and without it; so docs/PERFORMANCE.md can say what the agent pays per tick at
2 Hz with the list read every PROCS_REFRESH_S.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GIB = 1 << 30
CAP = 1 << 30          # the cap each allocator's cgroup gets: 1 GiB, under the 3 GiB it allocates

ALLOCATOR = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc != 0:
        print(f"error {what} {rc}", flush=True); sys.exit(1)
ok(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
print("context", flush=True)
for line in sys.stdin:
    word = line.split()
    if not word or word[0] == "exit":
        break
    if word[0] == "alloc":
        ptr = ctypes.c_uint64()
        ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(word[1]))), "cuMemAlloc")
        print("allocated", flush=True)
"""

DOCKER_STANDIN = r"""#!/usr/bin/env python3
import json, os, sys
state = json.load(open(os.environ["GPU_PROCS_DOCKER_STATE"]))
args = sys.argv[1:]
if args[:1] == ["ps"]:
    print("\n".join(state))
elif args[:1] == ["inspect"]:
    for cid in [a for a in args[1:] if a in state]:
        c = state[cid]
        print(json.dumps({"Id": cid, "Name": "/" + c["name"], "State": {"Status": "running", "Pid": c["pid"],
                          "StartedAt": "2026-01-01T00:00:00Z", "OOMKilled": False, "ExitCode": 0},
                          "RestartCount": 0, "Config": {"Image": "stand-in", "Labels": {}},
                          "HostConfig": {"Memory": c["cap"]}}))
else:
    sys.exit(1)
"""


class Allocator:
    """A process holding a CUDA context, allocating on request (cuMemAlloc: plain device memory)."""

    def __init__(self, cgroup_dir: str | None = None) -> None:
        def enter() -> None:            # in the child, before python starts: into the cgroup
            if cgroup_dir:
                Path(cgroup_dir, "cgroup.procs").write_text(str(os.getpid()))
        self.p = subprocess.Popen([sys.executable, "-c", ALLOCATOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, preexec_fn=enter)  # noqa: PLW1509 — one write, no threads in between
        self._expect("context")

    def _expect(self, word: str) -> None:
        assert self.p.stdout is not None
        line = self.p.stdout.readline().strip()
        if line != word:
            raise RuntimeError(f"allocator {self.p.pid}: {line!r}, expected {word!r}")

    def alloc(self, n: int) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(f"alloc {n}\n")
        self.p.stdin.flush()
        self._expect("allocated")

    def end(self) -> None:
        if self.p.poll() is None:
            assert self.p.stdin is not None
            self.p.stdin.write("exit\n")
            self.p.stdin.flush()
            self.p.wait(20)


def nvml_list() -> list[dict]:
    import pynvml as nv
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        for pr in nv.nvmlDeviceGetComputeRunningProcesses(h):
            out.append({"gpu": i, "pid": pr.pid, "usedGpuMemory": pr.usedGpuMemory})
    return out


def cgroup_memory(cgroups: list[dict]) -> dict:
    """Each cgroup's usage and events now (what the kernel charges to it, and whether its cap fired)."""
    out = {}
    for cg in cgroups:
        d = Path(cg.get("dir", "/nonexistent"))
        out[cg["name"]] = {f: (d / f).read_text().strip() for f in ("memory.current", "memory.usage_in_bytes",
                                                                   "memory.events", "memory.failcnt")
                           if (d / f).exists()}
    return out


def make_cgroup(cid: str) -> dict:
    """A memory cgroup where Docker would put container `cid`, capped at CAP; which layout this host has."""
    root = Path("/sys/fs/cgroup")
    v2 = (root / "cgroup.controllers").exists()
    if v2:
        ctl = (root / "cgroup.controllers").read_text().split()
        if "memory" in ctl:
            for d in (root, root / "system.slice"):
                d.mkdir(exist_ok=True)
                try:
                    (d / "cgroup.subtree_control").write_text("+memory")
                except OSError as exc:
                    return {"layout": "v2", "error": f"+memory in {d}: {exc}"}
        d = root / "system.slice" / f"docker-{cid}.scope"
        d.mkdir(parents=True, exist_ok=True)
        if (d / "memory.max").exists():
            (d / "memory.max").write_text(str(CAP))
        return {"layout": "v2", "dir": str(d), "controllers": ctl}
    d = root / "memory" / "docker" / cid
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.limit_in_bytes").write_text(str(CAP))
    return {"layout": "v1", "dir": str(d)}


def device(args: argparse.Namespace) -> dict:
    import pynvml as nv

    from sparkconsole import agent as agent_mod
    from sparkconsole.nodes.samples import Tick
    from sparkconsole.nodes.workload_memory import workload_memory

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    nv.nvmlInit()
    h0 = nv.nvmlDeviceGetHandleByIndex(0)
    rec: dict = {
        "_about": "Recorded by benchmarks/gpu_procs.py device on the machine below: the raw answers of "
                  "nvmlDeviceGetComputeRunningProcesses around cuMemAlloc allocations of a known size, each process "
                  "in a Docker-layout memory cgroup (1 GiB cap) listed by a stand-in docker CLI, and the real "
                  "agent's ticks reading them.",
        "machine": {"host": platform.node(), "kernel": platform.release(), "python": sys.version.split()[0],
                    "gpu": nv.nvmlDeviceGetName(h0), "driver": nv.nvmlSystemGetDriverVersion(),
                    "pynvml": getattr(nv, "__version__", "?"),
                    "self_cgroup": Path("/proc/self/cgroup").read_text()},
        "steps": [], "failures": {}}

    def save() -> None:
        (out / "gpu-procs-h200.json").write_text(json.dumps(rec, indent=1, default=str))

    def step(name: str, **extra) -> None:
        rec["steps"].append({"step": name, "time": time.time(), "nvml": nvml_list(), **extra})
        save()

    tmp = Path(tempfile.mkdtemp(prefix="gpu-procs-"))
    allocs: list[Allocator] = []
    cgroups: list[dict] = []
    try:
        step("before")
        # Each allocator runs in its cgroup from its start, so memory.current holds what the CUDA process charges
        # to it (its CPU side) from the first byte; the cap (CAP) is what `docker run --memory` would set.
        state = {}
        for name in ("alloc-1g", "alloc-3g"):
            cid = uuid.uuid4().hex + uuid.uuid4().hex
            cg = make_cgroup(cid)
            cg["name"], cg["id"] = name, cid
            cgroups.append(cg)
        a1, a3 = (Allocator(cg.get("dir")) for cg in cgroups)
        allocs += [a1, a3]
        for cg, a in zip(cgroups, allocs, strict=True):
            cg["pid"] = a.p.pid
            state[cg["id"]] = {"name": cg["name"], "pid": a.p.pid, "cap": CAP}
        step("contexts", pids=[a1.p.pid, a3.p.pid], cgroup_memory=cgroup_memory(cgroups))
        a1.alloc(GIB)
        step("a1 +1 GiB", cgroup_memory=cgroup_memory(cgroups))
        a3.alloc(3 * GIB)
        smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
        step("a3 +3 GiB", nvidia_smi_compute_apps_mib=smi.stdout, cgroup_memory=cgroup_memory(cgroups))
        for cg in cgroups:
            cg["proc_cgroup"] = Path(f"/proc/{cg['pid']}/cgroup").read_text()
        rec["cgroups"] = cgroups
        bindir = tmp / "bin"
        bindir.mkdir()
        (bindir / "docker").write_text(DOCKER_STANDIN)
        (bindir / "docker").chmod(0o755)
        (tmp / "state.json").write_text(json.dumps(state))
        env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "GPU_PROCS_DOCKER_STATE": str(tmp / "state.json")}
        r = subprocess.run([sys.executable, "-m", "sparkconsole.agent", "--gpu-source", "nvml", "--count", "8",
                            "--interval", "0.5", "--container-interval", "0.5"], capture_output=True, text=True,
                           env=env, timeout=120, cwd=ROOT)
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
        rec["agent"] = {"rc": r.returncode, "stderr": r.stderr[-2000:], "lines": lines}
        last = Tick.from_json(lines[-1], time.time()) if len(lines) > 1 else None
        if last is not None:
            rec["workload_memory"] = {k: {"gpu_b": w.gpu_b, "cgroup_b": w.cgroup_b, "cap_b": w.cap_b,
                                          "reason": w.reason, "total_b": w.total_b}
                                      for k, w in workload_memory(last).items()}
        save()

        # The "gone" case for real: a third process is in NVML's list when it is read, and has ended before mapping.
        ag = Allocator()
        allocs.append(ag)
        ag.alloc(GIB // 2)
        src = agent_mod.NvmlSource()
        errors: list[str] = []
        listed = src.processes(errors)
        ag.end()
        deadline = time.time() + 10
        while Path(f"/proc/{ag.p.pid}").exists() and time.time() < deadline:
            time.sleep(0.05)
        ids = {cg["id"]: cg["name"] for cg in cgroups}
        mapped = agent_mod.ProcessMapper("/proc").map(listed if isinstance(listed, list) else [], ids)
        tick = Tick.from_json({"type": "tick", "time": time.time(), "gpu_procs": {"read_at": time.time(),
                                                                                   "procs": mapped}}, time.time())
        rec["gone"] = {"pid": ag.p.pid, "listed": listed, "mapped": mapped, "errors": errors,
                       "workload_memory": {k: {"gpu_b": w.gpu_b, "reason": w.reason}
                                           for k, w in workload_memory(tick).items()}}
        save()

        rec["cost"] = cost(agent_mod, src, ids, args.n)
        save()
    except Exception as exc:  # noqa: BLE001 — record what failed; the rest was saved
        rec["failures"]["run"] = f"{type(exc).__name__}: {exc}"[:500]
        save()
    finally:
        for a in allocs:
            try:
                a.end()
            except Exception:  # noqa: BLE001
                a.p.kill()
        for cg in cgroups:
            if "dir" in cg:
                with contextlib.suppress(OSError):
                    os.rmdir(cg["dir"])
        shutil.rmtree(tmp, ignore_errors=True)
    return rec


def per_call_ms(fn, n: int) -> dict:
    for _ in range(min(5, n)):
        fn()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return {"n": n, "cpu_ms": round((time.process_time() - c0) / n * 1000, 4),
            "wall_ms": round((time.perf_counter() - w0) / n * 1000, 4)}


def cost(agent_mod, src, ids: dict, n: int) -> dict:
    """CPU per call: the process list alone, the reading with its mapping cached and uncached, and whole ticks."""
    import pynvml as nv
    hs = src.handles
    errors: list[str] = []
    figs: dict = {"processes_listed": len(src.processes(errors))}
    figs["nvml_list_per_gpu"] = per_call_ms(lambda: [nv.nvmlDeviceGetComputeRunningProcesses(h) for h in hs], n)
    figs["source_processes"] = per_call_ms(lambda: src.processes(errors), n)
    every = agent_mod.GpuProcsReader(src, "/proc", refresh_s=0.0)
    figs["reading_every_call_mapping_cached"] = per_call_ms(lambda: every.reading(ids, errors), n)
    mapper = agent_mod.ProcessMapper("/proc")
    listed = src.processes(errors)
    figs["mapping_uncached"] = per_call_ms(lambda: mapper.map(listed, dict(ids)), n)
    figs["tick_without_procs"] = per_call_ms(lambda: agent_mod.make_tick(0, src, "/proc", errors), n)
    # at 2 Hz with a read every PROCS_REFRESH_S: one read in PROCS_REFRESH_S × 2 ticks
    figs["tick_with_procs_read_every_tick"] = per_call_ms(lambda: (agent_mod.make_tick(0, src, "/proc", errors),
                                                                   every.reading(ids, errors)), n)
    per = figs["tick_without_procs"]["cpu_ms"]
    figs["tick_at_2hz_with_refresh"] = round(per + figs["reading_every_call_mapping_cached"]["cpu_ms"]
                                             / (agent_mod.PROCS_REFRESH_S * 2), 4)
    figs["refresh_s"] = agent_mod.PROCS_REFRESH_S
    figs["errors"] = errors[:5]
    return figs


def smoke() -> dict:
    """Here (no GPU): the mapping of this machine's own processes, cached and not."""
    from sparkconsole import agent as agent_mod
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()][:16]
    procs = [{"gpu": 0, "pid": p, "used_b": GIB} for p in pids]
    mapper = agent_mod.ProcessMapper("/proc")
    mapped = mapper.map(procs, {})
    return {"processes": len(procs), "mapping_uncached": per_call_ms(lambda: agent_mod.ProcessMapper("/proc").map(
        procs, {}), 200), "mapping_cached": per_call_ms(lambda: mapper.map(procs, {}), 2000),
        "where": sorted({m.get("where") or "container" for m in mapped})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a few seconds here: the mapping's cost (no GPU needed)")
    sub = ap.add_subparsers(dest="mode")
    d = sub.add_parser("device")
    d.add_argument("--out", required=True)
    d.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    if args.mode == "device":
        figs = device(args)
        (Path(args.out) / "bench-gpu-procs.json").write_text(json.dumps(figs.get("cost"), indent=1))
        print(json.dumps({k: figs.get(k) for k in ("machine", "workload_memory", "gone", "cost", "failures")},
                         indent=1, default=str))
        return 0 if not figs["failures"] else 1
    print(json.dumps(smoke(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
