"""Test bed plugin: routers in front of the two vLLM servers of `vllm_pair` — vllm-router (Rust) and LiteLLM.

Each router lives in its own cached venv, binds 127.0.0.1 only and is stopped by its process group.
LiteLLM runs offline (local price map), from an empty working directory (it loads any .env there), with a
master key generated per session that is never printed nor written to a log by us.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from tests.testbed.cache import SERVER_GC, TestbedError, Venv, VenvSpec, ensure_venv
from tests.testbed.vllm import VllmServer, free_port, log_tail, stop_process_group

VLLM_ROUTER_VERSION = "0.1.17"
LITELLM_VERSION = "1.106.2"
VLLM_ROUTER_VENV = VenvSpec(
    name=f"vllm-router-{VLLM_ROUTER_VERSION}",
    requirements=(f"vllm-router=={VLLM_ROUTER_VERSION}",),
    pins=(("vllm-router", VLLM_ROUTER_VERSION),),
)
# 1.82.7 and 1.82.8 were compromised releases: refuse them even if an index offers them
LITELLM_VENV = VenvSpec(
    name=f"litellm-{LITELLM_VERSION}",
    requirements=(f"litellm[proxy]=={LITELLM_VERSION}",),
    pins=(("litellm", LITELLM_VERSION),),
    forbidden=(("litellm", "1.82.7"), ("litellm", "1.82.8")),
    startup=SERVER_GC,
)
VLLM_ROUTER_POLICIES = ("random", "round_robin", "power_of_two", "cache_aware")
LITELLM_STRATEGIES = ("simple-shuffle", "least-busy")
ROUTER_START_TIMEOUT = 90.0


@dataclass
class RouterProcess:
    """A router on 127.0.0.1; `.headers` carries whatever auth clients need (empty for vllm-router)."""

    kind: str  # "vllm-router" | "litellm"
    policy: str
    port: int
    backends: tuple[str, ...]
    model: str
    log_path: Path
    proc: subprocess.Popen | None = None
    start_seconds: float | None = None
    api_key: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def stop(self) -> None:
        if self.proc:
            stop_process_group(self.proc, grace=10)


def _wait_ready(router: RouterProcess, path: str, timeout: float) -> None:
    start = time.monotonic()
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() - start < timeout:
            if router.proc.poll() is not None:
                raise TestbedError(f"{router.kind} exited with {router.proc.returncode}: "
                                   f"{log_tail(router.log_path)} (log: {router.log_path})")
            try:
                if client.get(router.url + path, headers=router.headers).status_code == 200:
                    router.start_seconds = round(time.monotonic() - start, 2)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    router.stop()
    raise TestbedError(f"{router.kind} not ready after {timeout:.0f} s (log: {router.log_path})")


def _spawn(router: RouterProcess, argv: list[str], env: dict[str, str], cwd: Path) -> None:
    with open(router.log_path, "ab") as log:
        router.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, cwd=cwd, start_new_session=True)


def start_vllm_router(venv: Venv, backends: Sequence[str], model: str, log_dir: Path, *, policy: str = "round_robin",
                      extra: Sequence[str] = (), timeout: float = ROUTER_START_TIMEOUT) -> RouterProcess:
    """vllm-router over `backends`; pass extra=["--vllm-pd-disaggregation", "--prefill", P, "--decode", D]
    (and no backends) for the prefill/decode mode."""
    port = free_port()
    router = RouterProcess("vllm-router", policy, port, tuple(backends), model, log_dir / f"vllm-router-{port}.log")
    argv = [str(venv.bin("vllm-router")), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            # its metrics listener defaults to a fixed port (29000): give each router its own
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--worker-startup-check-interval", "1"]
    if backends:
        argv += ["--worker-urls", *backends]
    argv += list(extra)
    _spawn(router, argv, {"PATH": f"{venv.path / 'bin'}:/usr/bin:/bin", "HOME": str(log_dir)}, log_dir)
    _wait_ready(router, "/health", timeout)
    return router


def litellm_config(backends: Sequence[str], model: str, strategy: str) -> dict:
    return {
        "model_list": [
            {"model_name": model,
             "litellm_params": {"model": f"openai/{model}", "api_base": f"{url}/v1", "api_key": "unused"}}
            for url in backends
        ],
        "router_settings": {"routing_strategy": strategy},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
        "litellm_settings": {"drop_params": True},
    }


def start_litellm(venv: Venv, backends: Sequence[str], model: str, log_dir: Path, *, strategy: str = "simple-shuffle",
                  api_key: str | None = None, timeout: float = ROUTER_START_TIMEOUT) -> RouterProcess:
    """A LiteLLM proxy over `backends`; its master key is `api_key`, or a fresh one (never sk-1234)."""
    if strategy not in LITELLM_STRATEGIES:
        raise TestbedError(f"unknown LiteLLM strategy {strategy!r}; use one of {', '.join(LITELLM_STRATEGIES)}")
    port = free_port()
    # an empty directory of its own: the proxy loads any .env it finds in its working directory
    workdir = Path(tempfile.mkdtemp(prefix=f"litellm-{strategy}-", dir=log_dir))
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(litellm_config(backends, model, strategy), sort_keys=False))
    key = api_key or "sk-tb-" + secrets.token_urlsafe(24)
    router = RouterProcess("litellm", strategy, port, tuple(backends), model, log_dir / f"litellm-{port}.log",
                           api_key=key)
    env = {
        "PATH": f"{venv.path / 'bin'}:/usr/bin:/bin",
        "HOME": str(workdir),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else it fetches a price map at import
        "LITELLM_MASTER_KEY": key,
        "LITELLM_TELEMETRY": "False",
        "NO_DOCKER": "1",
    }
    argv = [str(venv.bin("litellm")), "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port),
            "--num_workers", "1"]
    _spawn(router, argv, env, workdir)
    _wait_ready(router, "/health/readiness", timeout)
    return router


@pytest.fixture(scope="session")
def vllm_router_env() -> Venv:
    return ensure_venv(VLLM_ROUTER_VENV)


@pytest.fixture(scope="session")
def litellm_env() -> Venv:
    return ensure_venv(LITELLM_VENV)


@contextlib.contextmanager
def _one_per_key(start: Callable[[str], RouterProcess], *, default: str) -> Iterator[Callable[..., RouterProcess]]:
    """key -> a router started once and reused for the session; every router started is stopped at the end."""
    started: dict[str, RouterProcess] = {}

    def get(key: str = default) -> RouterProcess:
        if key not in started:
            started[key] = start(key)
        return started[key]

    try:
        yield get
    finally:
        for router in started.values():
            router.stop()


@pytest.fixture(scope="session")
def router_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("router-logs")


@pytest.fixture(scope="session")
def vllm_router_factory(vllm_router_env: Venv, vllm_pair: tuple[VllmServer, VllmServer],
                        router_log_dir: Path) -> Iterator[Callable[[str], RouterProcess]]:
    """policy -> a vllm-router over both servers of vllm_pair (one per policy, reused within the session)."""
    with _one_per_key(lambda policy: start_vllm_router(vllm_router_env, [s.url for s in vllm_pair],
                                                       vllm_pair[0].model.name, router_log_dir, policy=policy),
                      default="round_robin") as get:
        yield get


@pytest.fixture(scope="session")
def vllm_router(vllm_router_factory: Callable[[str], RouterProcess]) -> RouterProcess:
    return vllm_router_factory("round_robin")


@pytest.fixture(scope="session")
def litellm_router(litellm_env: Venv, vllm_pair: tuple[VllmServer, VllmServer],
                   router_log_dir: Path) -> Iterator[Callable[[str], RouterProcess]]:
    """strategy ("simple-shuffle" | "least-busy") -> a LiteLLM proxy over both servers of vllm_pair."""
    with _one_per_key(lambda strategy: start_litellm(litellm_env, [s.url for s in vllm_pair], vllm_pair[0].model.name,
                                                     router_log_dir, strategy=strategy),
                      default="simple-shuffle") as get:
        yield get


@pytest.fixture(scope="session")
def vllm_pd_router(vllm_router_env: Venv, vllm_pair: tuple[VllmServer, VllmServer],
                   router_log_dir: Path) -> Iterator[RouterProcess]:
    """vllm-router in prefill/decode mode: vllm_pair[0] prefills, vllm_pair[1] decodes. Without a KV connector the
    decode server recomputes the prompt, but the router's two-step flow is the real one."""
    prefill, decode = vllm_pair
    router = start_vllm_router(vllm_router_env, [], prefill.model.name, router_log_dir, policy="round_robin",
                               extra=["--vllm-pd-disaggregation", "--prefill", prefill.url, "--decode", decode.url])
    try:
        yield router
    finally:
        router.stop()
