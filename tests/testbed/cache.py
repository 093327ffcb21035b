"""Where the test bed keeps what it installs or makes (virtualenvs, the tiny model), reused across runs.

Root: $SPARKCONSOLE_TESTBED_CACHE or ~/.cache/sparkconsole-testbed. Each entry carries a marker file written
last, holding the spec it was built from: an entry whose marker matches is reused, any other is rebuilt.
A file lock per entry lets two pytest processes (or `python -m tests.testbed install`) share the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

CACHE_ENV = "SPARKCONSOLE_TESTBED_CACHE"
MARKER = ".sparkconsole-testbed.json"


class TestbedError(RuntimeError):
    """A test bed part could not be installed or started; the message names the log to read."""

    __test__ = False  # not a test class, despite the name


def cache_root() -> Path:
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "sparkconsole-testbed")
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    lock_path = cache_root() / "locks" / f"{name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def base_python() -> Path:
    """The interpreter the project's venv was made from: test bed venvs must not hang off .venv."""
    exe = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return exe if exe.exists() else Path(sys.executable)


def read_marker(path: Path) -> dict | None:
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def write_whole(target: Path, text: str) -> None:
    """`text` into `target` through a temporary file: a reader meanwhile sees the old file or the new one, never half."""
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


def site_packages(venv: Path) -> Path | None:
    """The venv's site-packages directory (lib/python3.X/site-packages), None when it has none."""
    return next((venv / "lib").glob("python3*/site-packages"), None)


def write_marker(path: Path, spec: dict, **extra: object) -> None:
    write_whole(path / MARKER, json.dumps({"spec": spec, **extra}, indent=1, sort_keys=True))


def marker_matches(path: Path, spec: dict) -> bool:
    found = read_marker(path)
    return found is not None and found.get("spec") == spec


def run_logged(argv: list[str], log_path: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    """Run argv with output appended to log_path; on failure raise with the log's last line, not a wall of text."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(("\n$ " + " ".join(argv) + "\n").encode())
        log.flush()
        proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise TestbedError(f"{argv[0]} {argv[1:3]} failed (rc {proc.returncode}): {tail[0][:300]} (log: {log_path})")


@dataclass(frozen=True)
class VenvSpec:
    """A virtualenv built with pip: install `requirements`, uninstall `remove`, then check `pins` (dist -> version)."""

    name: str
    requirements: tuple[str, ...]
    remove: tuple[str, ...] = ()
    pins: tuple[tuple[str, str], ...] = ()
    forbidden: tuple[tuple[str, str], ...] = ()  # (dist, version) that must never be what got installed
    # A program run with the venv's Python after pip (`python BUILD VENV_DIR`): what pip cannot install (llama.cpp's
    # server, compiled). Its text is part of the marker: a changed build is a rebuilt venv.
    build: Path | None = None
    # One line of Python every interpreter of this venv runs as it starts (a .pth file; SERVER_GC). Not part of the
    # marker: a cached venv gets it, or loses it, at its next ensure without a rebuild.
    startup: str = ""

    def as_marker(self) -> dict:
        marker = {
            "requirements": list(self.requirements),
            "remove": list(self.remove),
            "pins": [list(p) for p in self.pins],
            "python": sys.version.split()[0],
            "base_python": str(base_python()),
        }
        if self.build is not None:
            import hashlib
            marker["build_sha256"] = hashlib.sha256(self.build.read_bytes()).hexdigest()
        return marker


@dataclass(frozen=True)
class Venv:
    name: str
    path: Path
    install_seconds: float | None = None  # None when reused from the cache
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def bin(self, script: str) -> Path:
        return self.path / "bin" / script


# The test bed's servers (vLLM's API server, engine core and workers, LiteLLM) spend up to a quarter of their start-up
# in the cyclic GC's full collections: each import of torch, transformers and vLLM builds hundreds of thousands of
# long-lived objects, and every collection of the oldest generation walks them all. Full collections a hundred times
# rarer, on a quiet machine: `import vllm.v1.engine.core, vllm.entrypoints.openai.api_server` 7.5-9.0 -> 6.2-7.1 user
# CPU s, LiteLLM's proxy 7.4 -> 5.9, one bare server to /health 16.6-18.6 -> 13.8-14.9 CPU s; in the whole suite's
# accounting less (vLLM 617 -> 587 CPU s; docs/TESTBED.md). Young objects are collected as before; a test bed server
# lives minutes. The project's own processes gain nothing from it (the quick loop: 147.6 vs 146.7 user CPU s), and
# the clients that time a server (llama-benchy) keep Python's defaults.
SERVER_GC = "import gc; gc.set_threshold(700, 10, 1000)"
STARTUP_PTH = "sparkconsole-testbed-startup.pth"


def write_startup(venv: Path, line: str) -> None:
    """The venv's start-up line (VenvSpec.startup) as a .pth in its site-packages; removed when empty."""
    site = site_packages(venv)
    if site is None:
        if line:
            raise TestbedError(f"{venv} has no lib/python3*/site-packages for its start-up line")
        return
    pth = site / STARTUP_PTH
    if not line:
        pth.unlink(missing_ok=True)
        return
    with contextlib.suppress(OSError):
        if pth.read_text() == line + "\n":
            return
    write_whole(pth, line + "\n")     # a server starting meanwhile reads the old line or the new one


def installed_versions(python: Path, dists: list[str]) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for d in sys.argv[1:]:\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: out[d] = ''\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([str(python), "-c", code, *dists], capture_output=True, text=True, timeout=60,
                          env=clean_env())
    if proc.returncode != 0:
        raise TestbedError(f"{python} could not report versions: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout)


def check_pins(spec: VenvSpec, python: Path) -> dict[str, str]:
    dists = [d for d, _ in spec.pins] + [d for d, _ in spec.forbidden]
    if not dists:
        return {}
    found = installed_versions(python, dists)
    for dist, bad in spec.forbidden:
        if found.get(dist) == bad:
            raise TestbedError(f"{dist} {bad} is installed in {python.parent.parent}: that release must never be used")
    for dist, want in spec.pins:
        if found.get(dist) != want:
            raise TestbedError(f"{dist} is {found.get(dist) or 'missing'} in {python.parent.parent}, expected {want}")
    return found


def clean_env() -> dict[str, str]:
    """This process's environment without what would leak the project's own venv into another interpreter."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


# installs that already failed in this process: later callers get the same error at once, not another install
_failed: dict[str, TestbedError] = {}


def ensure_venv(spec: VenvSpec) -> Venv:
    key = f"{cache_root()}/{spec.name}"
    if key in _failed:
        raise _failed[key]
    try:
        return _ensure_venv(spec)
    except TestbedError as exc:
        _failed[key] = exc
        raise


def cached_venv(spec: VenvSpec) -> Venv | None:
    """The venv if the cache already holds it as `spec` asks, else None; never builds (benchmarks' smoke runs)."""
    path = cache_root() / "venvs" / spec.name
    if marker_matches(path, spec.as_marker()) and (path / "bin" / "python").exists():
        return Venv(spec.name, path, None, dict((read_marker(path) or {}).get("versions") or {}))
    return None


def _ensure_venv(spec: VenvSpec) -> Venv:
    path = cache_root() / "venvs" / spec.name
    log_path = cache_root() / "logs" / f"install-{spec.name}.log"
    want = spec.as_marker()
    with locked(f"venv-{spec.name}"):
        if marker_matches(path, want) and (path / "bin" / "python").exists():
            versions = check_pins(spec, path / "bin" / "python")
            write_startup(path, spec.startup)
            return Venv(spec.name, path, None, versions)
        shutil.rmtree(path, ignore_errors=True)
        log_path.unlink(missing_ok=True)
        start = time.monotonic()
        run_logged([str(base_python()), "-m", "venv", str(path)], log_path, env=clean_env())
        py = str(path / "bin" / "python")
        pip = [py, "-m", "pip", "--disable-pip-version-check", "--no-input"]
        run_logged([*pip, "install", *spec.requirements], log_path, env=clean_env())
        if spec.remove:
            run_logged([*pip, "uninstall", "-y", *spec.remove], log_path, env=clean_env())
        if spec.build is not None:
            run_logged([py, str(spec.build), str(path)], log_path, env=clean_env())
        versions = check_pins(spec, path / "bin" / "python")
        write_startup(path, spec.startup)
        seconds = round(time.monotonic() - start, 1)
        write_marker(path, want, install_seconds=seconds, versions=versions)
        return Venv(spec.name, path, seconds, versions)


def dir_size_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def ensure_venvs(specs: list[VenvSpec]) -> dict[str, Venv | TestbedError]:
    """Several venvs side by side (pip mostly waits on downloads and unpacking); failures are returned, not raised."""
    from concurrent.futures import ThreadPoolExecutor

    if not specs:
        return {}
    with ThreadPoolExecutor(len(specs)) as pool:
        futures = {spec.name: pool.submit(ensure_venv, spec) for spec in specs}
    out: dict[str, Venv | TestbedError] = {}
    for name, fut in futures.items():
        exc = fut.exception()
        if exc is not None and not isinstance(exc, TestbedError):
            raise exc
        out[name] = exc if exc is not None else fut.result()
    return out
