"""Containers and what they hold: the docker CLI read in a thread (a slow daemon never delays a tick), each running
container's memory cgroup (usage and limit), and the GPU source's process list mapped to containers through
/proc/PID/cgroup (`gpu_procs`: what a container holds of the GPU, which its cgroup does not see on a GB10)."""

from __future__ import annotations

import json
import os
import time

from .host import read_int

# Types for the checker only: the node imports nothing it does not run (`typing` included).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .sources import GpuSource

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
        cur = read_int(usage)
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


# The GPU process list (one nvmlDeviceGetComputeRunningProcesses per GPU, then /proc/PID/cgroup for a PID not seen
# before): read at most this often, repeated between. Measured on an H200 (benchmarks/telemetry.py procs): see
# docs/PERFORMANCE.md; a runaway's growth is judged over a minute, so a reading every 2 s loses nothing.
PROCS_REFRESH_S = 2.0


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
