"""Prompts of an exact token count, unique per request so prefix caching cannot shorten prefill.

A prompt is a fixed sequence of common English words, fitted on the server to the exact count; each request
gets the same words in its own random order. Byte-level BPE, SentencePiece and tiktoken-style tokenizers split
text at the spaces before words, so a word costs the same tokens wherever it stands and every order has the
same length. The count is taken from the server: its /tokenize endpoint (vLLM) when it answers, else
`usage.prompt_tokens` of a one-token request. The target is the whole prompt as the server counts it, chat
template included (llama-benchy's adapted prompt): pp + depth tokens, depth in a system message.

Fitting: the token count grows with the number of words taken from the sequence; a bracketing search (secant
steps inside the bracket) finds the most words that stay within the target, and the rest is filled with a word
the server counts as one token.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..errors import UserError
from .client import api_base, chat_payload, server_root, stream_chat

WORDS = tuple(["the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no", "way", "could", "people", "my", "than", "first", "water", "been", "call", "who", "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part", "over", "new", "sound", "take", "only", "little", "work", "know", "place", "year", "live", "me", "back", "give", "most", "very", "after", "thing", "our", "just", "name", "good", "sentence", "man", "think", "say", "great", "where", "help", "through", "much", "before", "line", "right", "too", "mean", "old", "any", "same", "tell", "boy", "follow", "came", "want", "show", "also", "around", "form", "three", "small", "set", "put", "end", "does", "another", "well", "large", "must", "big", "even", "such", "because", "turn", "here", "why", "ask", "went", "men", "read", "need", "land", "different", "home", "us", "move", "try", "kind", "hand", "picture", "again", "change", "off", "play", "spell", "air", "away", "animal", "house", "point", "page", "letter", "mother", "answer", "found", "study", "still", "learn", "should", "world", "high", "every", "near", "add", "food", "between", "own", "below", "country", "plant", "last", "school", "father", "keep", "tree", "never", "start", "city", "earth", "eye", "light", "thought", "head", "under", "story", "saw", "left", "few", "while", "along", "might", "close", "something", "seem", "next", "hard", "open", "example", "begin", "life", "always", "those", "both", "paper", "together", "got", "group", "often", "run"])

MAX_PROBES = 40
HEAD = "Text:"          # a fixed first word: the first word of a text tokenizes differently (no leading space)
FILLERS = ("the", "a", "of", "and", "to", "in", "is", "it", "on", "be")

Counter = Callable[[list[dict[str, Any]]], Awaitable[int]]


@dataclass(frozen=True)
class PromptShape:
    """The words of the context (system) and prompt (user) messages; shuffled per request, same length."""

    context_words: tuple[str, ...] | None     # None: no system message (depth 0)
    prompt_words: tuple[str, ...]
    target: int
    measured: int          # the server's count for this shape (== target unless it cannot be reached)
    source: str            # "tokenize" | "usage" | "none"


def word_sequence(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [WORDS[rng.randrange(len(WORDS))] for _ in range(n)]


def _msgs(context: Sequence[str] | None, prompt: Sequence[str]) -> list[dict[str, Any]]:
    msgs = []
    if context is not None:
        msgs.append({"role": "system", "content": " ".join((HEAD, *context))})
    msgs.append({"role": "user", "content": " ".join((HEAD, *prompt))})
    return msgs


def messages(shape: PromptShape, rng: random.Random) -> list[dict[str, Any]]:
    ctx = None if shape.context_words is None else list(shape.context_words)
    prm = list(shape.prompt_words)
    if ctx:
        rng.shuffle(ctx)
    rng.shuffle(prm)
    return _msgs(ctx, prm)


async def _most_words_within(f: Callable[[int], Awaitable[int]], target: int, first_hi: int) -> tuple[int, int]:
    """Largest n with f(n) <= target, for f nondecreasing with f(n) >= n (every word costs a token or more).
    Returns (n, f(n)). Bracketing search with secant guesses: a few probes when f is near linear."""
    lo, f_lo = 0, await f(0)
    if f_lo >= target:
        return 0, f_lo
    hi = max(1, min(first_hi, target + 1))
    f_hi = await f(hi)
    if f_hi <= target:
        lo, f_lo = hi, f_hi
        if f_lo == target:
            return lo, f_lo
        hi = target + 1                       # f(target + 1) > target: always a bracket
        f_hi = await f(hi)
    probes = 3
    while hi - lo > 1 and probes < MAX_PROBES:
        guess = lo + round((target - f_lo) * (hi - lo) / max(1, f_hi - f_lo))
        guess = min(max(guess, lo + 1), hi - 1)
        got = await f(guess)
        probes += 1
        if got <= target:
            lo, f_lo = guess, got
            if got == target:
                break
        else:
            hi, f_hi = guess, got
    return lo, f_lo


async def fit_shape(count: Counter, pp: int, depth: int, *, source: str, seed: int = 0) -> PromptShape:
    """Fit word lists whose prompt the server counts as exactly pp + depth tokens (template included)."""
    target = pp + depth
    context: list[str] | None = None
    if depth:
        ctx_seq = word_sequence(depth + 1, seed)
        empty = await count(_msgs([], []))

        async def f_ctx(n: int) -> int:
            return await count(_msgs(ctx_seq[:n], [])) - empty
        n, _ = await _most_words_within(f_ctx, depth, depth)
        context = ctx_seq[:n]
    prm_seq = word_sequence(target + 1, seed + 1)

    async def f_prm(n: int) -> int:
        return await count(_msgs(context, prm_seq[:n]))
    n, got = await _most_words_within(f_prm, target, max(1, pp))
    words = prm_seq[:n]
    if got < target:
        # Fill the rest with a word this server counts as one token (order-independent like the others).
        for filler in FILLERS:
            if await count(_msgs(context, [*words, filler])) == got + 1:
                words += [filler] * (target - got)
                got = await count(_msgs(context, words))
                break
    return PromptShape(None if context is None else tuple(context), tuple(words), target, got, source)


def tokenize_counter(session: aiohttp.ClientSession, url: str, model: str,
                     headers: dict[str, str] | None = None) -> Counter:
    """Count a chat prompt with vLLM's POST /tokenize (template applied, generation prompt added)."""
    async def count(msgs: list[dict[str, Any]]) -> int:
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
    async def count(msgs: list[dict[str, Any]]) -> int:
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
        # No way to count on this server: one word per token, and the metrics use what usage reports.
        return PromptShape(tuple(word_sequence(depth, 0)) if depth else None, tuple(word_sequence(max(1, pp), 1)),
                           pp + depth, 0, "none")
