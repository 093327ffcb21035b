"""Prompts of an exact token count, unique per request so prefix caching cannot shorten prefill.

Text is made of common English words that are one token each (with their leading space) in the usual
BPE tokenizers, so a prompt's length moves one token per word and shuffling the words (the per-request
uniqueness) keeps its length. The count is taken from the server: its /tokenize endpoint (vLLM) when it
answers, else `usage.prompt_tokens` of a one-token request. The target is the whole prompt as the server
counts it, chat template included (llama-benchy's adapted prompt), i.e. pp + depth tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Awaitable, Callable

import aiohttp

from ..errors import UserError
from .client import api_base, chat_payload, server_root, stream_chat

WORDS = tuple("""the of and to in is you that it he was for on are as with his they at be this have from or one had
by word but not what all were we when your can said there use an each which she do how their if will up other about
out many then them these so some her would make like him into time has look two more write go see number no way could
people my than first water been call who its now find long down day did get come made may part over new sound take
only little work know place year live me back give most very after thing our just name good sentence man think say
great where help through much before line right too mean old any same tell boy follow came want show also around form
three small set put end does another well large must big even such because turn here why ask went men read need land
different home us move try kind hand picture again change off play spell air away animal house point page letter
mother answer found study still learn should world high every near add food between own below country plant last
school father keep tree never start city earth eye light thought head under story saw left few while along might
close something seem next hard open example begin life always those both paper together got group often run""".split())

MAX_ROUNDS = 8

Counter = Callable[[list[dict]], Awaitable[int]]


@dataclass(frozen=True)
class PromptShape:
    """Words in the context (system) and prompt (user) messages that give `target` tokens on this server."""

    context_words: int
    prompt_words: int
    target: int
    measured: int          # the count the server gave for this shape (== target unless unreachable)
    source: str            # "tokenize" | "usage"


def _text(n: int, rng: random.Random) -> str:
    words = [WORDS[rng.randrange(len(WORDS))] for _ in range(n)]
    return " ".join(words)


def messages(shape: PromptShape, rng: random.Random) -> list[dict]:
    msgs = []
    if shape.context_words:
        msgs.append({"role": "system", "content": _text(shape.context_words, rng)})
    msgs.append({"role": "user", "content": _text(max(1, shape.prompt_words), rng)})
    return msgs


async def fit_shape(count: Counter, pp: int, depth: int, *, source: str) -> PromptShape:
    """Find word counts whose prompt the server counts as pp + depth tokens (secant steps, then ±1)."""
    target = pp + depth
    rng = random.Random(0)
    ctx = depth
    words = max(1, pp)

    async def measure(w: int) -> int:
        probe = PromptShape(ctx, w, target, 0, source)
        return await count(messages(probe, random.Random(rng.random())))

    got = await measure(words)
    best = (abs(got - target), words, got)
    seen = {words: got}
    for _ in range(MAX_ROUNDS):
        if got == target:
            break
        step = target - got
        nxt = max(1, words + step)
        if nxt in seen:
            nxt = max(1, words + (1 if step > 0 else -1))
            if nxt in seen:
                break
        words = nxt
        got = await measure(words)
        seen[words] = got
        best = min(best, (abs(got - target), words, got))
    _, words, got = best
    return PromptShape(ctx, words, target, got, source)


def tokenize_counter(session: aiohttp.ClientSession, url: str, model: str,
                     headers: dict[str, str] | None = None) -> Counter:
    """Count a chat prompt with vLLM's POST /tokenize (template applied, generation prompt added)."""
    async def count(msgs: list[dict]) -> int:
        async with session.post(server_root(url) + "/tokenize", json={"model": model, "messages": msgs},
                                headers=headers) as resp:
            if resp.status != 200:
                raise LookupError(f"/tokenize answered HTTP {resp.status}")
            data = await resp.json(content_type=None)
        n = data.get("count") if isinstance(data, dict) else None
        if not isinstance(n, int):
            raise LookupError("/tokenize gave no count")
        return n
    return count


def usage_counter(session: aiohttp.ClientSession, url: str, model: str,
                  headers: dict[str, str] | None = None, *, token_ids: bool = True) -> Counter:
    """Count a chat prompt by sending it with max_tokens=1 and reading usage.prompt_tokens."""
    async def count(msgs: list[dict]) -> int:
        body = chat_payload(model, msgs, 1, exact_tg=False, token_ids=token_ids)
        r = await stream_chat(session, api_base(url) + "/chat/completions", body, headers=headers)
        if r.error:
            raise UserError(f"calibration request failed: {r.error}", field="--url",
                            fix="check that the endpoint serves the model and answers chat completions")
        if not r.prompt_tokens:
            raise LookupError("no usage.prompt_tokens in the stream")
        return r.prompt_tokens
    return count


async def calibrate(session: aiohttp.ClientSession, url: str, model: str, pp: int, depth: int,
                    headers: dict[str, str] | None = None, *, token_ids: bool = True) -> PromptShape:
    try:
        return await fit_shape(tokenize_counter(session, url, model, headers), pp, depth, source="tokenize")
    except (LookupError, aiohttp.ClientError, ValueError):
        pass
    try:
        return await fit_shape(usage_counter(session, url, model, headers, token_ids=token_ids), pp, depth,
                               source="usage")
    except LookupError:
        # No way to count on this server: send pp words and let the metrics use what usage reports.
        return PromptShape(depth, max(1, pp), pp + depth, 0, "none")
