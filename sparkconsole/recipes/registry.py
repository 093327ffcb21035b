"""Recipe registries (filled in by the registries change)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RegistryHit:
    registry: str
    path: Path
    qualified: str


def find_in_registries(name: str) -> RegistryHit | None:
    return None
