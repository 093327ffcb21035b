"""The simulated servers' tokenizer: a word or a punctuation mark is one token. /tokenize, usage, the chat template
and the generated text all agree on it, which is what clients check."""

from __future__ import annotations

import re
import zlib
from typing import Any

_WORD = re.compile(r"\w+|[^\w\s]")
_VOCAB = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "her", "are", "an", "be", "this", "which", "or", "had", "not", "but", "one", "all", "were", "they", "she", "there", "been", "has", "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its", "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time", "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must", "through", "back", "years", "where", "much", "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how", "too", "little", "state", "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get", "here", "between", "both", "life", "being", "under", "never", "day", "same", "another", "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used", "take", "three"]


def token_ids(text: str) -> list[int]:
    return [zlib.crc32(w.encode()) % 200000 for w in _WORD.findall(text)]


def count_tokens(text: str) -> int:
    return len(_WORD.findall(text))


def chat_prompt(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """A chat template: role markers around each message's text (tool/image parts reduced to text)."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        parts.append(f"<|start|> {m.get('role', 'user')} <|message|> {content or ''} <|end|>")
    if add_generation_prompt:
        parts.append("<|start|> assistant")
    return " ".join(parts)


def word_for(req_key: int, i: int) -> str:
    return _VOCAB[(req_key * 7919 + i * 104729) % len(_VOCAB)]



def detokenize(ids: list[object]) -> str:
    """Words for token ids (what /detokenize answers; ids are hashes, so any word of the vocabulary will do)."""
    return " ".join(_VOCAB[t % len(_VOCAB)] for t in ids if isinstance(t, int))
