"""Where a suite run's wall time went, from SPARKCONSOLE_TEST_TIMELINE's file (tests/parallel.py):

    python -m tests.timeline FILE

Per worker: busy seconds, seconds waiting for a heavy slot or the alone lock, idle seconds; per group: its
tests' seconds, span (first start to last end) and CPU, longest first; the tests that took the most CPU; then
each test that failed, and when."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(path: str) -> None:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    t0 = min(r["start"] - r["waited"] for r in rows)
    t1 = max(r["end"] for r in rows)
    print(f"{len(rows)} tests over {t1 - t0:.0f} s")
    workers: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        workers[r["worker"]].append(r)
    for w, rs in sorted(workers.items()):
        busy = sum(r["end"] - r["start"] for r in rs)
        waited = sum(r["waited"] for r in rs)
        print(f"{w}: {len(rs)} tests, busy {busy:.0f} s, waiting for locks {waited:.0f} s, "
              f"idle {t1 - t0 - busy - waited:.0f} s, last end at +{max(r['end'] for r in rs) - t0:.0f} s")
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["group"] or "(none)"].append(r)
    print("group: tests' seconds / span (first start, last end) / CPU seconds of the workers and their children")
    for g, rs in sorted(groups.items(), key=lambda kv: -sum(r["end"] - r["start"] for r in kv[1])):
        first, last = min(r["start"] for r in rs) - t0, max(r["end"] for r in rs) - t0
        print(f"  {g}: {sum(r['end'] - r['start'] for r in rs):.0f} s / +{first:.0f} to +{last:.0f} s"
              f" / {sum(r.get('cpu', 0) for r in rs):.0f} CPU s")
    print("most CPU (the worker and its children):")
    for r in sorted(rows, key=lambda r: -r.get("cpu", 0))[:15]:
        print(f"  {r.get('cpu', 0):6.1f} CPU s {r['end'] - r['start']:6.1f} s  {r['test']}")
    for r in rows:
        if r.get("outcome", "passed") not in ("passed", "skipped", "skipped in setup"):
            print(f"{r['outcome']}: {r['test']} ({r['worker']}, +{r['start'] - t0:.0f} to +{r['end'] - t0:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1])
