"""The simulated vLLM server and router over real HTTP on loopback, against the SimEngine they embed.

Real processes (python -m sparkconsole.sim.server / .router), a real streaming client (aiohttp); the
served timings are compared with what a fresh SimEngine computes for the same inputs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkconsole.sim.engine import EngineArgs, SimEngine
from sparkconsole.sim.profiles import GB10, MODELS
from sparkconsole.sim.server import ENGINE_WAKEUP_S
from tests.helpers import free_port

HOST = "127.0.0.1"
MODEL = "openai/gpt-oss-120b"
ARGS = ("--gpu-memory-utilization", "0.7", "--max-model-len", "4096", "--max-num-batched-tokens", "8192",
        "--max-num-seqs", "64", "--kv-cache-dtype", "fp8")


async def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
            except (TimeoutError, aiohttp.ClientError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(url)
            await asyncio.sleep(0.1)


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def end(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out.decode(errors="replace")


@pytest.fixture
async def server():
    port = free_port()
    proc = start(["sparkconsole.sim.server", MODEL, "--host", HOST, "--port", str(port), *ARGS,
                  "--sim-speed", "1", "--sim-load-speedup", "200"])
    url = f"http://{HOST}:{port}"
    try:
        await wait_http(url + "/health")
        yield url
    finally:
        log = end(proc)
    assert "Application startup complete." in log and "Starting vLLM API server" in log


async def stream_chat(s: aiohttp.ClientSession, url: str, text: str, max_tokens: int, **extra) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, **extra}
    t0 = time.perf_counter()
    first = last = None
    chunks, usage, finish = 0, None, None
    async with s.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/event-stream")
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            d = json.loads(data)
            if d.get("usage"):
                usage = d["usage"]
            for ch in d["choices"]:
                if ch["delta"].get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    chunks += 1
                finish = ch.get("finish_reason") or finish
    return {"ttft": first - t0, "decode_s": last - first, "chunks": chunks, "usage": usage, "finish": finish}


def engine_expectation(prompt_tokens: int, max_tokens: int, concurrency: int) -> tuple[list[float], list[float]]:
    """TTFT and end time of each request when `concurrency` identical requests arrive together."""
    eng = SimEngine(MODELS["gpt-oss-120b"], EngineArgs(max_num_batched_tokens=8192, max_num_seqs=64,
                                                       gpu_memory_utilization=0.7, max_model_len=4096,
                                                       kv_cache_dtype="fp8"), GB10)
    for i in range(concurrency):
        eng.add_request(f"r{i}", prompt_tokens, max_tokens)
    t, first, done = 0.0, {}, {}
    while eng.has_work():
        res = eng.step()
        t += res.duration_s
        for ev in res.events:
            first.setdefault(ev.req_id, t)
            if ev.finished:
                done[ev.req_id] = t
    ids = sorted(first)
    # the served engine also waits its wake-up before the first step
    return [first[i] + ENGINE_WAKEUP_S for i in ids], [done[i] + ENGINE_WAKEUP_S for i in ids]


async def tokenize_count(s: aiohttp.ClientSession, url: str, text: str) -> int:
    async with s.post(url + "/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": text}]}) as r:
        assert r.status == 200
        return (await r.json())["count"]


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def paced(wall: float, engine_s: float) -> bool:
    """A wall-clock span that follows the engine's time: never much quicker (the server sleeps it), and within
    1.6x on a loaded machine, well apart from a server that does not pace at all or paces twice as slow."""
    return 0.75 * engine_s - 0.04 <= wall <= 1.6 * engine_s + 0.1


async def served_ttft_total(s: aiohttp.ClientSession, url: str) -> float:
    """The server's own time-to-first-token total, in simulated seconds (the engine's clock, not the wall)."""
    async with s.get(url + "/metrics") as r:
        fams = families(await r.text())
    return next(x.value for x in fams["vllm:time_to_first_token_seconds"].samples if x.name.endswith("_sum"))


@pytest.mark.alone      # wall-clock pacing against the engine's time: another test beside it skews the wall side
async def test_served_timing_matches_engine_and_metrics_parse(server):
    url = server
    text = " ".join(f"word{i % 97} ." for i in range(300))
    tg = 48
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/sim/clock") as r:
            speed = (await r.json())["speed"]
        assert 590 <= await tokenize_count(s, url, text) <= 640     # 600 words and dots, plus the chat template

        # c1, twice (distinct prefixes: no prefix-cache hits): first token and decode rate follow the engine
        for run in range(2):
            t = f"run{run} " + text
            prompt = await tokenize_count(s, url, t)
            exp_ttft, exp_end = engine_expectation(prompt, tg, 1)
            exp_decode_tps = (tg - 1) / (exp_end[0] - exp_ttft[0])
            r = await stream_chat(s, url, t, tg, ignore_eos=True)
            assert r["usage"]["prompt_tokens"] == prompt
            assert r["usage"]["completion_tokens"] == tg == r["chunks"]
            assert r["finish"] == "length"
            ttft = r["ttft"] * speed
            decode_tps = (tg - 1) / (r["decode_s"] * speed)
            assert paced(ttft, exp_ttft[0]), (ttft, exp_ttft)
            assert paced((tg - 1) / decode_tps, (tg - 1) / exp_decode_tps), (decode_tps, exp_decode_tps)

        # c4 at once: the batch finishes when the engine's batched steps say
        texts = [f"c4 {i} " + text for i in range(4)]
        prompt4 = await tokenize_count(s, url, texts[0])
        t0 = time.perf_counter()
        rs = await asyncio.gather(*(stream_chat(s, url, t, tg, ignore_eos=True) for t in texts))
        wall = time.perf_counter() - t0
        _, exp_end4 = engine_expectation(prompt4, tg, 4)
        assert paced(wall * speed, max(exp_end4)), (wall * speed, exp_end4)
        assert sum(r["usage"]["completion_tokens"] for r in rs) == 4 * tg

        # the same long prompt twice: the second finds its prefix cached and its first token comes sooner
        # (judged by the server's own TTFT, in the engine's time: the wall-clock gap is ~0.1 s, within load noise)
        before = await served_ttft_total(s, url)
        await stream_chat(s, url, "again " + text, 4, ignore_eos=True)          # the cold request
        between = await served_ttft_total(s, url)
        warm = await stream_chat(s, url, "again " + text, 4, ignore_eos=True)
        after = await served_ttft_total(s, url)
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= 512
        assert 0 < after - between < between - before

        # min_tokens / no ignore_eos: stops on its own "EOS" at or above min_tokens, reason "stop"
        r = await stream_chat(s, url, "hi", 3000, min_tokens=40)
        assert 40 <= r["usage"]["completion_tokens"] < 3000 and r["finish"] == "stop"

        async with s.get(url + "/metrics") as resp:
            fams = families(await resp.text())
    names = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
             "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens", "vllm:generation_tokens",
             "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
             "vllm:e2e_request_latency_seconds"}
    assert names <= set(fams)
    for n in names:
        assert all(smp.labels.get("model_name") == MODEL for smp in fams[n].samples)
    ttft_count = next(smp.value for smp in fams["vllm:time_to_first_token_seconds"].samples
                      if smp.name.endswith("_count"))
    assert ttft_count == 9
    gen = next(smp.value for smp in fams["vllm:generation_tokens"].samples if smp.name.endswith("_total"))
    assert gen == 6 * tg + 8 + r["usage"]["completion_tokens"]
    hits = next(smp.value for smp in fams["vllm:prefix_cache_hits"].samples if smp.name.endswith("_total"))
    assert hits == warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    ttft_sum = next(smp.value for smp in fams["vllm:time_to_first_token_seconds"].samples if smp.name.endswith("_sum"))
    assert ttft_sum > 0


async def test_non_streaming_completions_models_version_and_errors(server):
    url = server
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/v1/models") as r:
            m = (await r.json())["data"][0]
        assert m["id"] == MODEL and m["max_model_len"] == 4096
        async with s.get(url + "/version") as r:
            v = await r.json()
        assert v["simulated"] is True and "sim" in v["version"]
        async with s.post(url + "/v1/completions", json={"model": MODEL, "prompt": "one two three", "max_tokens": 5,
                                                         "ignore_eos": True}) as r:
            d = await r.json()
        assert d["object"] == "text_completion" and d["usage"] == {"prompt_tokens": 3, "completion_tokens": 5,
                                                                    "total_tokens": 8}
        assert len(d["choices"][0]["text"].split()) == 5
        async with s.post(url + "/tokenize", json={"prompt": d["choices"][0]["text"]}) as r:
            assert (await r.json())["count"] == 5      # generated text re-tokenizes to its own token count
        # context overflow: vLLM's 400 and wording
        async with s.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x " * 10, "max_tokens": 5000}) as r:
            assert r.status == 400
            assert "maximum context length is 4096" in (await r.json())["error"]["message"]
        async with s.post(url + "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user",
                                                                                                "content": "x"}]}) as r:
            assert r.status == 404


@pytest.fixture
async def two_backends_and_router():
    procs, urls = [], []
    try:
        for _ in range(2):
            port = free_port()
            procs.append(start(["sparkconsole.sim.server", "tiny-llama", "--host", HOST, "--port", str(port),
                                "--max-model-len", "2048", "--sim-speed", "1", "--sim-load-speedup", "200"]))
            urls.append(f"http://{HOST}:{port}")
        rport = free_port()
        procs.append(start(["sparkconsole.sim.router", "--flavor", "litellm", "--host", HOST, "--port", str(rport),
                            "--model", "tiny-llama", "--policy", "simple-shuffle", "--seed", "3",
                            *[a for u in urls for a in ("--backend", u + "/v1")]]))
        router = f"http://{HOST}:{rport}"
        for u in urls:
            await wait_http(u + "/health")
        await wait_http(router + "/health", 30)
        async with aiohttp.ClientSession() as s:     # until the router's own probe has seen both backends
            deadline = time.monotonic() + 30
            while True:
                async with s.get(router + "/health") as r:
                    if (await r.json())["healthy_count"] == 2:
                        break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        yield router, urls
    finally:
        for p in procs:
            end(p)


async def test_router_spreads_requests_and_reports(two_backends_and_router):
    router, backends = two_backends_and_router
    async with aiohttp.ClientSession() as s:
        async with s.get(router + "/health/liveliness") as r:
            assert r.status == 200
        async with s.get(router + "/v1/models") as r:
            assert [m["id"] for m in (await r.json())["data"]] == ["tiny-llama"]

        async def one(i: int) -> dict:
            body = {"model": "tiny-llama", "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 8,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            usage = None
            async with s.post(router + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                async for line in r.content:
                    if line.startswith(b"data: {") and b'"usage"' in line:
                        usage = json.loads(line[6:])["usage"]
            return usage

        usages = await asyncio.gather(*(one(i) for i in range(24)))
        assert all(u["completion_tokens"] == 8 for u in usages)
        served = []
        for b in backends:
            async with s.get(b + "/metrics") as r:
                fams = families(await r.text())
            served.append(next(x.value for x in fams["vllm:request_success"].samples if x.name.endswith("_total")))
        assert sum(served) == 24 and min(served) >= 4      # simple-shuffle used both backends
        async with s.get(router + "/metrics") as r:
            fams = families(await r.text())
        total = sum(x.value for x in fams["litellm_proxy_total_requests_metric"].samples if x.name.endswith("_total"))
        assert total == 24
        states = [x.value for x in fams["litellm_deployment_state"].samples]
        assert states == [0.0, 0.0]
        async with s.get(router + "/sim/clock") as r:
            assert (await r.json())["speed"] == 1.0


# Wall-clock pacing against the engine's time, as the alone tests above: at three workers per core a loaded minute
# stretched its 0.64 s to 2.38 s (ci32).
@pytest.mark.alone
async def test_role_chunk_comes_with_the_first_token_after_prefill(server):
    """vLLM sends the first chunk (role, empty content) with the first engine output, after the prefill: a
    client's time to first response is then the prefill, as against the real server. A 3,000-token prompt
    takes the simulated GB10 about a second to prefill (real time at --sim-speed 1)."""
    text = " ".join(f"tok{i % 50}" for i in range(3000))
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4, "stream": True}
    async with aiohttp.ClientSession() as s:
        prompt = await tokenize_count(s, server, text)
        t0 = time.perf_counter()
        stamps = []          # (seconds since send, has role, has content) per chunk with choices
        async with s.post(server + "/v1/chat/completions", json=body) as r:
            async for line in r.content:
                if line.startswith(b"data: {"):
                    d = json.loads(line[6:])
                    for ch in d["choices"]:
                        stamps.append((time.perf_counter() - t0, "role" in ch["delta"], bool(ch["delta"].get("content"))))
    exp_ttft, _ = engine_expectation(prompt, 4, 1)
    assert stamps[0][1] and not stamps[0][2]                     # the role chunk is first …
    first_token = next(t for t, _, content in stamps if content)
    assert paced(stamps[0][0], exp_ttft[0]), (stamps, exp_ttft)  # … and it waits for the prefill
    assert first_token - stamps[0][0] < 0.2 * exp_ttft[0]       # it arrives with the first token, not before prefill


@pytest.mark.alone      # wall-clock pacing against the engine's time: another test beside it skews the wall side
async def test_speed_runs_the_clock_faster_and_reports_simulated_time():
    """--sim-speed 4: a request takes a quarter of the engine's time in real time; every figure the server
    reports (histograms, /sim/clock) stays in simulated seconds."""
    port = free_port()
    proc = start(["sparkconsole.sim.server", MODEL, "--host", HOST, "--port", str(port), *ARGS,
                  "--sim-speed", "4", "--sim-load-speedup", "200", "--no-enable-prefix-caching"])
    url = f"http://{HOST}:{port}"
    try:
        await wait_http(url + "/health")
        text = " ".join(f"tok{i % 50}" for i in range(1000))
        tg = 200
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/sim/clock") as r:
                clock = await r.json()
                assert clock["speed"] == 4.0 and clock["simulated"] is True
                assert r.headers["X-Sim-Speed"] == "4.0"
            prompt = await tokenize_count(s, url, text)
            t0 = time.perf_counter()
            res = await stream_chat(s, url, text, tg, ignore_eos=True)
            wall = time.perf_counter() - t0
            async with s.get(url + "/metrics") as r:
                fams = families(await r.text())
        exp_ttft, exp_end = engine_expectation(prompt, tg, 1)
        assert paced(wall * 4, exp_end[0]), (wall, exp_end)    # at speed 2 or 1 it would take 2-4x as long
        e2e = next(x.value for x in fams["vllm:e2e_request_latency_seconds"].samples if x.name.endswith("_sum"))
        ttft = next(x.value for x in fams["vllm:time_to_first_token_seconds"].samples if x.name.endswith("_sum"))
        assert e2e == pytest.approx(exp_end[0], rel=0.05)        # the server's own figures: simulated seconds
        assert ttft == pytest.approx(exp_ttft[0], rel=0.05, abs=0.01)
        assert paced(res["decode_s"] * 4, exp_end[0] - exp_ttft[0]), (res["decode_s"], exp_end, exp_ttft)
    finally:
        end(proc)


@pytest.mark.alone      # a timing comparison: another test beside it on 2 cores skews one side
async def test_bench_sweep_through_the_simulated_router_agrees_with_the_headless_experiment(monkeypatch):
    """The bench's own sweep (real client, /sim/clock scaling) against a simulated 2x-solo cluster behind the
    simulated LiteLLM router gives what the headless experiment computes for that topology *with the same
    spread*: simple-shuffle is random, and whether a c2 batch lands on one backend or on both changes its
    figures by a third, so the headless model replays the router's own decisions (GET /sim/routes)."""
    # Measured again before it counts: once in about six runs one c2 figure came out 32% off (the pair's two
    # requests reaching a backend one step apart); a real disagreement comes back, a chance one does not.
    off = await _served_against_headless(monkeypatch)
    if off:
        off = await _served_against_headless(monkeypatch)
    assert not off, off


async def _served_against_headless(monkeypatch) -> list[str]:
    """One served sweep, replayed headless; the figures that disagree."""
    from sparkconsole.bench.measure import run_sweep
    from sparkconsole.bench.sweep import SweepSpec
    from sparkconsole.sim import experiment
    from sparkconsole.sim.cluster import SimCluster
    from sparkconsole.sim.routing import RoutingPolicy

    pp, tg, runs, levels = 512, 64, 3, (1, 2)
    base = f"127.{os.getpid() % 200 + 20}.99"
    sim = SimCluster(speed=2, load_speedup=200, nodes=(("spark1", base + ".2"), ("spark2", base + ".3")))
    await sim.start()
    try:
        out = await run_sweep(SweepSpec(url=sim.router_url, pp=(pp,), tg=(tg,), concurrency=levels, runs=runs))
        async with aiohttp.ClientSession() as s, s.get(sim.router_url + "/sim/routes") as r:
            routes = (await r.json())["routes"]
    finally:
        await sim.stop()
    assert out.provenance["simulated"] is True and out.provenance["speed"] == 2.0
    # The sweep's measured requests ask for exactly tg tokens (prompt fitting asks for 1): per level a warm-up
    # batch, then `runs` batches, one after the other.
    picks = [r["backend"] for r in routes if r["max_tokens"] == tg]
    assert len(picks) == sum((1 + runs) * c for c in levels), routes

    class Replay(RoutingPolicy):
        name = "replay"

        def __init__(self, choices: list[int]) -> None:
            self.choices = list(choices)

        def choose(self, backends_inflight):
            return self.choices.pop(0)

    args = EngineArgs(max_num_batched_tokens=32768, gpu_memory_utilization=0.7, max_model_len=4096, kv_cache_dtype="fp8")
    served = {lv.key.concurrency: lv for lv in out.levels}
    at = 0
    off: list[str] = []
    host = None
    for c in levels:
        measured = picks[at + c: at + (1 + runs) * c]          # the warm-up batch is not recorded
        at += (1 + runs) * c
        monkeypatch.setattr(experiment, "make_policy", lambda name, seed=None, m=measured: Replay(m))
        want = experiment.run_level("2x-solo-simple-shuffle", "gpt-oss-120b", args, c, pp, tg, runs)
        lv = served[c]
        if host is None:
            # Served TTFTs also hold real host time that the headless model has no term for (the prompt's trip
            # through this machine's Python HTTP hops, times the clock's speed): one factor over every level
            # of a run, 1.15-1.25 on an idle 2-core machine, 1.37 on a loaded CI runner. The first level
            # measures it, within what a host can add; the other levels are judged with it taken out.
            host = min(max(lv.ttft_ms / want.ttft_ms, 1.0), HOST_TIME_MAX)
        for name, got, expected, rel in (("decode_tps", lv.decode_tps, want.decode_tps, 0.15),
                                         ("prefill_tps", lv.prefill_tps * host, want.prefill_tps, 0.3),
                                         ("ttft_ms", lv.ttft_ms / host, want.ttft_ms, 0.3)):
            if got != pytest.approx(expected, rel=rel):
                off.append(f"c{c} {name}: served {got:.1f} (host time x{host:.2f} taken out), headless "
                           f"{expected:.1f} (routes {measured})")
    return off


HOST_TIME_MAX = 1.6    # more than this over the model at c1 is a disagreement, not a slow host
