"""One severity per OOM guard and preflight finding, decided here once; the dashboard, `sparkconsole status`, the
recipes screen and `recipe lint` only draw it (issue 41 item 2).

A guard's state is decided by its check (nodes/guard.py: ok / warn / bad / unknown, with the reason and the
fixing command); here that state is given its one meaning for a launch and its one mark:

    ✓ ok       nothing to do
    ? unknown  could not be read: preflight warns that it was not checked
    ! warn     said, and a launch goes ahead
    ✗ refuse   a launch is refused (unless --force): a guard whose state is bad
    ✗ block    refused even with --force (a compromised router release; findings only)

A preflight finding's severity (refuse / block / warn) is the same scale, so a guard reads the same as the finding
preflight makes of it: `vm.min_free_kbytes` too small is `!` on the dashboard, "warn" in `status`, `!` on the
recipes screen and WARN in `recipe lint`.

Pure: no I/O, no Textual; colours are Rich colour names for whoever draws.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Severity:
    name: str           # ok | unknown | warn | refuse | block
    mark: str           # the one mark every view draws
    colour: str         # a Rich colour name
    rank: int           # worse is higher

    @property
    def refuses(self) -> bool:
        return self.rank >= REFUSE.rank

    @property
    def says(self) -> str:
        """What it means, in the words `status` writes beside a guard."""
        return _SAYS[self.name]


OK = Severity("ok", "✓", "green", 0)
UNKNOWN = Severity("unknown", "?", "grey50", 1)
WARN = Severity("warn", "!", "yellow", 2)
REFUSE = Severity("refuse", "✗", "red", 3)
BLOCK = Severity("block", "✗", "bold red", 4)
_BY_NAME = {s.name: s for s in (OK, UNKNOWN, WARN, REFUSE, BLOCK)}
_SAYS = {"ok": "ok", "unknown": "not read", "warn": "a warning", "refuse": "refuses a launch",
         "block": "blocks a launch"}

# A guard check's state → its severity.
_GUARD = {"ok": OK, "unknown": UNKNOWN, "warn": WARN, "bad": REFUSE}


def named(name: str) -> Severity:
    """A severity by name; an unknown name reads as a warning (never silently as ok)."""
    return _BY_NAME.get(name, WARN)


def of_guard(result: Any) -> Severity:
    """A GuardResult's severity (nodes/guard.py)."""
    return _GUARD.get(getattr(result, "status", "unknown"), UNKNOWN)


def of_finding(finding: Any) -> Severity:
    """A preflight Finding's severity (launch/lint.py)."""
    return named(getattr(finding, "severity", "warn"))


# Guards that are a backstop, not a setting a launch can freeze without (earlyoom): said with their fix, never
# refusing a launch, and not said at all while unread (an agent older than the console cannot read them).
BACKSTOPS = frozenset({"earlyoom"})


def preflight_of_guard(result: Any) -> str | None:
    """The severity of the finding preflight makes of a guard: its own, and an unread guard a warning that it was
    not checked; None for a guard that is ok (or a backstop not read)."""
    sev = of_guard(result)
    if sev is OK:
        return None
    if getattr(result, "key", "") in BACKSTOPS:
        return None if sev is UNKNOWN else WARN.name
    return WARN.name if sev is UNKNOWN else sev.name


def worst(severities: Iterable[Severity]) -> Severity:
    return max(severities, key=lambda s: s.rank, default=OK)


# What a launch does for a guard that a command on the node would fix otherwise.
LAUNCH_FIX = {"page_cache": "or launch with --drop-caches, which drops it on each node before the model loads"}


def guard_fix(result: Any) -> str | None:
    """The fix every view says for a guard: its command, and what a launch can do instead where it can."""
    fix = getattr(result, "fix", None)
    more = LAUNCH_FIX.get(getattr(result, "key", ""))
    if fix and more:
        return f"{fix} ({more})"
    return fix or more
