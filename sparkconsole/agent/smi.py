"""nvidia-smi's CSV in the tick's schema, the fallback GPU source that reads it, and the words of the clock-event
reasons (NVML's bit mask, which both GPU sources report)."""

from __future__ import annotations

# Types for the checker only: the node imports nothing it does not run (`typing` included).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# NVML clock-event reason bits, in the order samples.REASON_BITS gives them.
REASON_BITS = (
    ("idle", 0x1), ("app_clocks", 0x2), ("sw_power_cap", 0x4), ("hw_slowdown", 0x8), ("sync_boost", 0x10),
    ("sw_thermal", 0x20), ("hw_thermal", 0x40), ("hw_power_brake", 0x80), ("display_clock", 0x100),
)
# The nvidia-smi fallback's query: one CSV row per GPU, parsed by field name (parse_smi_csv).
SMI_FIELDS = (
    "index", "uuid", "name", "temperature.gpu", "power.draw", "power.limit", "clocks.sm", "clocks.max.sm",
    "utilization.gpu", "utilization.memory", "memory.total", "memory.used", "clocks_event_reasons.active",
)
SMI_HELLO_FIELDS = ("index", "uuid", "name", "driver_version")
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
