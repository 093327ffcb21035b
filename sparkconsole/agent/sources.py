"""The GPU sources a tick reads (`--gpu-source`): NVML, nvidia-smi, none, a replay of recorded ticks, or a
simulated node's file; `open_gpu_source` picks one, falling back from NVML to nvidia-smi to none."""

from __future__ import annotations

import json

from .nvml import NvmlSource
from .smi import SmiSource

# Types for the checker only: the node imports nothing it does not run (`typing` included).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    class GpuSource(Protocol):
        name: str
        simulated: bool

        def hello(self) -> dict[str, Any]: ...

        def sample(self, errors: list[str]) -> list[dict[str, Any]] | None: ...

        def processes(self, errors: list[str]) -> list[dict[str, Any]] | str: ...

class NoGpu:
    name = "none"
    simulated = False

    def hello(self) -> dict[str, Any]:
        return {"gpus": []}

    def sample(self, errors: list[str]) -> list[dict[str, Any]] | None:
        return None

    def processes(self, errors: list[str]) -> list[dict[str, Any]] | str:
        return "no GPU source on this node"


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
