"""The host's readings: memory (/proc/meminfo, the unified memory's headroom on a GB10), pressure stall information,
and the OOM guards' inputs (swap, the vm sysctls, earlyoom and its arguments), those at most every
GUARDS_REFRESH_S; and the agent's own process name, which earlyoom's --avoid can name."""

from __future__ import annotations

import os
import time

# Types for the checker only: the node imports nothing it does not run (`typing` included).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Swap and the vm sysctls change on an operator's command, not from tick to tick: read at most this often, repeated
# between (guards_now).
GUARDS_REFRESH_S = 1.0


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


def read_int(path: str) -> int | None:
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
        v = read_int(os.path.join(proc_root, "sys", "vm", key))
        if v is not None:
            g[key] = v
    eo = _earlyoom.setdefault(proc_root, EarlyOomWatch(CGROUP_ROOT[0])).read(proc_root)
    if eo:
        g["earlyoom"] = eo
    return g


_guards_cache: dict[str, tuple[float, dict[str, Any]]] = {}


def guards_now(proc_root: str) -> dict[str, Any]:
    """read_guards at most every GUARDS_REFRESH_S (swap and vm sysctls change on an operator's command; four
    file reads a tick for them were a third of the host readings' cost)."""
    now = time.monotonic()
    hit = _guards_cache.get(proc_root)
    if hit is None or now - hit[0] >= GUARDS_REFRESH_S:
        hit = _guards_cache[proc_root] = (now, read_guards(proc_root))
    return hit[1]
