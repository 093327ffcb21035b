"""The fault suite's ledger: counts what docs/RELIABILITY.md reports, from the run itself.

- faults tried / survived: tests marked `@pytest.mark.fault("what broke")`; tried when the test ran (not skipped),
  survived when it passed.
- bad inputs tried: every example hypothesis ran through a test in tests/faults (counted by wrapping the inner
  test, so the lead's cluster-file fuzz counts too), plus inputs a test reports with `ledger.bad_inputs(n)`.
- data lost: what a test measured as lost (`ledger.lost(n)`: results levels, audit lines, ticks the store had).
- tracebacks shown: "Traceback (most recent call last)" in any output a test hands to `ledger.output(text)`
  (CLI stdout/stderr, TUI screens), every log record with exception info from the `sparkconsole` loggers, and
  every test here that failed with an exception other than an assertion (product code let something escape).
- listeners: per listener fuzzed (tests/faults/test_listener_fuzz.py), the requests sent, the routes of its router
  reached past the login out of all of them, the 5xx answers, the tracebacks logged and the secrets found.

At the end of the session the figures are printed and written as JSON to $SPARKCONSOLE_FAULT_FIGURES (when set);
benchmarks/faults.py runs the suite that way and prints the table.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path

import pytest

TRACEBACK = "Traceback (most recent call last)"


class Ledger:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.faults: dict[str, str] = {}          # nodeid -> outcome
        self.fault_names: dict[str, str] = {}
        self.lost_where: list[str] = []
        self.tracebacks_where: list[str] = []
        self.listeners: dict[str, dict[str, int]] = {}

    def bad_inputs(self, n: int = 1) -> None:
        self.counts["bad_inputs"] += n

    def lost(self, n: int, what: str) -> None:
        if n:
            self.counts["data_lost"] += n
            self.lost_where.append(f"{n} {what}")

    def output(self, text: str | bytes, where: str = "") -> None:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        n = text.count(TRACEBACK)
        if n:
            self.counts["tracebacks"] += n
            self.tracebacks_where.append(where or text[text.index(TRACEBACK):][:300])

    def figures(self) -> dict:
        tried = [k for k, v in self.faults.items() if v != "skipped"]
        return {
            "faults_tried": len(tried),
            "faults_survived": sum(1 for k in tried if self.faults[k] == "passed"),
            "data_lost": self.counts["data_lost"],
            "bad_inputs_tried": self.counts["bad_inputs"],
            "tracebacks_shown": self.counts["tracebacks"],
            "faults": {self.fault_names[k]: v for k, v in self.faults.items()},
            "lost_where": self.lost_where,
            "tracebacks_where": self.tracebacks_where,
            "listeners": self.listeners,
        }


LEDGER = Ledger()


class _ExcInfoCounter(logging.Handler):
    """A sparkconsole logger printing a traceback is a traceback shown to the operator."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            LEDGER.output(TRACEBACK + f" (log {record.name}: {record.getMessage()[:120]})",
                          f"log {record.name}: {record.getMessage()[:200]}")


@pytest.fixture
def ledger() -> Ledger:
    return LEDGER


@pytest.fixture(autouse=True)
def _count_logged_tracebacks():
    handler = _ExcInfoCounter(level=logging.ERROR)
    lg = logging.getLogger("sparkconsole")
    lg.addHandler(handler)
    try:
        yield
    finally:
        lg.removeHandler(handler)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fault(what): a fault injected on the real test bed; counted in the figures")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here not in Path(str(item.fspath)).parents:
            continue
        hyp = getattr(getattr(item, "obj", None), "hypothesis", None)
        if hyp is not None and not getattr(hyp.inner_test, "_counted", False):
            inner = hyp.inner_test

            def counted(*a, __inner=inner, **kw):
                LEDGER.bad_inputs(1)
                return __inner(*a, **kw)
            counted._counted = True
            hyp.inner_test = counted


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    rep = outcome.get_result()
    here = Path(__file__).parent
    if rep.when == "call" and rep.failed and call.excinfo is not None and here in Path(str(item.fspath)).parents \
            and not call.excinfo.errisinstance((AssertionError, pytest.fail.Exception)):
        # Product code raised something other than a UserError through a test: an operator would see a traceback.
        LEDGER.output(TRACEBACK, f"{item.nodeid}: {call.excinfo.typename}: {str(call.excinfo.value)[:160]}")
    mark = item.get_closest_marker("fault")
    if mark is None:
        return
    name = mark.args[0] if mark.args else item.name
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        name += f" [{callspec.id}]"
    if rep.when == "setup" and rep.skipped:
        LEDGER.faults[item.nodeid] = "skipped"
    elif rep.when == "call":
        if hasattr(rep, "wasxfail"):        # a known open bug: tried, not survived
            LEDGER.faults[item.nodeid] = "failed (known bug, xfail)" if rep.skipped else "passed"
        else:
            LEDGER.faults[item.nodeid] = "skipped" if rep.skipped else ("passed" if rep.passed else "failed")
    elif rep.when == "teardown" and rep.failed or rep.when == "setup" and rep.failed:
        LEDGER.faults[item.nodeid] = "failed"
    LEDGER.fault_names[item.nodeid] = name


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    f = LEDGER.figures()
    if not (f["faults"] or f["bad_inputs_tried"] or f["tracebacks_shown"] or f["listeners"]):
        return
    tr = terminalreporter
    tr.section("fault suite figures")
    tr.line(f"faults tried {f['faults_tried']}, survived {f['faults_survived']}, data lost {f['data_lost']}, "
            f"bad inputs tried {f['bad_inputs_tried']}, tracebacks shown {f['tracebacks_shown']}")
    for what, outcome in f["faults"].items():
        if outcome != "passed":
            tr.line(f"  {outcome}: {what}")
    for name, fig in f["listeners"].items():
        tr.line(f"  listener {name}: {fig['requests']} requests, routes covered {fig['routes covered']} of "
                f"{fig['routes']}, 5xx {fig['5xx']}, tracebacks {fig['tracebacks']}, secrets found {fig['secrets']}")
    out = os.environ.get("SPARKCONSOLE_FAULT_FIGURES")
    if out:
        Path(out).write_text(json.dumps(f, indent=1) + "\n")
