"""`overrides:` in a recipe_version "2" recipe: values that apply only to launches a `when:` selects.

    overrides:
      - when: {nodes: 1}
        defaults: {max_num_seqs: 1, max_model_len: 65536}
      - when: {tp: {gte: 4}, runtime: vllm}
        env: {NCCL_DEBUG: INFO}

Read as sparkrun reads them: the selectors of one `when` must all match; a value is a scalar (equal), a list
(any of) or a mapping of operators (eq ne in not_in gt gte lt lte); matching entries apply in order, the later
one winning; `config:` reads the recipe's values before any override applies. Unlike sparkrun, which skips an
entry whose selector it does not know, a selector or operator that neither knows is refused when the recipe is
read (one line naming file, field and fix): a typo would otherwise silently tune the wrong launch. The hardware
selectors answer for a DGX Spark (GB10): nvidia, sm_121, 128 GB.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..yamlsrc import Path_
from .fields import Fields
from .model import Override, Recipe

LAYERS = ("defaults", "env", "container")
# sparkrun's parallelism short names and its node shape; runtime; the hardware; the recipe's own values.
SHAPE = {"tp": "tensor_parallel", "pp": "pipeline_parallel", "dp": "data_parallel", "ep": "expert_parallel",
         "dcp": "decode_context_parallel"}
SELECTORS = frozenset({*SHAPE, "nodes", "gpus_per_node", "runtime", "runtime_family", "platform", "vendor",
                       "accelerator", "arch", "capability", "memory_gb", "config"})
OPERATORS = frozenset({"eq", "ne", "in", "not_in", "gt", "gte", "lt", "lte"})
ORDERED = frozenset({"gt", "gte", "lt", "lte"})
# What identifies the launch, or what `when` reads: an override may not set it.
FORBIDDEN = frozenset({"port", "served_model_name", *SHAPE.values()})
# A DGX Spark, as the hardware selectors see it.
GB10 = {"platform": "dgx-spark", "vendor": "nvidia", "accelerator": "gb10", "arch": "sm_121",
        "capability": frozenset({"fp4", "fp8", "bf16"}), "memory_gb": 128}


def read_overrides(r: Fields, data: Mapping[str, Any]) -> tuple[Override, ...]:
    raw = data.get("overrides")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise r.err(("overrides",), "overrides must be a list of {when: …, defaults: …} entries",
                    "write overrides: [{when: {nodes: 1}, defaults: {max_num_seqs: 1}}]")
    return tuple(_entry(r, i, e) for i, e in enumerate(raw))


def _entry(r: Fields, i: int, e: Any) -> Override:
    p: Path_ = ("overrides", i)
    if not isinstance(e, dict):
        raise r.err(p, "an override must be a mapping", "write {when: {nodes: 1}, defaults: {…}}")
    when = e.get("when")
    if not isinstance(when, dict) or not when:
        raise r.err(p + ("when",), "an override needs a non-empty when:",
                    "write when: {nodes: 1} (use defaults: for values that always apply)")
    for sel, value in when.items():
        if sel not in SELECTORS:
            raise r.err(p + ("when", sel), f"unknown selector {str(sel)[:30]!r}",
                        f"use one of: {', '.join(sorted(SELECTORS))}")
        if sel == "config":
            if not isinstance(value, dict) or not value:
                raise r.err(p + ("when", sel), "when.config must map recipe values to what they must be",
                            "write when: {config: {max_model_len: {gte: 65536}}}")
            for k, pred in value.items():
                _check_operators(r, p + ("when", sel, k), pred, sel)
        else:
            _check_operators(r, p + ("when", sel), value, sel)
    layers = set(e) - {"when"}
    unknown = sorted(layers - set(LAYERS))
    if unknown:
        raise r.err(p + (unknown[0],), f"an override cannot set {unknown[0]!r}", f"set one of: {', '.join(LAYERS)}")
    if not layers:
        raise r.err(p, "this override sets nothing", "add defaults:, env: or container:")
    defaults = r.mapping(e, p, "defaults", "write defaults: {name: value}")
    bad = sorted(set(defaults) & FORBIDDEN)
    if bad:
        raise r.err(p + ("defaults", bad[0]), f"an override cannot set {bad[0]} (it identifies the launch, or when: "
                    "reads it)", "set it under the recipe's own defaults")
    env = r.mapping(e, p, "env", "write env: {NAME: value}")
    container = r.get(e, p, "container", str, None, "write the image reference")
    return Override(index=i, when=dict(when), defaults=dict(defaults),
                    env={str(k): "" if v is None else str(v) for k, v in env.items()}, container=container,
                    line=r.doc.line(p))


def _check_operators(r: Fields, path: Path_, value: Any, selector: str) -> None:
    if not isinstance(value, dict):
        return
    for op in value:
        if op not in OPERATORS:
            raise r.err(path + (op,), f"unknown operator {str(op)[:20]!r}", f"use one of: {', '.join(sorted(OPERATORS))}")
        if op in ORDERED and selector in ("runtime", "runtime_family", "platform", "vendor", "accelerator", "arch",
                                          "capability"):
            raise r.err(path + (op,), f"{op} needs a numeric selector, {selector} is a name", "use eq, ne, in or not_in")


@dataclass(frozen=True)
class LaunchFacts:
    """What a `when:` may read about one launch."""
    nodes: int
    runtime: str
    shape: Mapping[str, int] = field(default_factory=dict)        # tp, pp, dp, …
    config: Mapping[str, Any] = field(default_factory=dict)       # the recipe's values before any override
    hardware: Mapping[str, Any] = field(default_factory=lambda: dict(GB10))


def _norm(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return float(v)
    text = str(v).strip()
    try:
        return float(text)
    except ValueError:
        return text.lower()


def _holds(op: str, operand: Any, actual: Any, absent_is_value: bool) -> bool:
    if actual is None:
        return absent_is_value and op in ("ne", "not_in")
    if isinstance(actual, (set, frozenset)):
        have = {_norm(a) for a in actual}
        want = {_norm(w) for w in (operand if isinstance(operand, list) else [operand])}
        return bool(have & want) if op in ("eq", "in") else (not have & want) if op in ("ne", "not_in") else False
    a = _norm(actual)
    if op in ("eq", "ne", "in", "not_in"):
        cands = operand if op in ("in", "not_in") and isinstance(operand, list) else [operand]
        hit = any(isinstance(a, bool) == isinstance(c, bool) and a == _norm(c) for c in cands)
        return hit if op in ("eq", "in") else not hit
    b = _norm(operand)
    if not isinstance(a, float) or not isinstance(b, float) or math.isnan(a) or math.isnan(b):
        return False
    return {"gt": a > b, "gte": a >= b, "lt": a < b, "lte": a <= b}[op]


def _predicates(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, list):
        return [("in", value)]
    return [("eq", value)]


def matches(o: Override, facts: LaunchFacts) -> tuple[bool, str]:
    """(whether every selector matches, why not)."""
    failed: list[str] = []
    for sel, value in o.when.items():
        if sel == "config":
            for k, pred in value.items():
                have = facts.config.get(str(k))
                if not all(_holds(op, x, have, True) for op, x in _predicates(pred)):
                    failed.append(f"config.{k}={have}")
            continue
        actual: Any
        if sel in SHAPE:
            actual = facts.shape.get(sel, 1)
        elif sel == "nodes":
            actual = facts.nodes
        elif sel == "gpus_per_node":
            actual = 1
        elif sel in ("runtime", "runtime_family"):
            actual = facts.runtime
        else:
            actual = facts.hardware.get(sel)
        if not all(_holds(op, x, actual, False) for op, x in _predicates(value)):
            failed.append(f"{sel}={actual}")
    return (not failed), ", ".join(failed)


def for_launch(recipe: Recipe, facts: LaunchFacts) -> tuple[Recipe, list[str]]:
    """The recipe as this launch runs it (its matching overrides applied) and one line per override saying whether
    it applied and why."""
    if not recipe.overrides:
        return recipe, []
    defaults, env, container = dict(recipe.defaults), dict(recipe.env), recipe.container
    lines = []
    for o in recipe.overrides:
        ok, why = matches(o, facts)
        if ok:
            defaults.update(o.defaults)
            env.update(o.env)
            container = o.container or container
        lines.append(f"overrides[{o.index}]: {'applied' if ok else 'skipped'} "
                     f"({', '.join(f'{k}: {v}' for k, v in o.when.items()) if ok else why + ' did not match'})")
    return replace(recipe, defaults=defaults, env=env, container=container), lines
