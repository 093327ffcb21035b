"""Typed field access over a loaded recipe document: every failure a one-line error naming file, line and field."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import UserError
from ..yamlsrc import Located, Path_

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SIZE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?[bkmgtBKMGT]?$")
CONTAINER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./:@-]{0,255}$")


class Fields:
    """Typed field access over a Located document, every failure a one-line error with the line."""

    def __init__(self, doc: Located) -> None:
        self.doc = doc

    def err(self, path: Path_, problem: str, fix: str) -> UserError:
        return self.doc.error(path, problem, fix)

    def get(self, m: Mapping[str, Any], path: Path_, key: str, kind: type | tuple[type, ...], default: Any,
            fix: str) -> Any:
        if key not in m or m[key] is None:
            return default
        v = m[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if (isinstance(v, bool) and bool not in kinds) or not isinstance(v, kinds):
            raise self.err(path + (key,), f"expected {kinds[0].__name__}, got {type(v).__name__} {str(v)[:40]!r}", fix)
        return v

    def mapping(self, m: Mapping[str, Any], path: Path_, key: str, fix: str) -> dict[str, Any]:
        v: dict[str, Any] = self.get(m, path, key, dict, {}, fix)
        return v

    def str_list(self, m: Mapping[str, Any], path: Path_, key: str, fix: str) -> tuple[str, ...]:
        v = m.get(key)
        if v is None:
            return ()
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list):
            raise self.err(path + (key,), f"expected a list, got {type(v).__name__}", fix)
        out = []
        for i, item in enumerate(v):
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise self.err(path + (key, i), f"expected text, got {type(item).__name__}", fix)
            out.append(str(item))
        return tuple(out)

    def unknown(self, m: Mapping[str, Any], path: Path_, allowed: set[str]) -> None:
        for k in m:
            if k not in allowed:
                raise self.err(path + (k,), f"unknown key {str(k)[:40]!r}",
                               f"remove it, or use one of: {', '.join(sorted(allowed))}")

    def port(self, m: Mapping[str, Any], path: Path_, key: str, default: int | None) -> int | None:
        v: int | None = self.get(m, path, key, int, default, "write a port number 1-65535")
        if v is not None and not 1 <= v <= 65535:
            raise self.err(path + (key,), f"port {v} out of range", "write a port number 1-65535")
        return v

    def positive(self, m: Mapping[str, Any], path: Path_, key: str, default: int | None) -> int | None:
        if key in m and m[key] is None:
            return None
        v: int | None = self.get(m, path, key, int, default, f"write a whole number, e.g. {key}: {default}")
        if v is not None and (isinstance(v, bool) or v < 1):
            raise self.err(path + (key,), f"{key} must be a whole number ≥ 1", f"write e.g. {key}: {default}")
        return v

    def size(self, m: Mapping[str, Any], path: Path_, key: str, default: str | None) -> str | None:
        if key in m and m[key] is None:
            return None
        v = self.get(m, path, key, (str, int), default, "write a size like 100g")
        if v is not None and not SIZE_RE.match(str(v)):
            raise self.err(path + (key,), f"bad size {str(v)[:20]!r}", "write a size like 100g or 512m")
        return None if v is None else str(v)

    def iface(self, m: Mapping[str, Any], path: Path_, key: str) -> str | None:
        v: str | None = self.get(m, path, key, str, None, "write an interface name like enp1s0f0np0")
        if v is not None and not re.match(r"^[A-Za-z0-9_.:,-]{1,64}$", v):
            raise self.err(path + (key,), f"bad interface name {v[:30]!r}", "write an interface name like enp1s0f0np0")
        return v
