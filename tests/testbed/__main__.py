"""The test bed by hand: `python -m tests.testbed install | up | down | status` (see docs/TESTBED.md).

`up` starts what the slow tests start (Docker engine, two vLLM servers, vllm-router, optionally a LiteLLM proxy
and a vLLM container), all on 127.0.0.1, and records their PIDs in the cache's up.json; `down` stops them
by those PIDs. LiteLLM only starts when $LITELLM_MASTER_KEY is set: the key is the caller's, never stored here.

`up --nodes N` starts instead what tests/test_topologies.py starts: the Docker engine and N OpenSSH nodes on
127.0.0.2… whose sessions find that engine (sshd SetEnv), writes their cluster file, and prints the one command
that launches the bundled tiny recipe on them (`--no-engine`: the nodes only, for the console and `status`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.testbed.benchy import BENCHY_VENV
from tests.testbed.cache import TestbedError, cache_root, dir_size_bytes, ensure_venv, ensure_venvs, read_marker
from tests.testbed.docker import DockerEngine, _mounts_under, _wait_pid_gone, docker_cli, import_base_image
from tests.testbed.llamacpp import LLAMACPP_VENV
from tests.testbed.model import ensure_tiny_model
from tests.testbed.routers import LITELLM_VENV, VLLM_ROUTER_VENV, start_litellm, start_vllm_router
from tests.testbed.vllm import (
    VLLM_VENV,
    ensure_vllm_venv,
    group_rss_bytes,
    start_vllm_container,
    start_vllm_servers,
    vllm_image,
)

ALL_VENVS = (VLLM_VENV, VLLM_ROUTER_VENV, LITELLM_VENV, BENCHY_VENV, LLAMACPP_VENV)


def state_file() -> Path:
    return cache_root() / "up.json"


def cmd_install(_args: argparse.Namespace) -> int:
    start = time.monotonic()
    failed = 0
    for name, got in ensure_venvs(list(ALL_VENVS)).items():
        if isinstance(got, TestbedError):
            print(f"{name:24} FAILED: {got}")
            failed += 1
            continue
        how = f"installed in {got.install_seconds} s" if got.install_seconds else "cached"
        print(f"{name:24} {how:24} {dir_size_bytes(got.path) / 2**30:.2f} GiB")
    if failed:
        return 1
    model = ensure_tiny_model(ensure_vllm_venv())
    print(f"{'tiny model':24} {(f'built in {model.build_seconds} s') if model.build_seconds else 'cached':24} "
          f"{dir_size_bytes(model.path) / 2**20:.1f} MiB  {model.path}")
    print(f"all ready in {time.monotonic() - start:.1f} s (cache: {cache_root()})")
    return 0


def cmd_status(_args: argparse.Namespace) -> int:
    root = cache_root()
    print(f"cache: {root}")
    for spec in ALL_VENVS:
        path = root / "venvs" / spec.name
        marker = read_marker(path)
        state = "ok" if marker and marker.get("spec") == spec.as_marker() else "missing or stale"
        print(f"  {spec.name:24} {state:18} {dir_size_bytes(path) / 2**30:.2f} GiB" if path.exists()
              else f"  {spec.name:24} {state}")
    if state_file().exists():
        print(f"up: {state_file().read_text()}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    if state_file().exists():
        print(f"already up (see {state_file()}); run `python -m tests.testbed down` first", file=sys.stderr)
        return 1
    if args.nodes:
        return cmd_up_nodes(args)
    log_dir = Path(tempfile.mkdtemp(prefix="sc-testbed-logs-", dir="/tmp"))
    state: dict = {"log_dir": str(log_dir), "groups": {}, "urls": {}, "start_seconds": {}}

    def save() -> None:
        state_file().write_text(json.dumps(state, indent=1))

    vllm_env = ensure_vllm_venv()
    model = ensure_tiny_model(vllm_env)
    engine = DockerEngine(Path(tempfile.mkdtemp(prefix="sc-docker-", dir="/tmp")))
    engine.start()
    state["start_seconds"]["dockerd"] = engine.start_seconds
    # dockerd must outlive this command: forget the Popen, keep the PID
    state["docker"] = {"root": str(engine.root), "pid": engine.pid, "host": engine.host}
    save()
    try:
        servers = start_vllm_servers(vllm_env, model, log_dir, args.servers)
        for i, s in enumerate(servers):
            state["groups"][f"vllm-{i}"] = s.pid
            state["urls"][f"vllm-{i}"] = s.url
            state["start_seconds"][f"vllm-{i}"] = s.start_seconds
            save()
        if args.routers:
            router = start_vllm_router(ensure_venv(VLLM_ROUTER_VENV), [s.url for s in servers], model.name, log_dir)
            state["groups"]["vllm-router"], state["urls"]["vllm-router"] = router.pid, router.url
            state["start_seconds"]["vllm-router"] = router.start_seconds
            save()
            if os.environ.get("LITELLM_MASTER_KEY"):
                lite = start_litellm(ensure_venv(LITELLM_VENV), [s.url for s in servers], model.name, log_dir,
                                     strategy=args.litellm_strategy, api_key=os.environ["LITELLM_MASTER_KEY"])
                state["groups"]["litellm"], state["urls"]["litellm"] = lite.pid, lite.url
                state["start_seconds"]["litellm"] = lite.start_seconds
                save()
            else:
                print("LiteLLM not started: set LITELLM_MASTER_KEY to a key of your own to start it")
        if args.container:
            image = vllm_image(import_base_image(engine), vllm_env, model)
            container = start_vllm_container(engine, image)
            state["urls"][container.name] = container.url
            state["start_seconds"][container.name] = container.start_seconds
            state["containers"] = {container.name: container.url}
            save()
    except (TestbedError, KeyboardInterrupt) as exc:
        print(f"up failed: {exc}; stopping what started", file=sys.stderr)
        cmd_down(args)
        return 1
    # what each part costs, as measured now: seconds from spawn to healthy, resident memory
    print(f"{'part':22} {'url':26} {'ready s':>8} {'RSS GiB':>8}")
    print(f"{'dockerd':22} {engine.host[-26:]:26} {engine.start_seconds:>8} {group_rss_bytes(engine.pid) / 2**30:>8.2f}")
    for name, url in state["urls"].items():
        if name in state["groups"]:
            rss = f"{group_rss_bytes(state['groups'][name]) / 2**30:.2f}"
        else:  # a container: the engine's own accounting against the cap
            rss = engine.run(["stats", "--no-stream", "--format", "{{.MemUsage}}", name]).stdout.strip()
        print(f"{name:22} {url:26} {state['start_seconds'].get(name)!s:>8} {rss:>8}")
    print(f"DOCKER_HOST={engine.host}\nlogs: {log_dir}\nstop with: python -m tests.testbed down")
    return 0


def cmd_up_nodes(args: argparse.Namespace) -> int:
    """N sshd nodes (and the engine their sessions use), their cluster file, and the command to launch on them."""
    import shlex

    from tests.helpers import free_port
    from tests.testbed.sshd import _ensure_sshd, start_sshd_nodes
    if not 1 <= args.nodes <= 16:
        print("--nodes: give 1 to 16", file=sys.stderr)
        return 1
    why = _ensure_sshd()
    if why:
        print(f"up failed: {why}", file=sys.stderr)
        return 1
    root = Path(tempfile.mkdtemp(prefix="sc-testbed-nodes-", dir="/tmp"))
    state: dict = {"log_dir": str(root), "groups": {}, "urls": {}, "start_seconds": {}, "nodes_root": str(root)}

    def save() -> None:
        state_file().write_text(json.dumps(state, indent=1))

    extra = ""
    try:
        if args.engine:
            vllm_env = ensure_vllm_venv()
            model = ensure_tiny_model(vllm_env)
            engine = DockerEngine(Path(tempfile.mkdtemp(prefix="sc-docker-", dir="/tmp")))
            engine.start()
            state["docker"] = {"root": str(engine.root), "pid": engine.pid, "host": engine.host}
            save()
            import_base_image(engine)
            extra = f"SetEnv DOCKER_HOST={engine.host} DOCKER_CONFIG={engine.root / 'client-config'}\n"
        addresses = [f"127.0.0.{2 + i}" for i in range(args.nodes)]
        nodes = start_sshd_nodes(root / "sshd", addresses, extra_config=extra, keep_alive=True)
        state["sshd"] = [n.proc.pid for n in nodes]
        save()
        cluster = nodes.write_cluster_file(root / "sparkconsole.yaml", [f"sc_testbed_{n.name}" for n in nodes],
                                           [free_port(a) for a in addresses])
        state["cluster_file"] = str(cluster)
        save()
    except (TestbedError, RuntimeError, KeyboardInterrupt) as exc:
        print(f"up failed: {exc}; stopping what started", file=sys.stderr)
        cmd_down(args)
        return 1
    sc = f"{shlex.quote(sys.executable)} -m sparkconsole --cluster {shlex.quote(str(cluster))}"
    print(f"{len(nodes)} node(s): " + ", ".join(f"{n.name} {n.address}:{n.port}" for n in nodes))
    print(f"cluster file: {cluster}")
    if args.engine:
        topology = "cluster-tp2" if len(nodes) >= 2 else "solo"
        sets = {"python_home": str(Path(sys.base_prefix).resolve()), "vllm_venv": str(vllm_env.path),
                "model_path": str(model.path), "served_model_name": model.name}
        # --force: this machine's OOM guards are not a Spark's (min_free_kbytes, page cache), as in the tests
        print("launch the tiny recipe on them (--force: this machine's OOM guards are not a Spark's):")
        print(f"  {sc} recipe launch tiny-testbed -T {topology} --master-port {free_port(addresses[0])} "
              + " ".join(f"--set {k}={shlex.quote(v)}" for k, v in sets.items()) + " --yes --force")
    else:
        print(f"watch them:\n  {sc} status")
    print("stop with: python -m tests.testbed down")
    return 0


def _stop_nodes(state: dict) -> None:
    import shutil

    from tests.testbed.sshd import _descendants
    for pid in state.get("sshd", []):
        for p in [*_descendants(pid), pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        print(f"stopped sshd (pid {pid})")
    if state.get("nodes_root"):
        shutil.rmtree(state["nodes_root"], ignore_errors=True)


def cmd_down(_args: argparse.Namespace) -> int:
    if not state_file().exists():
        print("nothing is up")
        return 0
    state = json.loads(state_file().read_text())
    _stop_nodes(state)
    for name, pgid in reversed(list(state.get("groups", {}).items())):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        if not _wait_pid_gone(pgid, 20):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        print(f"stopped {name} (pid {pgid})")
    docker = state.get("docker")
    if docker:
        env = {**os.environ, "DOCKER_HOST": docker["host"]}
        ids = subprocess.run([docker_cli(), "ps", "-aq"], env=env, capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run([docker_cli(), "rm", "-f", *ids], env=env, capture_output=True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(docker["pid"], signal.SIGTERM)
        if not _wait_pid_gone(docker["pid"], 20):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(docker["pid"], signal.SIGKILL)
        for point in _mounts_under(Path(docker["root"])):
            subprocess.run(["umount", "-l", point], capture_output=True)
        subprocess.run(["rm", "-rf", docker["root"]], capture_output=True)
        print(f"stopped dockerd (pid {docker['pid']})")
    state_file().unlink()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testbed", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="build (or reuse) the cached venvs and the tiny model").set_defaults(func=cmd_install)
    sub.add_parser("status", help="what the cache holds, and what is up").set_defaults(func=cmd_status)
    up = sub.add_parser("up", help="start the test bed and leave it running")
    up.add_argument("--servers", type=int, choices=(1, 2), default=2, help="bare vLLM servers (default 2)")
    up.add_argument("--no-routers", dest="routers", action="store_false", help="skip vllm-router and LiteLLM")
    up.add_argument("--litellm-strategy", default="simple-shuffle", choices=("simple-shuffle", "least-busy"))
    up.add_argument("--container", action="store_true", help="also a vLLM container in the Docker engine (6 GiB cap)")
    up.add_argument("--nodes", type=int, metavar="N", help="instead: N OpenSSH nodes (127.0.0.2…) whose sessions use "
                    "the engine, their cluster file, and the command that launches a recipe on them")
    up.add_argument("--no-engine", dest="engine", action="store_false", help="with --nodes: the nodes only")
    up.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop everything `up` started, by PID").set_defaults(func=cmd_down)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
