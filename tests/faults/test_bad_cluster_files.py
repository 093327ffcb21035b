"""Thousands of malformed cluster files: each is accepted or refused with one line naming file and fix.

Never a traceback (any exception other than UserError fails), never a hang, never half-applied (parsing is a
pure function: a refused file returns nothing).
"""

from __future__ import annotations

import copy

import yaml
from hypothesis import given
from hypothesis import strategies as st

from sparkconsole.config import ClusterConfig, parse_cluster
from sparkconsole.errors import UserError
from sparkconsole.yamlsrc import load_text
from tests.faults.fuzz import fuzz

FILE = "fuzz-cluster.yaml"
BASE = {
    "nodes": [
        {"name": "spark1", "address": "192.168.100.10", "ssh": {"user": "ops", "port": 22}, "container": "vllm_node"},
        {"name": "spark2", "address": "192.168.100.11", "vllm_port": 8000},
    ],
    "endpoints": [{"name": "router", "url": "http://192.168.100.10:4000", "kind": "router"}],
    "thresholds": {"temp_margin_c": 5, "headroom_floor_gib": 8},
    "ssh": {"trust_on_first_use": False},
    "agent": {"interval_s": 0.5},
}

weird_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=300),
    st.sampled_from(["spark1.local", "", " ", "$(reboot)", "a;b", "`id`", "\n", "é" * 80, "::1", "0" * 5000,
                     "10.0.0.1\nrm -rf /", "ＳＰＡＲＫ", "\x00", "http://[::1", "1e309"]),
)
weird_values = st.recursive(weird_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)

paths = st.sampled_from([
    ("nodes",), ("nodes", 0), ("nodes", 0, "name"), ("nodes", 0, "address"), ("nodes", 0, "ssh"),
    ("nodes", 0, "ssh", "port"), ("nodes", 0, "ssh", "user"), ("nodes", 1, "role"), ("nodes", 1, "vllm_port"),
    ("nodes", 0, "container"), ("endpoints",), ("endpoints", 0, "url"), ("endpoints", 0, "kind"),
    ("thresholds",), ("thresholds", "temp_margin_c"), ("ssh", "trust_on_first_use"), ("agent", "interval_s"),
    ("agent",), ("extra",), ("nodes", 0, "local"),
])


def mutate(doc, path, value, delete):
    d = copy.deepcopy(doc)
    cur = d
    for key in path[:-1]:
        cur = cur[key]
    if delete:
        cur.pop(path[-1], None) if isinstance(cur, dict) else cur.pop(path[-1])
    else:
        cur[path[-1]] = value
    return d


def check(text: str) -> None:
    try:
        result = parse_cluster(load_text(text, FILE))
    except UserError as err:
        msg = str(err)
        assert "\n" not in msg and "\r" not in msg
        assert msg.startswith(FILE), msg
        assert "fix:" in msg, msg
        assert len(msg) < 600, msg
        return
    assert isinstance(result, ClusterConfig)
    for n in result.nodes:  # whatever was accepted is sane
        assert not n.address.lower().endswith(".local")
        assert 1 <= n.ssh.port <= 65535 and 1 <= n.vllm_port <= 65535


@fuzz(1500)
@given(paths, weird_values, st.booleans())
def test_mutated_documents(path, value, delete):
    doc = mutate(BASE, path, value, delete)
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return
    check(text)


@fuzz(1000)
@given(st.text(max_size=400))
def test_arbitrary_text(text):
    check(text)


@fuzz(300)
@given(st.integers(min_value=1, max_value=12), st.integers(min_value=2, max_value=12))
def test_anchor_bombs_refused(depth, width):
    lines = ["l0: &l0 [x]"]
    for i in range(1, depth + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    lines.append(f"nodes: *l{depth}")
    check("\n".join(lines) + "\n")


def test_huge_document_refused_without_parsing():
    check("nodes:\n" + "  - {name: a, address: 10.0.0.1}\n" * 60000)
