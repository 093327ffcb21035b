"""What the simulated `docker` CLI prints, in docker's formats: its error, timestamps, go-units durations and sizes,
the Go template subset of `--format` (fields, json, index, len, lower/upper/title, if/else/end) and tables."""

from __future__ import annotations

import json
import re
import shlex
import sys
from datetime import UTC, datetime
from typing import Any

ZERO_TIME = "0001-01-01T00:00:00Z"


class DockerError(Exception):
    def __init__(self, message: str, rc: int = 1) -> None:
        super().__init__(message)
        self.rc = rc


# ---------------------------------------------------------------------------------------------------
# time and naming helpers (docker's formats)

def iso(ts: float | None) -> str:
    if not ts:
        return ZERO_TIME
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def human_duration(seconds: float) -> str:
    """docker's go-units HumanDuration."""
    if seconds < 1:
        return "Less than a second"
    if int(seconds) == 1:
        return "1 second"
    if seconds < 60:
        return f"{int(seconds)} seconds"
    minutes = int(seconds / 60)
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = int(seconds / 3600 + 0.5)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{hours // 24 // 365} years"


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([bkmgt]?)b?", text.strip().lower())
    if not m:
        raise DockerError(f"invalid size: '{text}'", 125)
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


# ---------------------------------------------------------------------------------------------------
# Go template subset for --format

_TOKEN = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.S)


def _lookup(obj: Any, path: str) -> Any:
    if path in (".", ""):
        return obj
    cur = obj
    for part in path.lstrip(".").split("."):
        if isinstance(cur, dict):
            cur = cur.get(part)
        else:
            return None
    return cur


def _go_str(v: Any) -> str:
    if v is None:
        return "<no value>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_go_str(x)}" for k, x in v.items()) + "]"
    if isinstance(v, list):
        return "[" + " ".join(_go_str(x) for x in v) + "]"
    return str(v)


def _eval(expr: str, obj: Any) -> Any:
    parts = shlex.split(expr)
    if not parts:
        return None
    fn, rest = parts[0], parts[1:]
    if fn.startswith("."):
        return _lookup(obj, fn)
    if fn == "json":
        return json.dumps(_eval(" ".join(shlex.quote(p) for p in rest), obj), separators=(",", ":"))
    if fn in ("lower", "upper", "title"):
        v = _go_str(_eval(" ".join(shlex.quote(p) for p in rest), obj))
        return getattr(v, fn)()
    if fn == "index" and len(rest) >= 2:
        cur = _lookup(obj, rest[0])
        for key in rest[1:]:
            cur = cur.get(key) if isinstance(cur, dict) else None
        return cur
    if fn == "len":
        found = _lookup(obj, rest[0]) if rest else None
        return len(found) if isinstance(found, (list, dict, str)) else 0
    raise DockerError(f'template: :1: function "{fn}" not defined', 1)


def render(template: str, obj: Any) -> str:
    """Render the supported Go template subset against one object."""
    template = template.replace("\\t", "\t").replace("\\n", "\n")
    pos = 0
    tokens: list[tuple[str, str]] = []
    for m in _TOKEN.finditer(template):
        tokens.append(("text", template[pos:m.start()]))
        tokens.append(("action", m.group(1)))
        pos = m.end()
    tokens.append(("text", template[pos:]))

    def run(i: int, stop: tuple[str, ...]) -> tuple[str, int, str]:
        out = []
        while i < len(tokens):
            kind, val = tokens[i]
            if kind == "text":
                out.append(val)
                i += 1
                continue
            word = val.split(None, 1)[0] if val else ""
            if word in stop:
                return "".join(out), i, word
            if word == "if":
                cond = _eval(val[2:].strip(), obj)
                then, i, ended = run(i + 1, ("else", "end"))
                other = ""
                if ended == "else":
                    other, i, _ = run(i + 1, ("end",))
                out.append(then if cond not in (None, False, 0, "", [], {}) else other)
                i += 1
                continue
            v = _eval(val, obj)
            out.append(v if isinstance(v, str) else _go_str(v))
            i += 1
        return "".join(out), i, ""

    return run(0, ())[0]


# ---------------------------------------------------------------------------------------------------
# output: lines and tables

def out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")


def format_rows(fmt: str | None, objs: list[dict[str, Any]], default_table: list[tuple[str, str]]) -> None:
    if fmt in (None, "", "table"):
        fmt = "table " + "\t".join(f"{{{{.{k}}}}}" for k, _ in default_table)
    if fmt == "json":
        fmt = "{{json .}}"
    if fmt.startswith("table"):
        body = fmt[5:].strip()
        header = render(body, {k: title for k, title in default_table} | {
            k: k.upper() for k in re.findall(r"\{\{\s*\.(\w+)", body) if k not in dict(default_table)})
        rows = [header.split("\t")] + [render(body, o).split("\t") for o in objs]
        widths = [max(len(r[i]) if i < len(r) else 0 for r in rows) for i in range(max(len(r) for r in rows))]
        for r in rows:
            out("   ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
        return
    for o in objs:
        out(render(fmt, o))
