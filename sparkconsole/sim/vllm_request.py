"""One request inside a simulated `vllm serve`: what the server (sim/vllm_server.py) keeps of it and its HTTP face
(sim/vllm_http.py) streams from it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Req:
    rid: str
    key: int
    prompt_tokens: int
    max_tokens: int          # what the client allowed
    target: int              # what will be generated (EOS earlier unless ignore_eos)
    arrival: float
    cached_tokens: int = 0
    queue: asyncio.Queue[tuple[int, bool, float]] = field(default_factory=asyncio.Queue)   # (tokens, finished, t)
    first_at: float | None = None
    last_at: float | None = None
    generated: int = 0
    done: bool = False

    @property
    def finish_reason(self) -> str:
        return "length" if self.generated >= self.max_tokens else "stop"
