"""The seconds each test module took in a full run of the test command, so its workers take the longest
work units first (tests/conftest.py): a long unit taken last kept one worker running alone for a minute
at the end of a run while the other three had finished (the machine idle or at half its cores).

Refreshed from a full run's JUnit report (a test's time there is its setup, call and teardown):

    ./scripts/test.sh --junitxml=/tmp/run.xml
    python -m harness.unit_times /tmp/run.xml        # rewrites tests/unit_times.json

A stale file only makes the order less good; a module it does not list is estimated from its tests.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

FILE = Path(__file__).resolve().parent.parent / "tests" / "unit_times.json"


def module_of(nodeid_or_classname: str) -> str:
    """`tests/test_x.py::t[p]` or JUnit's `tests.test_x.Class` -> `test_x`."""
    head = nodeid_or_classname.split("::", 1)[0]
    if head.endswith(".py"):
        return head.rsplit("/", 1)[-1].removesuffix(".py")
    parts = head.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "tests" else parts[0]


def from_junit(report: Path) -> dict[str, float]:
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        seconds[module_of(case.get("classname", ""))] += float(case.get("time") or 0)
    return {module: round(s, 1) for module, s in sorted(seconds.items()) if module}


def load(path: Path = FILE) -> dict[str, float]:
    """The recorded seconds per module; {} when the file is missing or unreadable (the order then falls back
    to the rule in tests/conftest.py)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.unit_times JUNIT_XML  (a full run's --junitxml report)", file=sys.stderr)
        return 2
    try:
        seconds = from_junit(Path(argv[0]))
    except (OSError, ET.ParseError) as exc:
        print(f"unit_times: cannot read {argv[0]}: {exc}", file=sys.stderr)
        return 1
    FILE.write_text(json.dumps(seconds, indent=1, sort_keys=True) + "\n")
    print(f"unit_times: {len(seconds)} modules, {sum(seconds.values()):.0f} s in all -> {FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
