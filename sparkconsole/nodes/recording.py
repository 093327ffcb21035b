"""Recorded agent sessions: JSON lines exactly as the agent printed them on a node (tests/fixtures/agent-*.jsonl).

Stdlib only, kept apart from the replay transport, so the console can check a recording before the SSH stack is
imported."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def split_recording(lines: Sequence[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The hello object and the tick objects of a recording (other lines are skipped, as the agent's are)."""
    hello: dict[str, Any] = {}
    ticks: list[dict[str, Any]] = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("type") == "hello" and not hello:
            hello = obj
        elif isinstance(obj, dict) and obj.get("type") == "tick":
            ticks.append(obj)
    return hello, ticks


def read_recording(path: str | Path) -> list[str]:
    """Every line of a recording, blank ones included."""
    return Path(path).read_text(encoding="utf-8").splitlines()


def load_recording(path: str | Path) -> list[str]:
    """The non-blank lines of a recording."""
    return [line for line in read_recording(path) if line.strip()]
