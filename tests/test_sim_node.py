"""A simulated GB10 node read by the REAL agent (sparkconsole/agent/, a subprocess with its sim flags),
its docker shim driven as the agent and the runner drive docker, and a simulated server loading the node."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import aiohttp
import pytest

from sparkconsole.nodes.samples import Tick
from sparkconsole.nodes.workload_memory import workload_memory
from sparkconsole.sim.engine import EngineArgs, SimEngine
from sparkconsole.sim.node import GB10, NodeTuning, SimNode, write_load
from sparkconsole.sim.profiles import GB10 as GB10_HW
from sparkconsole.sim.profiles import MODELS
from tests.helpers import free_port

GIB_KB = 1024 * 1024


class Agent:
    """The agent as the local transport runs it: its own process, the node's PATH, JSON lines on stdout."""

    def __init__(self, node: SimNode, *extra: str) -> None:
        self.node, self.extra = node, extra
        self.proc: asyncio.subprocess.Process | None = None
        self.hello: dict | None = None

    async def __aenter__(self) -> Agent:
        env = dict(os.environ, **dict(self.node.env()))
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sparkconsole.agent", *self.node.agent_args(), *self.extra, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        self.hello = await self.line()
        return self

    async def line(self) -> dict:
        assert self.proc and self.proc.stdout
        raw = await asyncio.wait_for(self.proc.stdout.readline(), 10)
        assert raw, "agent ended"
        return json.loads(raw)

    async def until(self, pred, timeout: float) -> tuple[dict, list[dict]]:
        """Ticks until one satisfies pred; returns it and every tick seen."""
        seen: list[dict] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = await self.line()
            seen.append(t)
            if pred(t):
                return t, seen
        raise AssertionError(f"condition not met in {timeout}s; last tick: {seen[-1] if seen else None}")

    async def __aexit__(self, *exc: object) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


def docker(node: SimNode, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **dict(node.env()))
    return subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=30)


@pytest.fixture
async def hot_node(tmp_path):
    node = SimNode("spark1", "127.0.0.2", tmp_path, speed=100, update_interval=0.05, tuning=NodeTuning.stock())
    await node.start()
    yield node
    await node.stop()


async def test_agent_reads_a_gb10_that_heats_throttles_and_cools(hot_node):
    node = hot_node
    async with Agent(node, "--interval", "0.1", "--containers", "none") as agent:
        h = agent.hello
        assert h["type"] == "hello" and h["simulated"] is True and h["gpu_source"] == "sim"
        assert [g["name"] for g in h["gpus"]] == ["NVIDIA GB10"] and h["hostname"] == "spark1"
        t0 = await agent.line()
        g = t0["gpus"][0]
        # unified memory: NVML has no framebuffer numbers on a GB10, so they are absent, never zero
        assert g["unified"] is True
        assert "mem_total_b" not in g and "mem_used_b" not in g and "power_limit_w" not in g
        assert abs(t0["mem"]["total_kb"] / GIB_KB - 121.7) < 0.05
        assert t0["guards"]["swaps"] == ["/swap.img"] and t0["guards"]["overcommit_memory"] == 0
        assert "idle" in g["reasons"] and g["temp_c"] < 45
        avail0 = t0["mem"]["available_kb"]

        # a model resident (80 GiB) and the GPU fully busy, half of it in matmuls (a c64 prefill/decode mix): memory drops, the GPU heats past the slowdown point
        write_load(node.dir, "bench", pid=os.getpid(), reserved_b=80 << 30, gpu_busy=1.0, compute_frac=0.5,
                   loaded=True)
        hot, heating = await agent.until(lambda t: "sw_thermal" in t["gpus"][0]["reasons"], 30)
        hg = hot["gpus"][0]
        assert hg["temp_c"] >= hg["slowdown_c"] == GB10.slowdown_c
        assert (avail0 - hot["mem"]["available_kb"]) / GIB_KB == pytest.approx(80, abs=0.5)
        temps = [t["gpus"][0]["temp_c"] for t in heating]
        assert all(b >= a for a, b in zip(temps, temps[1:], strict=False))       # rising, never falling, while loaded
        assert temps[-1] - temps[0] > 30
        assert hg["power_w"] > 60 and hg["util_pct"] == 100 and "idle" not in hg["reasons"]

        # sustained: the clock drops and holds the GPU in the high 80s / low 90s, never at shutdown
        _, sustained = await agent.until(lambda t: t["gpus"][0]["reason_us"]["sw_thermal"] > 60e6, 30)
        last = sustained[-1]["gpus"][0]
        assert last["sm_clock_mhz"] < last["sm_clock_max_mhz"]
        assert all(84 <= t["gpus"][0]["temp_c"] < GB10.shutdown_c for t in sustained)

        # load gone: cools below the threshold, the slowdown clears, the memory comes back
        (node.dir / "load" / "bench.json").unlink()
        cool, cooling = await agent.until(lambda t: t["gpus"][0]["temp_c"] < GB10.slowdown_c - 15, 30)
        cg = cool["gpus"][0]
        assert "sw_thermal" not in cg["reasons"] and "idle" in cg["reasons"]
        assert cg["sm_clock_mhz"] == cg["sm_clock_max_mhz"]
        assert cool["mem"]["available_kb"] == avail0
        ctemps = [t["gpus"][0]["temp_c"] for t in cooling]
        assert all(b <= a for a, b in zip(ctemps, ctemps[1:], strict=False))


async def test_docker_shim_as_the_agent_and_runner_use_it(tmp_path):
    node = SimNode("spark2", "127.0.0.3", tmp_path, speed=1, load_speedup=500, tuning=NodeTuning.hardened())
    await node.start()
    try:
        r = docker(node, "run", "-d", "--name", "idle", "--memory", "2g", "--network", "host", "--ipc=host",
                   "vllm-node", "sleep", "infinity")
        assert r.returncode == 0 and len(r.stdout.strip()) == 64
        r = docker(node, "run", "-d", "--name", "idle", "vllm-node", "sleep", "infinity")
        assert r.returncode == 125 and "Conflict" in r.stderr
        assert docker(node, "run", "-d", "--bogus", "vllm-node").returncode == 125
        miss = docker(node, "inspect", "--format", "{{.State.Status}}", "missing")
        assert miss.returncode == 1 and "No such object: missing" in miss.stderr
        assert docker(node, "image", "inspect", "vllm-node").returncode == 0
        assert docker(node, "image", "inspect", "nosuch/image").returncode == 1

        async with Agent(node, "--interval", "0.1", "--container-interval", "0.2") as agent:
            t, _ = await agent.until(lambda t: any(c["name"] == "idle" for c in t.get("containers") or []), 15)
            c = next(c for c in t["containers"] if c["name"] == "idle")
            assert c["state"] == "running" and c["memory_limit_b"] == 2 << 30 and c["oom_killed"] is False
            assert t["guards"]["swaps"] == [] and t["guards"]["min_free_kbytes"] == 1572864

            pid = docker(node, "inspect", "-f", "{{.State.Pid}}", "idle").stdout.strip()
            assert docker(node, "restart", "-t", "5", "idle").returncode == 0
            again = docker(node, "inspect", "-f", "{{.State.Status}} {{.State.Pid}}", "idle").stdout.split()
            assert again[0] == "running" and again[1] != pid
            assert docker(node, "stop", "idle").stdout.strip() == "idle"
            t, _ = await agent.until(lambda t: any(c["name"] == "idle" and c["state"] == "exited"
                                                   for c in t.get("containers") or []), 15)
            # A clean stop: 0 when the placeholder's TERM handler ran, 143 (Docker's 128 + SIGTERM) when the signal
            # arrived while the restarted process was still importing; never 137, which means it had to be killed.
            assert next(c for c in t["containers"] if c["name"] == "idle")["exit_code"] in (0, 143)

            # a 120B model under a 10 GiB cap, as a GB10 runs it: the GPU memory (85 GiB) is not charged to the
            # container's cgroup, so the cap never fires; the real agent sees the GPU memory per process, mapped to
            # the container through the node's /proc/PID/cgroup, and the cgroup holding the CPU side only
            r = docker(node, "run", "-d", "--name", "big", "--memory", "10g", "--gpus", "all", "vllm-node",
                       "vllm", "serve", "openai/gpt-oss-120b", "--gpu-memory-utilization", "0.7", "--port", "1")
            assert r.returncode == 0, r.stderr
            # as on a host, the container's cgroup and its process's /proc entry are there once `docker run` returns: an
            # agent reading the container at once finds them (ci41 read "no readable /proc/PID/cgroup" in such a moment)
            pid = int(docker(node, "inspect", "--format", "{{.State.Pid}}", "big").stdout)
            cid = r.stdout.strip()
            assert f"docker-{cid}.scope" in (node.proc_root / str(pid) / "cgroup").read_text()
            scope = node.cgroup_root / "system.slice" / f"docker-{cid}.scope"
            assert (scope / "memory.max").read_text() == f"{10 << 30}\n"
            t, _ = await agent.until(lambda t: any(p.get("container") == "big" and p.get("used_b", 0) > 80 << 30
                                                   for p in (t.get("gpu_procs") or {}).get("procs") or []), 30)
            w = workload_memory(Tick.from_json(t, 0))["big"]
            assert w.gpu_b > 80 << 30 and w.cap_b == 10 << 30 and 4 << 30 <= w.cgroup_b < 5 << 30
            assert w.procs[0].comm == "vllm" and w.measured
            # a cap under vLLM's CPU side (4 GiB) is what the cgroup does kill: at once
            r = docker(node, "run", "-d", "--name", "small", "--memory", "2g", "--gpus", "all", "vllm-node",
                       "vllm", "serve", "openai/gpt-oss-120b", "--gpu-memory-utilization", "0.3", "--port", "2")
            t, _ = await agent.until(lambda t: any(c["name"] == "small" and c["state"] == "exited"
                                                   for c in t.get("containers") or []), 30)
            small = next(c for c in t["containers"] if c["name"] == "small")
            assert small["oom_killed"] is True and small["exit_code"] == 137
            assert next(c for c in t["containers"] if c["name"] == "big")["state"] == "running"
        assert "Killed" in docker(node, "logs", "--tail", "1", "small").stdout
        assert docker(node, "stop", "big").returncode == 0
        ps = docker(node, "ps", "-a", "--format", "{{.Names}} {{.State}}").stdout.split("\n")
        assert sorted(filter(None, ps)) == ["big exited", "idle exited", "small exited"]
        assert docker(node, "ps", "-q").stdout.strip() == ""
        assert docker(node, "rm", "-f", "idle", "big", "small").returncode == 0
        assert docker(node, "ps", "-aq").stdout.strip() == ""
    finally:
        await node.stop()


async def test_the_shim_empties_a_tmpfs_when_the_container_starts_again(tmp_path):
    """As Docker does (tests/test_rolling_restart.py checks it on the real engine): the drain gate's flag, touched
    into its tmpfs, is gone after `docker restart`; `docker exec … rm -f` removes it too."""
    from sparkconsole.launch import gate
    node = SimNode("spark2", "127.0.0.3", tmp_path, speed=1, tuning=NodeTuning.hardened())
    await node.start()
    try:
        assert docker(node, "run", "-d", "--name", "gated", "--tmpfs", gate.tmpfs(), "vllm-node", "sleep",
                      "infinity").returncode == 0
        flag = node.dir / "containers" / "gated" / "fs" / gate.FLAG.lstrip("/")
        assert docker(node, "exec", "gated", "touch", gate.FLAG).returncode == 0 and flag.exists()
        assert docker(node, "exec", "gated", "rm", "-f", gate.FLAG).returncode == 0 and not flag.exists()
        assert docker(node, "exec", "gated", "touch", gate.FLAG).returncode == 0 and flag.exists()
        assert docker(node, "restart", "-t", "1", "gated").returncode == 0 and not flag.exists()
        docker(node, "rm", "-f", "gated")
    finally:
        await node.stop()


async def test_a_reader_racing_docker_stop_keeps_the_stops_exit_code(tmp_path):
    """`docker ps`/`inspect` take no lock: one that read the record while the container ran, and looked at its pid
    after the stop had killed it, used to write back exit 137 over the stop's own 0/143 (seen in CI)."""
    from sparkconsole.sim.dockershim import Store
    node = SimNode("spark2", "127.0.0.3", tmp_path, speed=1, load_speedup=500, tuning=NodeTuning.hardened())
    await node.start()
    try:
        assert docker(node, "run", "-d", "--name", "idle", "vllm-node", "sleep", "infinity").returncode == 0
        store = Store(node.dir)
        seen_running = store.get("idle")
        assert seen_running["state"] == "running"
        assert docker(node, "stop", "idle").returncode == 0
        stopped = store.get("idle")
        assert stopped["state"] == "exited" and stopped["exit_code"] in (0, 143)
        # the reader now finishes with what it read before the stop
        late = store.refresh(dict(seen_running))
        assert late["exit_code"] == stopped["exit_code"]
        assert store.get("idle")["exit_code"] == stopped["exit_code"]
        assert docker(node, "inspect", "-f", "{{.State.ExitCode}}", "idle").stdout.strip() == str(stopped["exit_code"])
    finally:
        await node.stop()


async def test_served_model_loads_memory_and_drives_the_gpu(tmp_path):
    node = SimNode("spark1", "127.0.0.2", tmp_path, speed=2, load_speedup=100, update_interval=0.1)
    await node.start()
    port = free_port(node.address)
    url = f"http://{node.address}:{port}"
    try:
        before = _meminfo(node)["MemAvailable"]
        r = docker(node, "run", "-d", "--name", "vllm_node", "--gpus", "all", "--network", "host", "--memory", "100g",
                   "--shm-size", "16g", "--health-cmd", "curl -f localhost/health", "vllm-node", "vllm", "serve",
                   "meta-llama/Llama-3.1-8B-Instruct", "--port", str(port), "--gpu-memory-utilization", "0.3",
                   "--max-model-len", "4096")
        assert r.returncode == 0, r.stderr
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 60
            while True:
                try:
                    async with s.get(url + "/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, docker(node, "logs", "vllm_node").stdout
                await asyncio.sleep(0.2)
            health = docker(node, "inspect", "--format", "{{.State.Health.Status}}", "vllm_node").stdout.strip()
            assert health == "healthy"
            await asyncio.sleep(0.5)
            used = (before - _meminfo(node)["MemAvailable"]) / GIB_KB
            assert used == pytest.approx(0.3 * 121.7 + 4, abs=0.5)   # gpu_memory_utilization x MemTotal + CPU side

            async def one(i: int) -> None:
                body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "max_tokens": 400, "ignore_eos": True,
                        "messages": [{"role": "user", "content": f"load {i} " * 200}]}
                async with s.post(url + "/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200
                    await resp.read()
            load = asyncio.gather(*(one(i) for i in range(16)))
            busy = []
            for _ in range(10):
                await asyncio.sleep(0.25)
                busy.append(json.loads(node.gpu_json.read_text())["gpus"][0]["util_pct"])
            await load
        assert max(busy) >= 50
        logs = docker(node, "logs", "vllm_node").stdout
        assert "Starting vLLM API server" in logs and "Application startup complete." in logs
        assert docker(node, "stop", "vllm_node").returncode == 0
        node.update(0.0)
        assert _meminfo(node)["MemAvailable"] == before
    finally:
        docker(node, "rm", "-f", "vllm_node")
        await node.stop()


def _meminfo(node: SimNode) -> dict[str, int]:
    out = {}
    for line in (node.proc_root / "meminfo").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = int(v.split()[0])
    return out


async def test_second_model_without_free_memory_fails_like_vllm(tmp_path):
    node = SimNode("spark1", "127.0.0.2", tmp_path, speed=1, load_speedup=500, update_interval=0.05)
    await node.start()
    try:
        base = ["run", "-d", "--gpus", "all", "--network", "host", "vllm-node", "vllm", "serve",
                "meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory-utilization", "0.7", "--max-model-len", "4096"]
        first = docker(node, *base[:2], "--name", "first", *base[2:], "--port", str(free_port(node.address)))
        assert first.returncode == 0
        deadline = time.monotonic() + 30
        while not (node.dir / "containers" / "first" / "ready").exists():
            assert time.monotonic() < deadline, docker(node, "logs", "first").stdout
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)
        second = docker(node, *base[:2], "--name", "second", *base[2:], "--port", str(free_port(node.address)))
        assert second.returncode == 0
        while docker(node, "inspect", "-f", "{{.State.Status}}", "second").stdout.strip() == "running":
            assert time.monotonic() < deadline + 30
            await asyncio.sleep(0.2)
        state = docker(node, "inspect", "-f", "{{.State.ExitCode}} {{.State.OOMKilled}}", "second").stdout.split()
        assert state == ["1", "false"]       # vLLM's own startup check, not an OOM kill
        assert "less than desired GPU memory utilization" in docker(node, "logs", "second").stdout
        assert docker(node, "inspect", "-f", "{{.State.Status}}", "first").stdout.strip() == "running"
    finally:
        docker(node, "rm", "-f", "first", "second")
        await node.stop()


async def test_thermal_slowdown_slows_the_served_engine(tmp_path):
    """A GPU held past its slowdown threshold (here: a threshold below ambient) runs the engine's GPU work at
    the reduced SM clock, and the node reports sw_thermal."""
    spec = replace(GB10, slowdown_c=30.0)
    node = SimNode("spark1", "127.0.0.2", tmp_path, speed=1, load_speedup=500, update_interval=0.1, spec=spec)
    await node.start()
    port = free_port(node.address)
    url = f"http://{node.address}:{port}"
    try:
        r = docker(node, "run", "-d", "--name", "vllm_node", "vllm-node", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
                   "--port", str(port), "--gpu-memory-utilization", "0.3", "--max-model-len", "4096")
        assert r.returncode == 0
        deadline = time.monotonic() + 30
        while not (node.dir / "containers" / "vllm_node" / "ready").exists():
            assert time.monotonic() < deadline, docker(node, "logs", "vllm_node").stdout
            await asyncio.sleep(0.1)
        while True:
            gpu = json.loads(node.gpu_json.read_text())["gpus"][0]
            if gpu["sm_clock_mhz"] < 0.6 * gpu["sm_clock_max_mhz"]:
                break
            assert time.monotonic() < deadline + 10, gpu
            await asyncio.sleep(0.2)
        assert "sw_thermal" in gpu["reasons"]
        await asyncio.sleep(0.6)        # the server reads the clock every 0.25 s
        tg = 100
        async with aiohttp.ClientSession() as s:
            body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "max_tokens": tg, "ignore_eos": True, "stream": True,
                    "messages": [{"role": "user", "content": "hot"}]}
            stamps = []
            async with s.post(url + "/v1/chat/completions", json=body) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {") and b'"content":" ' in line:
                        stamps.append(time.perf_counter())
        measured = (len(stamps) - 1) / (stamps[-1] - stamps[0])
        eng = SimEngine(MODELS["llama-3.1-8b"], EngineArgs(gpu_memory_utilization=0.3, max_model_len=4096), GB10_HW)
        eng.add_request("x", 10, tg)
        steps = [eng.step() for _ in range(tg)]
        cool_tps = (tg - 1) / sum(st.duration_s for st in steps[1:])
        assert len(stamps) == tg
        assert measured < 0.75 * cool_tps, (measured, cool_tps)
    finally:
        docker(node, "rm", "-f", "vllm_node")
        await node.stop()
