"""Preflight's vocabulary (launch/lint.py and its rule modules lint_*.py): a `Finding`, the `Facts` read from the
nodes, and the helpers every rule module uses on a plan's server argvs. Below lint.py and every rule module."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import severity
from .argv import flag_value

if TYPE_CHECKING:
    from ..nodes.samples import Tick
    from ..placement.modelinfo import ModelInfo
    from .steps import Plan

# Each rule's section, which a user can open (a heading per rule name: GitHub's anchor is the name itself).
PREFLIGHT_DOC = "docs/PREFLIGHT.md"


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str                       # refuse | block | warn
    message: str
    source: str
    fix: str | None = None
    node: str | None = None

    @property
    def refuses(self) -> bool:
        return severity.of_finding(self).refuses

    def line(self, *, explain: bool = False) -> str:
        """One line: severity, rule, node, message, fix, and the page that says why (docs/PREFLIGHT.md, one
        section per rule). `explain`: the evidence under it (published runs and public threads, by name)."""
        where = f"[{self.node}] " if self.node else ""
        text = f"{self.severity.upper()} {self.rule}: {where}{self.message}"
        if self.fix:
            text += f" — fix: {self.fix}"
        text += f" (why: {self.why})"
        return text + (f"\n    evidence: {self.source}" if explain and self.source else "")

    @property
    def why(self) -> str:
        return f"{PREFLIGHT_DOC}#{self.rule}"


@dataclass(frozen=True)
class Facts:
    """What was learned from the nodes; anything missing is simply not checked (or reported as unknown)."""
    guards: Mapping[str, Sequence[Any]] = field(default_factory=dict)   # node → GuardResult list (nodes/guard.py)
    image_ids: Mapping[str, str | None] = field(default_factory=dict)   # node → image ID, None when absent
    mem: Mapping[str, Any] = field(default_factory=dict)                # node → HostMemory (total_kb, available_kb)
    unified: Mapping[str, bool] = field(default_factory=dict)           # node → unified memory (GB10)
    model_info: ModelInfo | None = None                                 # the model as the node's HF cache has it
    headroom_floor_gib: float = 8.0                                     # thresholds.headroom_floor_gib
    boot_ids: Mapping[str, str] = field(default_factory=dict)           # node → boot id: which nodes share a machine
    busy_ports: Mapping[str, Sequence[tuple[str, int, str]]] = field(default_factory=dict)  # node → (addr, port, why)
    unreachable: Mapping[str, Sequence[tuple[str, str, str]]] = field(default_factory=dict)  # node → (peer, addr, why)
    model_missing: Sequence[str] = ()                                   # nodes whose cache lacks the model
    compile_cache_mounted: bool | None = None                           # None: read from the plan's volumes
    ticks: Mapping[str, Tick] = field(default_factory=dict)             # node → its last tick: what runs there
    placement: Any = None          # where placement put this launch beside what runs (Placement), or why it could not


def int_flag(argv: Sequence[str], *names: str, default: int = 1) -> int:
    v = flag_value(argv, *names)
    try:
        return int(v) if v is not None else default
    except ValueError:
        return default


def tp(argv: Sequence[str]) -> int:
    return int_flag(argv, "--tensor-parallel-size", "-tp")


def pp(argv: Sequence[str]) -> int:
    return int_flag(argv, "--pipeline-parallel-size", "-pp")


def servers(plan: Plan) -> list[tuple[str, tuple[str, ...]]]:
    return [(plan.service(k).node, argv) for k, argv in plan.server_args.items()]


def dedupe(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        k = (f.rule, f.node, f.message)
        if k not in seen:
            seen.add(k)
            out.append(f)
    return out
