"""The node agent: samples GPU, host memory, OOM-guard inputs and containers; prints one JSON line per tick.

Runs on a node with nothing installed: the console streams this file over SSH stdin (see
nodes/monitor.py BOOTSTRAP) and runs it with the node's own `python3`. Standard library only at import
time; the NVML bindings (`pynvml`) are imported when asked for and the console sends them along when the
node has none. Wire format: sparkconsole/nodes/samples.py (the field names there are the contract).

Readings a source cannot give are left out, never reported as 0.

    python3 agent.py [--interval 0.5] [--container-interval 5] [--count N]
        [--gpu-source auto|nvml|nvidia-smi|none|replay:FILE|sim:FILE] [--proc-root /proc]
        [--containers docker|none] [--docker-host URL] [--cgroup-root /sys/fs/cgroup] [--watch-stdin]

--watch-stdin: end when stdin reaches end-of-file (the console left); the bootstrap sets it.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time

# Types for the checker only: the node imports nothing it does not run (`typing` included).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Protocol

    class GpuSource(Protocol):
        name: str
        simulated: bool

        def hello(self) -> dict[str, Any]: ...

        def sample(self, errors: list[str]) -> list[dict[str, Any]] | None: ...

        def processes(self, errors: list[str]) -> list[dict[str, Any]] | str: ...

# Imported where used (the nvidia-smi fallback, the container poller, the hello): a node pays for starting the
# agent on every connection, and most of the standard library is not needed for a tick.

AGENT_VERSION = "0.1.0"

# NVML clock-event reason bits, in the order samples.REASON_BITS gives them.
REASON_BITS = (
    ("idle", 0x1), ("app_clocks", 0x2), ("sw_power_cap", 0x4), ("hw_slowdown", 0x8), ("sync_boost", 0x10),
    ("sw_thermal", 0x20), ("hw_thermal", 0x40), ("hw_power_brake", 0x80), ("display_clock", 0x100),
)
# NVML field ids of the clock-event time counters (nanoseconds): what `nvidia-smi -q` lists as
# "Clocks Event Reasons Counters". Ids 269-271 exist on drivers >= 535; older ones answer per field.
REASON_COUNTER_FIELDS = (("sw_power_cap", 74), ("sync_boost", 76), ("sw_thermal", 269), ("hw_thermal", 270),
                         ("hw_power_brake", 271))
REASON_COUNTER_NAMES = tuple(name for name, _ in REASON_COUNTER_FIELDS)
REASON_COUNTER_IDS = [fid for _, fid in REASON_COUNTER_FIELDS]
# Readings that change on an operator's command, not from tick to tick: read at most this often, repeated between.
POWER_LIMIT_REFRESH_S = 10.0
REASON_COUNTERS_REFRESH_S = 2.0
GUARDS_REFRESH_S = 1.0
# The GPU process list (one nvmlDeviceGetComputeRunningProcesses per GPU, then /proc/PID/cgroup for a PID not seen
# before): read at most this often, repeated between. Measured on an H200 (benchmarks/telemetry.py procs): see
# docs/PERFORMANCE.md; a runaway's growth is judged over a minute, so a reading every 2 s loses nothing.
PROCS_REFRESH_S = 2.0

# The nvidia-smi fallback's query: one CSV row per GPU, parsed by field name (parse_smi_csv).
SMI_FIELDS = (
    "index", "uuid", "name", "temperature.gpu", "power.draw", "power.limit", "clocks.sm", "clocks.max.sm",
    "utilization.gpu", "utilization.memory", "memory.total", "memory.used", "clocks_event_reasons.active",
)
SMI_HELLO_FIELDS = ("index", "uuid", "name", "driver_version")
_NVML_NOT_AVAILABLE = (1 << 64) - 1        # NVML_VALUE_NOT_AVAILABLE for an unsigned long long (no figure)
_SMI_MISSING = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown", "[unknown error]", "err!", "[err!]"}


def reasons_from_mask(mask: int) -> list[str]:
    return [name for name, bit in REASON_BITS if mask & bit]


def _num(text: str) -> float | None:
    t = text.strip()
    if t.lower() in _SMI_MISSING:
        return None
    try:
        return float(int(t, 16)) if t.lower().startswith("0x") else float(t)
    except ValueError:
        return None


def _intish(v: float | None) -> float | int | None:
    return int(v) if v is not None and v == int(v) else v


def parse_smi_csv(text: str, fields: tuple[str, ...] | list[str] = SMI_FIELDS) -> list[dict[str, Any]]:
    """GPU dicts in the tick schema from `nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`."""
    import csv
    import io

    gpus = []
    for pos, row in enumerate(csv.reader(io.StringIO(text), skipinitialspace=True)):
        if not row or len(row) != len(fields):
            continue
        raw = {f: v.strip() for f, v in zip(fields, row)}
        g: dict[str, Any] = {"index": int(_num(raw["index"]) or 0) if "index" in raw else pos}
        if raw.get("name") and raw["name"].lower() not in _SMI_MISSING:
            g["name"] = raw["name"]
        for key, field in (("temp_c", "temperature.gpu"), ("power_w", "power.draw"), ("power_limit_w", "power.limit"),
                           ("sm_clock_mhz", "clocks.sm"), ("sm_clock_max_mhz", "clocks.max.sm"),
                           ("util_pct", "utilization.gpu"), ("mem_util_pct", "utilization.memory")):
            v = _num(raw.get(field, ""))
            if v is not None:
                g[key] = _intish(v)
        total, used = _num(raw.get("memory.total", "")), _num(raw.get("memory.used", ""))
        if "memory.total" in raw:
            if total is None:
                g["unified"] = True          # GB10: framebuffer memory "Not Supported" — unified with the host
            else:
                g["unified"] = False
                g["mem_total_b"] = int(total * 1048576)   # nounits: MiB
                if used is not None:
                    g["mem_used_b"] = int(used * 1048576)
        mask = _num(raw.get("clocks_event_reasons.active", ""))
        if mask is not None:
            g["reasons_mask"] = int(mask)
            g["reasons"] = reasons_from_mask(int(mask))
        gpus.append(g)
    return gpus


# ---------------------------------------------------------------- GPU sources

class NoGpu:
    name = "none"
    simulated = False

    def hello(self) -> dict[str, Any]:
        return {"gpus": []}

    def sample(self, errors: list[str]) -> list[dict[str, Any]] | None:
        return None

    def processes(self, errors: list[str]) -> list[dict[str, Any]] | str:
        return "no GPU source on this node"


def import_pynvml() -> Any:
    """The node's pynvml, else the copy the console sent along (compiled only now, when NVML is wanted)."""
    try:
        import pynvml  # noqa: PLC0415 — only nodes with NVML need it
        return pynvml
    except ImportError:
        blob = getattr(sys, "_sparkconsole_pynvml", None)
        if not blob:
            raise
    import ctypes
    try:
        ctypes.CDLL("libnvidia-ml.so.1")    # no driver: skip compiling 300 kB of bindings for nothing
    except OSError:
        raise RuntimeError("NVML Shared Library Not Found (libnvidia-ml.so.1)") from None
    import types
    import zlib
    mod = types.ModuleType("pynvml")
    mod.__file__ = "pynvml.py"
    sys.modules["pynvml"] = mod
    exec(compile(zlib.decompress(blob), "pynvml.py", "exec"), mod.__dict__)  # noqa: S102 — the console's own copy
    return mod


class NvmlSource:
    """NVML through pynvml: handles and static readings once, a handful of calls per tick."""
    name = "nvml"
    simulated = False

    def __init__(self) -> None:
        pynvml = import_pynvml()
        self.nv = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.static = [self._static(h) for h in self.handles]
        # A call the driver answers NOT_SUPPORTED for is never asked again (GB10: memory info).
        self.unsupported: set[tuple[int, str]] = set()
        self.reason_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self._limits: list[Any] | None = None
        self._limits_at = 0.0
        self._counters: dict[int, tuple[float, object, dict[str, int] | None]] = {}   # gpu -> (read at, mask then, µs)
        self._procs_fn: list[Callable[..., Any]] | None = None   # the process-list calls still to try, newest first

    def _try(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 — NVML raises a family of NVMLError_* per reading
            return None

    def _static(self, h: Any) -> dict[str, Any]:
        nv = self.nv
        s: dict[str, Any] = {}
        for key, kind in (("shutdown_c", nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
                          ("slowdown_c", nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                          ("gpu_max_c", nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)):
            v = self._try(nv.nvmlDeviceGetTemperatureThreshold, h, kind)
            if isinstance(v, int) and v > 0:
                s[key] = v
        v = self._try(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
        if isinstance(v, int) and v > 0:
            s["sm_clock_max_mhz"] = v
        return s

    def hello(self) -> dict[str, Any]:
        nv = self.nv
        gpus = []
        for i, h in enumerate(self.handles):
            name = self._try(nv.nvmlDeviceGetName, h)
            uuid = self._try(nv.nvmlDeviceGetUUID, h)
            gpus.append({"index": i, "name": _text(name), "uuid": _text(uuid)})
        return {"gpus": gpus, "driver": _text(self._try(nv.nvmlSystemGetDriverVersion)),
                "nvml_version": _text(self._try(nv.nvmlSystemGetNVMLVersion))}

    def _read(self, i: int, what: str, fn: Callable[..., Any], *args: Any, errors: list[str]) -> Any:
        if (i, what) in self.unsupported:
            return None
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            if getattr(exc, "value", None) in (self.nv.NVML_ERROR_NOT_SUPPORTED, self.nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                self.unsupported.add((i, what))
            else:
                errors.append(f"nvml gpu{i} {what}: {exc}")
            return None

    def _power_limits(self, errors: list[str]) -> list[Any]:
        """The enforced power limit per GPU: an operator's `nvidia-smi -pl` changes it, a tick does not, so it is
        read every POWER_LIMIT_REFRESH_S and repeated in the ticks between."""
        now = time.monotonic()
        if self._limits is None or now - self._limits_at >= POWER_LIMIT_REFRESH_S:
            fn = self.nv.nvmlDeviceGetEnforcedPowerLimit
            self._limits = [self._read(i, "power_limit", fn, h, errors=errors) for i, h in enumerate(self.handles)]
            self._limits_at = now
        return self._limits

    def _reason_counters(self, i: int, h: Any, mask: object, errors: list[str]) -> dict[str, int] | None:
        """The clock-event time counters (µs), from one nvmlDeviceGetFieldValues. On an H100 that one call costs
        ~0.68 ms of CPU, 50x the six other readings together, so it is made when the reasons mask changes (the
        tick that shows a throttle starting or ending carries fresh counters) and otherwise every
        REASON_COUNTERS_REFRESH_S; the ticks between repeat the last values (cumulative counters: they move only
        while a reason is active)."""
        now = time.monotonic()
        last = self._counters.get(i)
        if last is not None and last[1] == mask and now - last[0] < REASON_COUNTERS_REFRESH_S:
            return last[2]
        counters = self._read(i, "reason_counters", self.nv.nvmlDeviceGetFieldValues, h, REASON_COUNTER_IDS,
                              errors=errors)
        us = None
        if counters is not None:
            us = {}
            for name, fv in zip(REASON_COUNTER_NAMES, counters):
                if fv.nvmlReturn == 0:
                    us[name] = int(fv.value.ullVal // 1000)   # ns -> us, as nvidia-smi -q shows them
        self._counters[i] = (now, mask, us)
        return us

    def sample(self, errors: list[str]) -> list[dict[str, Any]]:
        # Per GPU: temperature, reasons, power, SM clock, utilisation, memory each tick; the reason counters (one
        # nvmlDeviceGetFieldValues) and the power limit when they can have moved; no call the driver already said
        # it does not support. Static values (thresholds, max clock) come from self.static, read once.
        nv = self.nv
        read = self._read
        unsupported = self.unsupported
        limits = self._power_limits(errors)
        out = []
        for i, h in enumerate(self.handles):
            g: dict[str, Any] = {"index": i}
            g.update(self.static[i])
            t = read(i, "temp", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU, errors=errors)
            if t is not None:
                g["temp_c"] = t
            mask = read(i, "reasons", self.reason_fn, h, errors=errors)
            if mask is not None:
                g["reasons_mask"] = int(mask)
                g["reasons"] = reasons_from_mask(int(mask))
            us = self._reason_counters(i, h, mask, errors)
            if us:
                g["reason_us"] = us
            p = read(i, "power", nv.nvmlDeviceGetPowerUsage, h, errors=errors)
            if p is not None:
                g["power_w"] = round(p / 1000.0, 3)
            if limits[i] is not None:
                g["power_limit_w"] = round(limits[i] / 1000.0, 3)
            c = read(i, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM, errors=errors)
            if c is not None:
                g["sm_clock_mhz"] = c
            u = read(i, "util", nv.nvmlDeviceGetUtilizationRates, h, errors=errors)
            if u is not None:
                g["util_pct"] = u.gpu
                g["mem_util_pct"] = u.memory
            m = read(i, "mem", nv.nvmlDeviceGetMemoryInfo, h, errors=errors)
            if m is not None:
                g["mem_total_b"] = int(m.total)
                g["mem_used_b"] = int(m.used)
            # NOT_SUPPORTED memory info = unified memory (GB10): the host's memory is the GPU's.
            g["unified"] = (i, "mem") in unsupported
            out.append(g)
        return out

    def processes(self, errors: list[str]) -> list[dict[str, Any]] | str:
        """[{"gpu", "pid", "used_b"}] of every compute process on every GPU (used_b left out where NVML has no
        figure), or why there is no list. A GB10 answers it although it has no memory info (Syllo/nvtop pull
        request 511); PIDs are the host's, so the agent must run in the host's PID namespace (it does, over SSH)."""
        nv = self.nv
        if self._procs_fn is None:
            names = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2")
            self._procs_fn = [f for f in (getattr(nv, n, None) for n in names) if f is not None]
        out: list[dict[str, Any]] = []
        for i, h in enumerate(self.handles):
            while True:
                if not self._procs_fn:
                    return "this NVML has no per-process memory call (nvmlDeviceGetComputeRunningProcesses)"
                try:
                    procs = self._procs_fn[0](h)
                    break
                except nv.NVMLError as exc:
                    code = getattr(exc, "value", None)
                    if code == nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                        self._procs_fn.pop(0)           # an older driver: the older version of the call
                        continue
                    if code == nv.NVML_ERROR_NOT_SUPPORTED:
                        return f"NVML gives no per-process memory on GPU {i} (NOT_SUPPORTED)"
                    errors.append(f"nvml gpu{i} processes: {exc}")
                    return f"NVML's process list failed on GPU {i}: {str(exc)[:80]}"
            for pr in procs:
                pid = getattr(pr, "pid", None)
                if not isinstance(pid, int) or pid <= 0:
                    continue
                d: dict[str, Any] = {"gpu": i, "pid": pid}
                used = getattr(pr, "usedGpuMemory", None)
                if isinstance(used, int) and 0 <= used < _NVML_NOT_AVAILABLE:
                    d["used_b"] = used
                out.append(d)
        return out


class SmiSource:
    """`nvidia-smi --query-gpu` per tick: the fallback where NVML bindings cannot load."""
    name = "nvidia-smi"
    simulated = False

    def __init__(self) -> None:
        import shutil

        exe = shutil.which("nvidia-smi")
        if not exe:
            raise RuntimeError("nvidia-smi not found")
        self.exe = exe

    def _query(self, fields: tuple[str, ...] | list[str]) -> str:
        import subprocess

        return subprocess.run([self.exe, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10, check=True).stdout

    def hello(self) -> dict[str, Any]:
        import csv
        import io

        rows = list(csv.reader(io.StringIO(self._query(SMI_HELLO_FIELDS)), skipinitialspace=True))
        gpus = [{"index": int(r[0]), "uuid": r[1].strip(), "name": r[2].strip()} for r in rows if len(r) == 4]
        driver = rows[0][3].strip() if rows and len(rows[0]) == 4 else None
        return {"gpus": gpus, "driver": driver}

    def sample(self, errors: list[str]) -> list[dict[str, Any]] | None:
        import subprocess

        try:
            return parse_smi_csv(self._query(SMI_FIELDS))
        except (subprocess.SubprocessError, OSError) as exc:
            errors.append(f"nvidia-smi: {str(exc).splitlines()[0][:160]}")
            return None

    def processes(self, errors: list[str]) -> list[dict[str, Any]] | str:
        return "per-process GPU memory is read through NVML only (this node's agent uses nvidia-smi)"


class ReplaySource:
    """Replays the `gpus` of recorded agent ticks (JSON lines), in order, looping: tests and demos on real data."""
    name = "replay"
    simulated = False

    def __init__(self, path: str) -> None:
        self.frames: list[list[Any]] = []
        self.procs: list[Any] = []            # each frame's recorded gpu_procs (None where it had none)
        self.recorded_hello: dict[str, Any] = {}
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if d.get("type") == "hello":
                    self.recorded_hello = d
                elif d.get("type") == "tick" and isinstance(d.get("gpus"), list):
                    self.frames.append(d["gpus"])
                    self.procs.append(d.get("gpu_procs"))
        if not any(isinstance(x, dict) for x in self.procs):
            self.procs = []
        if not self.frames:
            raise RuntimeError(f"no ticks with gpus in {path}")
        self.pos = 0

    def hello(self) -> dict[str, Any]:
        h = self.recorded_hello
        return {"gpus": h.get("gpus") or [{"index": g.get("index", 0)} for g in self.frames[0]],
                "driver": h.get("driver"), "nvml_version": h.get("nvml_version")}

    def sample(self, errors: list[str]) -> list[dict[str, Any]]:
        frame = self.frames[self.pos % len(self.frames)]
        self.pos += 1
        return frame

    def processes(self, errors: list[str]) -> list[dict[str, Any]] | str:
        """The recorded tick's process list as the node mapped it (its PIDs are another machine's)."""
        rec = self.procs[(self.pos - 1) % len(self.procs)] if self.procs else None
        if not isinstance(rec, dict):
            return "the recording has no per-process GPU reading"
        if rec.get("reason"):
            return str(rec["reason"])
        procs = rec.get("procs")
        return [{**p, "where": p.get("where") or ("host" if not p.get("container") else None)}
                for p in procs if isinstance(p, dict)] if isinstance(procs, list) else "no process list recorded"


class SimSource:
    """A simulator-owned JSON file ({"gpus": [...], "hello": {...}}), re-read every tick (written atomically)."""
    name = "sim"
    simulated = True

    def __init__(self, path: str) -> None:
        self.path = path
        self.last: dict[str, Any] = self._load() or {}

    def _load(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                d = json.load(fh)
            return d if isinstance(d, dict) else None
        except (OSError, ValueError):
            return None

    def hello(self) -> dict[str, Any]:
        h = {"gpus": [{"index": g.get("index", i), "name": g.get("name")} for i, g in enumerate(self.last.get("gpus") or [])]}
        h.update(self.last.get("hello") or {})
        return h

    def sample(self, errors: list[str]) -> list[dict[str, Any]] | None:
        d = self._load()
        if d is None:
            errors.append(f"sim: cannot read {self.path}")
        else:
            self.last = d
        gpus = self.last.get("gpus")
        return gpus if isinstance(gpus, list) else None

    def processes(self, errors: list[str]) -> list[dict[str, Any]] | str:
        """The simulated node's process list ({"gpu", "pid", "used_b"} of its simulated servers' real PIDs),
        mapped to containers by the agent as a real one is (the node's /proc/PID/cgroup under --proc-root)."""
        procs = self.last.get("procs")
        if not isinstance(procs, list):
            return "the simulated node publishes no process list"
        return [{k: p[k] for k in ("gpu", "pid", "used_b") if k in p} for p in procs if isinstance(p, dict)]


def _text(v: object) -> str | None:
    if v is None:
        return None
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def open_gpu_source(spec: str, errors: list[str]) -> GpuSource:
    if spec.startswith("replay:"):
        return ReplaySource(spec[len("replay:"):])
    if spec.startswith("sim:"):
        return SimSource(spec[len("sim:"):])
    if spec == "none":
        return NoGpu()
    if spec in ("auto", "nvml"):
        try:
            return NvmlSource()
        except Exception as exc:  # noqa: BLE001 — no library, no driver, no GPU: all mean "try the next source"
            errors.append(f"nvml: {str(exc)[:160] or type(exc).__name__}")
            if spec == "nvml":
                return NoGpu()
    if spec in ("auto", "nvidia-smi"):
        import shutil

        try:
            return SmiSource()
        except Exception as exc:  # noqa: BLE001
            if spec == "nvidia-smi" or shutil.which("nvidia-smi"):
                errors.append(f"nvidia-smi: {str(exc)[:160]}")
        return NoGpu()
    raise SystemExit(f"agent: unknown --gpu-source {spec!r}")


# ---------------------------------------------------------------- host readings

def read_meminfo(proc_root: str) -> dict[str, Any] | None:
    keys = {"MemTotal": "total_kb", "MemAvailable": "available_kb", "Cached": "cached_kb",
            "SwapTotal": "swap_total_kb", "SwapFree": "swap_free_kb"}
    try:
        with open(os.path.join(proc_root, "meminfo"), encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        k, _, rest = line.partition(":")
        if k in keys:
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[keys[k]] = int(parts[0])
                if len(out) == len(keys):
                    break            # SwapFree is line ~15 of ~55: the rest is not read into a tick
    return out or None


def read_pressure(proc_root: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(proc_root, "pressure", "memory"), encoding="ascii") as fh:
            text = fh.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in ("some", "full"):
            for kv in parts[1:]:
                k, _, v = kv.partition("=")
                if k == "avg10":
                    try:
                        out[parts[0] + "_avg10"] = float(v)
                    except ValueError:
                        pass
    return out or None


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# earlyoom: found through its systemd unit's cgroup (one read); a process scan (every process's comm, ~5 ms for
# a few hundred) only for one started by hand, at most this often while it is not found.
EARLYOOM_SCAN_S = 600.0
EARLYOOM_UNIT = "system.slice/earlyoom.service/cgroup.procs"
# the agent's process name (comm), so earlyoom's --avoid can name it; it still reads as a python process to ps
AGENT_NAME = b"python3-scagent"
CGROUP_ROOT = ["/sys/fs/cgroup"]  # --cgroup-root (main sets it)


class EarlyOomWatch:
    """Whether earlyoom is installed and running on the node, and its arguments (the guard judges --prefer/--avoid)."""

    def __init__(self, cgroup_root: str = "/sys/fs/cgroup") -> None:
        self.cgroup_root = cgroup_root
        self.pid: int | None = None
        self.args: list[str] = []
        self._scanned = float("-inf")
        self._installed: bool | None = None

    def _found(self, proc_root: str, pid: int) -> bool:
        if _comm(proc_root, pid) != "earlyoom":
            return False
        self.pid = pid
        try:
            with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as fh:
                self.args = [a.decode(errors="replace") for a in fh.read().split(b"\0")[1:] if a][:32]
        except OSError:
            self.args = []
        return True

    def read(self, proc_root: str) -> dict[str, Any]:
        if self.pid is not None and _comm(proc_root, self.pid) != "earlyoom":
            self.pid, self.args = None, []
        if self.pid is None:
            try:
                with open(os.path.join(self.cgroup_root, EARLYOOM_UNIT), encoding="ascii") as fh:
                    pids = [int(x) for x in fh.read().split()[:4]]
            except (OSError, ValueError):
                pids = []
            any(self._found(proc_root, pid) for pid in pids)
        now = time.monotonic()
        if self.pid is None and now - self._scanned >= EARLYOOM_SCAN_S:
            self._scanned = now
            import shutil
            self._installed = shutil.which("earlyoom") is not None or any(
                os.path.exists(d + "/earlyoom") for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin"))
            any(self._found(proc_root, int(n)) for n in os.listdir(proc_root) if n.isdigit())
        if self.pid is not None:
            return {"installed": True, "pid": self.pid, "args": self.args}
        return {"installed": self._installed} if self._installed is not None else {}


def _comm(proc_root: str, pid: int) -> str | None:
    try:
        with open(os.path.join(proc_root, str(pid), "comm"), encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def name_self(name: bytes = AGENT_NAME) -> None:
    """Set this process's name (comm, what ps and earlyoom see) to `name`; nothing where prctl is missing."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)     # PR_SET_NAME
    except (OSError, AttributeError, TypeError):
        pass


_earlyoom: dict[str, EarlyOomWatch] = {}


def read_guards(proc_root: str) -> dict[str, Any]:
    g: dict[str, Any] = {}
    try:
        with open(os.path.join(proc_root, "swaps"), encoding="utf-8", errors="replace") as fh:
            g["swaps"] = [ln.split()[0] for ln in fh.read().splitlines()[1:] if ln.split()]
    except OSError:
        pass
    for key in ("overcommit_memory", "min_free_kbytes", "swappiness"):
        v = _read_int(os.path.join(proc_root, "sys", "vm", key))
        if v is not None:
            g[key] = v
    eo = _earlyoom.setdefault(proc_root, EarlyOomWatch(CGROUP_ROOT[0])).read(proc_root)
    if eo:
        g["earlyoom"] = eo
    return g


# ---------------------------------------------------------------- containers

_INSPECT_FORMAT = "{{json .}}"


# Past this a cgroup v1 memory.limit_in_bytes means "no limit" (the kernel writes PAGE_COUNTER_MAX there).
_NO_LIMIT = 1 << 60


def find_cgroup_memory(pid: int, proc_root: str = "/proc",
                       cgroup_root: str = "/sys/fs/cgroup") -> tuple[tuple[str, str] | None, str | None]:
    """((usage file, limit file), None) of the memory cgroup that process `pid` (a container's init) lives in, or
    (None, why not).

    cgroup v2 (DGX OS 7): <root>/<path>/memory.current and memory.max; v1 (older hosts, this test bed):
    <root>/memory/<path>/memory.usage_in_bytes and memory.limit_in_bytes."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None, f"its process {pid} has no readable /proc/{pid}/cgroup"
    v1 = False
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            v1 = True
            d = os.path.join(cgroup_root, "memory", parts[2].lstrip("/"))
            if os.path.exists(os.path.join(d, "memory.usage_in_bytes")):
                return (os.path.join(d, "memory.usage_in_bytes"), os.path.join(d, "memory.limit_in_bytes")), None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            d = os.path.join(cgroup_root, parts[2].lstrip("/"))
            if os.path.exists(os.path.join(d, "memory.current")):
                return (os.path.join(d, "memory.current"), os.path.join(d, "memory.max")), None
    if v1:
        return None, "its memory cgroup's usage file is not under " + os.path.join(cgroup_root, "memory")
    return None, "no memory cgroup file (a cgroup v1 host without the memory controller)"


def cgroup_memory_files(pid: int, proc_root: str = "/proc",
                        cgroup_root: str = "/sys/fs/cgroup") -> tuple[str, str] | None:
    """find_cgroup_memory's files alone: None when they cannot be read."""
    return find_cgroup_memory(pid, proc_root, cgroup_root)[0]


def container_id_in_cgroup(text: str) -> str | None:
    """The Docker container id a /proc/PID/cgroup names, in any of Docker's layouts: cgroup v2 or v1 under
    systemd (`…/system.slice/docker-<id>.scope`) or cgroupfs (`…/docker/<id>`, nested too). None: in no container."""
    for marker in ("docker-", "/docker/"):
        at = text.find(marker)
        while at >= 0:
            cid = text[at + len(marker):at + len(marker) + 64]
            if len(cid) == 64 and all(ch in "0123456789abcdef" for ch in cid):
                return cid
            at = text.find(marker, at + 1)
    return None


class ProcessMapper:
    """GPU process PIDs → the container each runs in (/proc/PID/cgroup → a container id → its name), remembered per
    PID while the container list stays the same: a process is mapped once, not every read."""

    def __init__(self, proc_root: str) -> None:
        self.proc_root = proc_root
        self._ids: dict[str, str] | None = None
        self._known: dict[int, dict[str, Any]] = {}      # pid -> {"comm", "container" | "where"}

    def map(self, procs: list[dict[str, Any]], ids: dict[str, str]) -> list[dict[str, Any]]:
        """`procs` as a source gives them ({"gpu", "pid", "used_b"}), each with the container it runs in or where
        it is instead: "host" (in no container), "gone" (no /proc entry: it ended, or lives in another PID
        namespace), "unlisted" (a container cgroup the docker poll does not list yet)."""
        if ids != self._ids:          # a container came or went: map every PID again
            self._ids, self._known = dict(ids), {}
        keep: dict[int, dict[str, Any]] = {}
        out = []
        for p in procs:
            if "container" in p or "where" in p:      # mapped already (a replayed recording)
                out.append({k: v for k, v in p.items() if v is not None})
                continue
            pid = p["pid"]
            m = self._known.get(pid) or self._map(pid, ids)
            if m.get("where") != "gone":
                keep[pid] = m
            out.append({**p, **m})
        self._known = keep
        return out

    def _map(self, pid: int, ids: dict[str, str]) -> dict[str, Any]:
        base = os.path.join(self.proc_root, str(pid))
        try:
            with open(os.path.join(base, "cgroup"), encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            return {"where": "gone"}
        m: dict[str, Any] = {}
        try:
            with open(os.path.join(base, "comm"), encoding="utf-8", errors="replace") as fh:
                m["comm"] = fh.read().strip()[:32]
        except OSError:
            pass
        cid = container_id_in_cgroup(text)
        if cid is None:
            m["where"] = "host"
        elif cid in ids:
            m["container"] = ids[cid]
        else:
            m["where"] = "unlisted"
        return m


def read_cgroup_memory(files: dict[str, tuple[str, str]], missing: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """[{"name", "current_b", "max_b"}] for each running container's cgroup ({name: (usage, limit)});
    max_b is left out when the cgroup has no limit; [{"name", "reason"}] for each in `missing` (no file to read).
    Read every tick: two small files per container."""
    out: list[dict[str, Any]] = [{"name": n, "reason": why} for n, why in (missing or {}).items()]
    for name, (usage, limit) in files.items():
        cur = _read_int(usage)
        if cur is None:
            continue              # the container just stopped; the poller drops it on its next pass
        c = {"name": name, "current_b": cur}
        try:
            with open(limit, encoding="ascii") as fh:
                text = fh.read().strip()
            lim = int(text) if text.isdigit() else None
        except (OSError, ValueError):
            lim = None
        if lim is not None and 0 < lim < _NO_LIMIT:
            c["max_b"] = lim
        out.append(c)
    return out


def container_from_inspect(d: dict[str, Any]) -> dict[str, Any]:
    st = d.get("State") or {}
    hc = d.get("HostConfig") or {}
    health = (st.get("Health") or {}).get("Status")
    c = {"name": (d.get("Name") or "").lstrip("/") or d.get("Id", "?")[:12],
         "image": (d.get("Config") or {}).get("Image"), "state": st.get("Status"), "health": health,
         "started_at": st.get("StartedAt"), "restart_count": d.get("RestartCount"),
         "memory_limit_b": hc.get("Memory"), "oom_killed": st.get("OOMKilled"), "exit_code": st.get("ExitCode")}
    # sparkconsole's own labels only: which launch a container belongs to (nodes/launches.py)
    labels = {k: v for k, v in ((d.get("Config") or {}).get("Labels") or {}).items()
              if k.startswith("sparkconsole.") and isinstance(v, str)}
    if labels:
        c["labels"] = labels
    return {k: v for k, v in c.items() if v is not None}


class ContainerPoller:
    """Reads containers from the docker CLI in a thread, so a slow daemon never delays a tick."""

    def __init__(self, interval: float, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> None:
        import shutil

        self.interval = interval
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root
        self.exe = shutil.which("docker")
        self.result: list[dict[str, Any]] | None = None
        self.error: str | None = None
        import threading

        self.lock = threading.Lock()
        self.wake = threading.Event()
        # running container name -> (usage file, limit file), or why it has none; container id -> name. Each is
        # replaced whole by the poller's thread: the tick loop reads whichever dict is current.
        self.cgroup_files: dict[str, tuple[str, str]] = {}
        self.cgroup_missing: dict[str, str] = {}
        self.ids: dict[str, str] = {}
        if self.exe:
            threading.Thread(target=self._loop, name="containers", daemon=True).start()

    def _once(self) -> list[dict[str, Any]]:
        import subprocess

        assert self.exe is not None          # the poller's thread runs only where docker was found

        ids = subprocess.run([self.exe, "ps", "-aq", "--no-trunc"], capture_output=True, text=True, timeout=20,
                             check=True).stdout.split()
        if not ids:
            return []
        out = subprocess.run([self.exe, "inspect", "--format", _INSPECT_FORMAT, *ids], capture_output=True,
                             text=True, timeout=20).stdout
        conts = []
        files, missing, names = {}, {}, {}
        own = cgroup_memory_files(os.getpid(), self.proc_root, self.cgroup_root)
        for line in out.splitlines():
            try:
                d = json.loads(line)
                c = container_from_inspect(d)
            except (ValueError, AttributeError):
                continue   # a container removed between ps and inspect
            conts.append(c)
            if isinstance(d.get("Id"), str):
                names[d["Id"]] = c["name"]
            pid = (d.get("State") or {}).get("Pid")
            if c.get("state") == "running" and isinstance(pid, int) and pid > 0:
                f, why = find_cgroup_memory(pid, self.proc_root, self.cgroup_root)
                # a process in the agent's own memory cgroup has no cgroup of its own: that would be the host's
                if f and f == own:
                    f, why = None, "it shares the agent's own memory cgroup"
                if f:
                    files[c["name"]] = f
                else:
                    missing[c["name"]] = why or "no memory cgroup file"
        self.cgroup_files, self.cgroup_missing, self.ids = files, missing, names
        return conts

    def _loop(self) -> None:
        import subprocess

        while True:
            try:
                res, err = self._once(), None
            except subprocess.CalledProcessError as exc:
                res, err = None, "docker: " + ((exc.stderr or "").strip().splitlines() or ["exit %d" % exc.returncode])[-1][:160]
            except (subprocess.SubprocessError, OSError) as exc:
                res, err = None, f"docker: {str(exc)[:160]}"
            with self.lock:
                self.result, self.error = res, err
            self.wake.wait(self.interval)

    def take(self) -> tuple[list[dict[str, Any]] | None, str | None]:
        """The newest reading not handed out yet (None when none came since), and its error."""
        with self.lock:
            res, err = self.result, self.error
            self.result, self.error = None, None
        return res, err


# ---------------------------------------------------------------- main loop

def _boot_id(proc_root: str) -> str | None:
    try:
        with open(os.path.join(proc_root, "sys", "kernel", "random", "boot_id"), encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def make_hello(source: GpuSource, proc_root: str, interval: float) -> dict[str, Any]:
    import socket

    u = os.uname()
    h: dict[str, Any] = {
        "type": "hello", "agent_version": AGENT_VERSION, "hostname": socket.gethostname() or u.nodename,
        "kernel": u.release, "boot_id": _boot_id(proc_root), "driver": None, "nvml_version": None,
        "gpu_source": source.name, "simulated": source.simulated, "interval_s": interval, "time": time.time(),
        "gpus": []}
    h.update(source.hello())
    h["type"] = "hello"
    return {k: v for k, v in h.items() if v is not None}


def make_tick(seq: int, source: GpuSource, proc_root: str, errors: list[str]) -> dict[str, Any]:
    t: dict[str, Any] = {"type": "tick", "seq": seq, "time": time.time()}
    gpus = source.sample(errors)
    if gpus is not None:
        t["gpus"] = gpus
    mem = read_meminfo(proc_root)
    if mem is not None:
        t["mem"] = mem
    pressure = read_pressure(proc_root)
    if pressure is not None:
        t["pressure"] = pressure
    t["guards"] = guards_now(proc_root)
    return t


class GpuProcsReader:
    """The tick's `gpu_procs`: the source's process list mapped to containers, read every PROCS_REFRESH_S and
    repeated in the ticks between (with the node time it was read)."""

    def __init__(self, source: GpuSource, proc_root: str, refresh_s: float = PROCS_REFRESH_S) -> None:
        self.source = source
        self.proc_root = proc_root
        self.mapper = ProcessMapper(proc_root)
        self.refresh_s = refresh_s
        self.last: dict[str, Any] | None = None
        self._at = float("-inf")
        self._ids: dict[str, str] | None = None

    def reading(self, ids: dict[str, str], errors: list[str]) -> dict[str, Any]:
        now = time.monotonic()
        # read again when due, and at once when the container list changed (a container started or stopped)
        if self.last is None or now - self._at >= self.refresh_s or ids != self._ids:
            self._at, self._ids = now, dict(ids)
            got = self.source.processes(errors)
            mapped = self.mapper.map(got, ids) if not isinstance(got, str) else []
            if isinstance(got, str):
                self.last = {"reason": got}
            elif mapped and all(m.get("where") == "gone" for m in mapped):
                # The driver's PIDs are the host's: an agent in another PID namespace (inside a container) finds none
                # of them here (MiaAI-Lab/sparkDash pull request 10). Not "no GPU memory held": not measured.
                self.last = {"reason": f"none of the {len(mapped)} PIDs NVML lists is in {self.proc_root}: the agent "
                                       "runs in another PID namespace (a container?), or they all just ended; it "
                                       "must run on the host"}
            else:
                self.last = {"read_at": time.time(), "procs": mapped}
        return self.last


_guards_cache: dict[str, tuple[float, dict[str, Any]]] = {}


def guards_now(proc_root: str) -> dict[str, Any]:
    """read_guards at most every GUARDS_REFRESH_S (swap and vm sysctls change on an operator's command; four
    file reads a tick for them were a third of the host readings' cost)."""
    now = time.monotonic()
    hit = _guards_cache.get(proc_root)
    if hit is None or now - hit[0] >= GUARDS_REFRESH_S:
        hit = _guards_cache[proc_root] = (now, read_guards(proc_root))
    return hit[1]


def _stdin_closed(timeout: float) -> bool:
    """Waits up to `timeout` on stdin; True once the console has gone (end-of-file)."""
    r, _, _ = select.select([0], [], [], max(timeout, 0))
    if not r:
        return False
    try:
        return os.read(0, 65536) == b""
    except OSError:
        return True


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="agent")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--container-interval", type=float, default=5.0)
    ap.add_argument("--count", type=int, default=0, help="stop after N ticks (0: run until stopped)")
    ap.add_argument("--gpu-source", default="auto")
    ap.add_argument("--proc-root", default="/proc")
    ap.add_argument("--containers", choices=("docker", "none"), default="docker")
    ap.add_argument("--docker-host", default=None, help="DOCKER_HOST for the container poller (a non-default engine)")
    ap.add_argument("--cgroup-root", default="/sys/fs/cgroup", help="where the node's cgroup tree is mounted")
    ap.add_argument("--watch-stdin", action="store_true")
    args = ap.parse_args(argv)
    interval = max(args.interval, 0.01)

    name_self()
    CGROUP_ROOT[0] = args.cgroup_root
    pending_errors: list[str] = []   # said once, on the first tick
    source = open_gpu_source(args.gpu_source, pending_errors)
    poller = None
    if args.docker_host:
        os.environ["DOCKER_HOST"] = args.docker_host
    if args.containers == "docker":
        poller = ContainerPoller(args.container_interval, args.proc_root, args.cgroup_root)
        if not poller.exe:
            pending_errors.append("docker: not found on PATH")
            poller = None
    # NVML's list is read every PROCS_REFRESH_S; a replay or a simulated node's list costs nothing more than the
    # file the tick already read, and follows it tick by tick
    procs = GpuProcsReader(source, args.proc_root, PROCS_REFRESH_S if source.name == "nvml" else 0.0)
    no_ids: dict[str, str] = {}
    out = sys.stdout
    last_container_error = None
    try:
        out.write(json.dumps(make_hello(source, args.proc_root, interval), separators=(",", ":")) + "\n")
        out.flush()
        start = time.monotonic()
        seq = 0
        slot = 0
        while True:
            errors, pending_errors = pending_errors, []
            tick = make_tick(seq, source, args.proc_root, errors)
            if poller is not None:
                cg = read_cgroup_memory(poller.cgroup_files, poller.cgroup_missing)
                if cg:
                    tick["cgroups"] = cg
                conts, cerr = poller.take()
                if conts is not None:
                    tick["containers"] = conts
                if cerr and cerr != last_container_error:
                    errors.append(cerr)
                last_container_error = cerr if (conts is not None or cerr) else last_container_error
            tick["gpu_procs"] = procs.reading(poller.ids if poller is not None else no_ids, errors)
            if errors:
                tick["errors"] = errors
            out.write(json.dumps(tick, separators=(",", ":")) + "\n")
            out.flush()
            seq += 1
            if args.count and seq >= args.count:
                return 0
            # Sleep to the next slot on a fixed grid (no drift); skip slots we were too slow for.
            slot += 1
            now = time.monotonic()
            if start + slot * interval < now:
                slot = int((now - start) / interval) + 1
            next_at = start + slot * interval
            wait = next_at - time.monotonic()
            if args.watch_stdin:
                if _stdin_closed(wait):
                    return 0
            elif wait > 0:
                time.sleep(wait)
    except (BrokenPipeError, KeyboardInterrupt):
        # The console went away: leave quietly, and keep Python from complaining at exit.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return 0


if __name__ == "__main__":
    sys.exit(main())
