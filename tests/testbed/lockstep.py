"""Both measurers on one server, batch by batch: sparkconsole's client and llama-benchy 0.4.0's, in lockstep.

Run with llama-benchy's own interpreter (its venv), the repository on sys.path:
    <benchy venv>/bin/python tests/testbed/lockstep.py URL MODEL TOKENIZER --book-url U \
        --pp 128 --tg 64 --concurrency 1 2 --rounds 24 --out F

Why lockstep: on a shared 2-core VM the same server's speed wanders by ±10 % over tens of seconds (one sweep of
either tool, measured block by block). Two CLIs run one after the other see different stretches of it, so their
difference is mostly the machine's. Here each round is ours, theirs, theirs, ours — one batch each, well under a
second apart — so both sample the same stretches and what is left is the tools' difference.

What is whose:
- sparkconsole: its prompts (fitted with /tokenize, `bench.prompts`), its client (`bench.client.stream_chat`) and
  its per-request figures (`bench.metrics.request_figures`), exactly what `sparkconsole bench run` uses.
- llama-benchy: its corpus, prompt generator and prompt adaptation (`client.warmup`'s delta, as its runner does),
  its `LLMClient.run_generation` and its `BenchmarkResults.add`, whose per-request `values` are what its JSON holds.
Each tool has its own aiohttp session, configured as each tool configures it (llama-benchy's without
its per-request environment lookups: Theirs.start says why). Output: JSON, per concurrency, tool
and key (e2e_ttft in ms, pp_req_throughput and tg_req_throughput in t/s: llama-benchy's keys), one list per round
of that tool's per-request values (its two batches), so a comparison can pair each round with itself
(tests/testbed/timing.py, compare_rounds); and "prompt_tokens", each request's prompt as the server counted it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp  # noqa: E402  (llama-benchy's venv provides it)
from llama_benchy.client import LLMClient  # noqa: E402
from llama_benchy.corpus import TokenizedCorpus  # noqa: E402
from llama_benchy.prompts import PromptGenerator  # noqa: E402
from llama_benchy.results import BenchmarkResults  # noqa: E402

from sparkconsole.bench.client import chat_payload, open_session, stream_chat  # noqa: E402
from sparkconsole.bench.metrics import request_figures  # noqa: E402
from sparkconsole.bench.prompts import calibrate, messages  # noqa: E402
from tests.testbed.timing import Rounds  # noqa: E402

KEYS = ("e2e_ttft", "pp_req_throughput", "tg_req_throughput")


class Ours:
    def __init__(self, base: str, model: str, pp: int, tg: int) -> None:
        self.base, self.model, self.pp, self.tg = base.rstrip("/"), model, pp, tg
        self.rng = random.Random()
        self.shape = None

    async def start(self, max_c: int) -> None:
        self.session = open_session(max_c)          # as bench.measure.run_sweep opens its session
        self.shape = await calibrate(self.session, self.base, self.model, self.pp, 0)

    def prepare(self, c: int) -> list[bytes]:
        return [json.dumps(chat_payload(self.model, m, self.tg)).encode() for m in self.messages(c)]

    def messages(self, c: int) -> list[list[dict]]:
        return [messages(self.shape, self.rng) for _ in range(c)]

    async def send(self, bodies: list[bytes]) -> dict[str, list[float]]:
        url = self.base + "/v1/chat/completions"
        results = await asyncio.gather(*(stream_chat(self.session, url, b) for b in bodies))
        out: dict[str, list[float]] = {k: [] for k in (*KEYS, "prompt_tokens")}
        for r in results:
            if not r.ok:
                raise SystemExit(f"sparkconsole request failed: {r.error}")
            f = request_figures(r, expected_prompt=self.shape.target)
            out["e2e_ttft"].append(f.ttft_s * 1000)
            out["prompt_tokens"].append(f.prompt_tokens)
            if f.prefill_tps:
                out["pp_req_throughput"].append(f.prefill_tps)
            if f.decode_tps:
                out["tg_req_throughput"].append(f.decode_tps)
        return out

    async def close(self) -> None:
        await self.session.close()


def benchy_session(max_c: int, trust_env: bool = False) -> aiohttp.ClientSession:
    """As llama_benchy.runner opens its session, but trust_env off unless asked: with it on, aiohttp looks up
    ~/.netrc and the proxy variables in a thread for every request, after llama-benchy's clock has started.
    That cost 1.1 ms per request here (benchmarks/client_dispatch.py: the request reaches the server 1.78 vs
    0.65 ms after the clock), ~3 % of a c1 TTFT, which its figures count and ours do not. The lockstep compares
    how the tools time the server."""
    conn = aiohttp.TCPConnector(limit=max_c + 5, force_close=False, keepalive_timeout=600)
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600), connector=conn, trust_env=trust_env)


class Theirs:
    def __init__(self, base: str, model: str, tokenizer: str, book_url: str, pp: int, tg: int) -> None:
        self.client = LLMClient(base.rstrip("/") + "/v1", "EMPTY", model, exact_tg=True)
        self.model, self.pp, self.tg = model, pp, tg
        self.corpus = TokenizedCorpus(book_url, tokenizer, model)
        self.gen = PromptGenerator(self.corpus)
        self.lend: Callable[[int], list[list[dict]]] | None = None

    async def start(self, max_c: int, trust_env: bool = False) -> None:
        # benchy_session, then llama-benchy's warm-up, which measures the chat template's tokens
        self.session = benchy_session(max_c, trust_env)
        delta_user, _ = await self.client.warmup(self.session, self.corpus.get_tokenizer())
        self.adapted_pp = max(1, self.pp - delta_user)

    def prepare(self, c: int) -> list:
        if self.lend is not None:            # our prompts, as (no context, the user message's text)
            return [("", msgs[-1]["content"]) for msgs in self.lend(c)]
        return self.gen.generate_batch(c, self.adapted_pp, 0, False)

    async def send(self, prompts: list) -> dict[str, list[float]]:
        c = len(prompts)
        batch = await asyncio.gather(*(self.client.run_generation(self.session, context, prompt, self.tg, False,
                                                                 self.corpus.get_tokenizer())
                                       for context, prompt in prompts))
        if any(r.error for r in batch):
            raise SystemExit(f"llama-benchy request failed: {next(r.error for r in batch if r.error)}")
        res = BenchmarkResults()
        res.add(self.model, self.pp, self.tg, 0, c, [batch], 0.0, self.adapted_pp)
        run = res.runs[-1]
        out = {k: list(getattr(run, k).values) if getattr(run, k) else [] for k in KEYS}
        out["prompt_tokens"] = [r.prompt_tokens for r in batch]     # the server's usage count
        return out

    async def close(self) -> None:
        await self.session.close()


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("tokenizer")
    ap.add_argument("--book-url", required=True, help="llama-benchy's book; its text already in HOME's cache")
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--pause-ms", type=float, default=10.0, help="quiet before every batch, the same for both tools")
    ap.add_argument("--benchy-trust-env", action="store_true",
                    help="llama-benchy's session as its CLI opens it (netrc and proxy lookups on every request)")
    ap.add_argument("--same-prompts", action="store_true",
                    help="llama-benchy sends prompts made as ours are (the same words, each its own order)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    tools = {"ours": Ours(args.url, args.model, args.pp, args.tg),
             "benchy": Theirs(args.url, args.model, args.tokenizer, args.book_url, args.pp, args.tg)}
    if args.same_prompts:
        tools["benchy"].lend = tools["ours"].messages
    max_c = max(args.concurrency)
    await tools["ours"].start(max_c)
    await tools["benchy"].start(max_c, trust_env=args.benchy_trust_env)

    async def batch(tool, c: int) -> dict[str, list[float]]:
        # Each tool prepares its batch (ours: shuffle and encode, ~0.1 ms; llama-benchy: cut prompts from its
        # corpus, a few ms), then both wait the same pause, so the server meets every batch equally rested:
        # on this VM an idle vCPU halts, and a request sent straight after the last one ended reads a lower TTFT
        # (measured: 34.2 ms back to back, 35.4-36.6 ms after 2-200 ms of quiet). Without the pause the faster
        # preparer wins that by ~3 % at c1, a difference in pacing, not in timing.
        prepared = tool.prepare(c)
        await asyncio.sleep(args.pause_ms / 1000)
        return await tool.send(prepared)

    data: Rounds = {}
    try:
        for c in args.concurrency:
            for tool in tools.values():        # a warm-up batch each, not recorded
                await batch(tool, c)
            per = data[str(c)] = {name: {k: [] for k in (*KEYS, "prompt_tokens")} for name in tools}
            for _ in range(args.rounds):
                for name in tools:
                    for k in per[name]:
                        per[name][k].append([])
                for name in ("ours", "benchy", "benchy", "ours"):
                    for k, v in (await batch(tools[name], c)).items():
                        per[name][k][-1].extend(v)
    finally:
        for tool in tools.values():
            await tool.close()
    Path(args.out).write_text(json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
