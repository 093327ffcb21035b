"""The NVML GPU source: pynvml (the node's, else the copy the console sent along), handles and static readings once,
a handful of calls per tick, the clock-event reason counters and the power limit only when due, and each
process's GPU memory (which NVML gives on a GB10, where it gives no framebuffer size)."""

from __future__ import annotations

import sys
import time

from .smi import reasons_from_mask

# Types for the checker only: the node imports nothing it does not run (`typing` included).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

# NVML field ids of the clock-event time counters (nanoseconds): what `nvidia-smi -q` lists as
# "Clocks Event Reasons Counters". Ids 269-271 exist on drivers >= 535; older ones answer per field.
REASON_COUNTER_FIELDS = (("sw_power_cap", 74), ("sync_boost", 76), ("sw_thermal", 269), ("hw_thermal", 270),
                         ("hw_power_brake", 271))
REASON_COUNTER_NAMES = tuple(name for name, _ in REASON_COUNTER_FIELDS)
REASON_COUNTER_IDS = [fid for _, fid in REASON_COUNTER_FIELDS]
# Readings that change on an operator's command, not from tick to tick: read at most this often, repeated between.
POWER_LIMIT_REFRESH_S = 10.0
REASON_COUNTERS_REFRESH_S = 2.0
_NVML_NOT_AVAILABLE = (1 << 64) - 1        # NVML_VALUE_NOT_AVAILABLE for an unsigned long long (no figure)


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


def _text(v: object) -> str | None:
    if v is None:
        return None
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)
