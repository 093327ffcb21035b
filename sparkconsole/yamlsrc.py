"""Safe YAML loading that remembers where each value came from, so errors can name the line.

Shared by the cluster file (config.py) and recipes (recipes/v1.py, recipes/v2.py). Refuses documents that are too
large or use many aliases (an alias bomb expands to gigabytes when walked), with a one-line UserError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import UserError

MAX_BYTES = 1_000_000
MAX_ALIASES = 64
MAX_DEPTH = 32
MAX_NODES = 50_000   # after alias expansion: few aliases can still multiply into billions of nodes

Path_ = tuple[str | int, ...]


class Located:
    """A loaded document plus a map from key paths to 1-based line numbers."""

    def __init__(self, data: Any, lines: dict[Path_, int], file: str, warnings: list[str] | None = None) -> None:
        self.data = data
        self.lines = lines
        self.file = file
        self.warnings = warnings or []     # e.g. a repeated key read the loader's way (duplicates="last")

    def line(self, path: Path_) -> int | None:
        # Walk up until a known path: a missing field is reported at its parent mapping.
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), 1)

    def error(self, path: Path_, problem: str, fix: str) -> UserError:
        field = ".".join(str(x) if not isinstance(x, int) else f"[{x}]" for x in path).replace(".[", "[")
        return UserError(problem, file=self.file, line=self.line(path), field=field or None, fix=fix)


class _Budget:
    """What one walk shares: the expanded-node budget, how repeated keys are read, the warnings they leave."""

    def __init__(self, duplicates: str = "error") -> None:
        self.left = MAX_NODES
        self.duplicates = duplicates
        self.warnings: list[str] = []


def _walk(node: yaml.Node, path: Path_, lines: dict[Path_, int], depth: int, file: str, budget: _Budget) -> Any:
    budget.left -= 1
    if budget.left < 0:
        raise UserError(f"more than {MAX_NODES} values once aliases are expanded", file=file,
                        line=node.start_mark.line + 1, fix="write the values out instead of using anchors")
    if depth > MAX_DEPTH:
        raise UserError("nesting too deep", file=file, line=node.start_mark.line + 1,
                        fix=f"keep the document under {MAX_DEPTH} levels")
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for knode, vnode in node.value:
            key = _scalar(knode, file)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise UserError("mapping keys must be plain scalars", file=file, line=knode.start_mark.line + 1,
                                fix="use a plain name as the key")
            kp = path + (str(key),)
            if key in out:
                if budget.duplicates != "last":
                    raise UserError(f"duplicate key {key!r}", file=file, line=knode.start_mark.line + 1,
                                    fix="remove one of the two entries")
                # PyYAML's safe_load (what spark-vllm-docker's runner uses) keeps the last: so do we, and say so.
                first = lines.get(kp)
                budget.warnings.append(
                    f"{file}:{knode.start_mark.line + 1}: duplicate key {str(key)[:40]!r} (first on line {first}); "
                    "the last one is read, as the runner's YAML loader does — fix: remove one of the two")
                for stale in [p for p in lines if p[:len(kp)] == kp]:
                    del lines[stale]
                del out[key]
            lines[kp] = knode.start_mark.line + 1
            out[str(key) if not isinstance(key, str) else key] = _walk(vnode, kp, lines, depth + 1, file, budget)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(v, path + (i,), lines, depth + 1, file, budget) for i, v in enumerate(node.value)]
    return _scalar(node, file)


def _scalar(node: yaml.Node, file: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise UserError("a key must be a scalar", file=file, line=node.start_mark.line + 1, fix="use a plain name")
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node)
    except yaml.YAMLError as exc:
        raise UserError(f"bad value: {exc.problem if hasattr(exc, 'problem') else exc}", file=file,
                        line=node.start_mark.line + 1, fix="quote the value") from None
    finally:
        loader.dispose()


def load_text(text: str, file: str, duplicates: str = "error") -> Located:
    """Parse YAML text; every failure is a one-line UserError naming `file` and the line. A repeated key is an
    error, or with duplicates="last" (recipes: read as the runner reads them) the last wins with a warning."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise UserError(f"file larger than {MAX_BYTES} bytes", file=file, fix="this is not a config file; check the path")
    try:
        aliases = sum(1 for ev in yaml.parse(text, Loader=yaml.SafeLoader) if isinstance(ev, yaml.AliasEvent))
        if aliases > MAX_ALIASES:
            raise UserError(f"{aliases} YAML aliases (limit {MAX_ALIASES})", file=file,
                            fix="write the values out instead of using anchors")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except UserError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise UserError(f"not valid YAML ({exc.problem or exc.context})", file=file,
                        line=mark.line + 1 if mark else None, fix="correct the YAML syntax at that line") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise UserError(f"not valid YAML ({type(exc).__name__})", file=file, fix="correct the YAML syntax") from None
    lines: dict[Path_, int] = {}
    if node is None:
        return Located(None, {(): 1}, file)
    budget = _Budget(duplicates)
    try:
        data = _walk(node, (), lines, 0, file, budget)
    except RecursionError:
        raise UserError("nesting too deep", file=file, fix="flatten the document") from None
    return Located(data, lines, file, budget.warnings)


def read_user_file(path: str | Path, max_bytes: int) -> bytes:
    """A file the user named, as bytes; missing, unreadable or larger than `max_bytes` -> one-line UserError.
    Reads at most max_bytes + 1 bytes, so a huge file (or a device) is refused without being read whole."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise UserError("file not found", file=str(p), fix="check the path") from None
    except OSError as exc:
        raise UserError(f"cannot read ({exc.strerror})", file=str(p), fix="point at a readable file") from None
    if len(raw) > max_bytes:
        raise UserError(f"file larger than {max_bytes} bytes", file=str(p), fix="check the path")
    return raw


def load_file(path: str | Path, duplicates: str = "error") -> Located:
    p = Path(path)
    raw = read_user_file(p, MAX_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"not UTF-8 text (byte {exc.start})", file=str(p), fix="save the file as UTF-8") from None
    return load_text(text, str(p), duplicates)
