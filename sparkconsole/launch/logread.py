"""Reading a server's log for why it stopped: the line that says so, vLLM refusals we know and their fixes, and
the exit mark of a server started with `docker exec`."""

from __future__ import annotations

import re
from collections.abc import Sequence

from .steps import EXIT_MARK

_ERROR_LINE = re.compile(r"\b[A-Za-z_.]*(Error|Exception)\b:|\bERROR\b|\bFATAL\b|\bfailed\b|\bKilled\b|out of memory|OOM",
                         re.IGNORECASE)


def error_line(lines: Sequence[str]) -> str | None:
    """The line that says why a server died: the last exception line (with the indented detail line that
    follows it, as pydantic writes its validation errors), else the last error-looking line."""
    raw = [ln.rstrip() for ln in lines if ln.strip()]
    for i in range(len(raw) - 1, -1, -1):
        ln = raw[i].strip()
        if re.search(r"\b[A-Za-z_.]*(Error|Exception)\b:", ln) and "most recent call last" not in ln:
            # vLLM prefixes each line with its process, e.g. "(APIServer pid=7) "
            nxt = re.sub(r"^\([\w:]+ pid=\d+\) ?", "", raw[i + 1]) if i + 1 < len(raw) else ""
            if nxt[:1].isspace() and not nxt.strip().startswith(("File ", "For further information")):
                ln = f"{ln} — {nxt.strip()}"
            return ln[:500]
    for ln in reversed(raw):
        if _ERROR_LINE.search(ln) and "most recent call last" not in ln:
            return ln.strip()[:500]
    return raw[-1].strip()[:500] if raw else None


# Refusals vLLM states in its own words, and what to do about each: a log line alone rarely says the fix.
KNOWN_REFUSALS: tuple[tuple[str, str], ...] = (
    (r"does not support ray",
     "this vLLM build's platform cannot run the Ray executor (vLLM's CPU build has no Ray device): "
     "launch with --backend mp (vLLM's own multi-node launch)"),
    (r"Not enough allowed NUMA nodes",
     "ranks of a CPU build on one machine need their own cores: set VLLM_CPU_OMP_THREADS_BIND per node "
     "(the cluster file's vllm_env) or per rank (\"0|1\")"),
    (r"failed to map segment from shared object|mounted with noexec",
     "vLLM compiles kernels into /tmp, and this container's /tmp is noexec: mount it with exec "
     "(sparkconsole.container.tmpfs: [\"/tmp:exec\"]) or set TORCHINDUCTOR_CACHE_DIR to a writable exec path"),
    (r"No module named '?nixl|NIXL is not available",
     "the KV connector needs NIXL in the image: pip install nixl (the meta package, not nixl-cu12 alone)"),
)


def known_refusal_fix(line: str | None) -> str | None:
    if not line:
        return None
    for pattern, fix in KNOWN_REFUSALS:
        if re.search(pattern, line):
            return fix
    return None


def exit_line(lines: Sequence[str]) -> str | None:
    """'exit code N' once a server started with `docker exec` wrote its exit mark (plan.EXIT_MARK)."""
    for ln in reversed(lines):
        if EXIT_MARK in ln:
            return "exit code " + ln.split(EXIT_MARK, 1)[1].strip()[:10]
    return None
