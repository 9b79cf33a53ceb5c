"""harness/unit_times.py: the recorded seconds per test module that order the workers' units longest first."""
from __future__ import annotations

import json

from harness import unit_times


def test_a_module_is_named_the_same_from_a_node_id_and_from_junit():
    assert unit_times.module_of("tests/test_app_live.py::test_x[a::b]") == "test_app_live"
    assert unit_times.module_of("tests.test_app_live") == "test_app_live"
    assert unit_times.module_of("tests.test_app_live.TestKeys") == "test_app_live"


def test_a_junit_report_gives_each_modules_total(tmp_path):
    report = tmp_path / "run.xml"
    report.write_text("""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.test_a" name="one" time="1.25"/>
<testcase classname="tests.test_a.TestB" name="two" time="2.5"/>
<testcase classname="tests.test_b" name="three" time="0.04"><skipped/></testcase>
</testsuite></testsuites>""")
    assert unit_times.from_junit(report) == {"test_a": 3.8, "test_b": 0.0}


def test_the_refresh_writes_the_file_the_order_reads(tmp_path, monkeypatch, capsys):
    report = tmp_path / "run.xml"
    report.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="t" time="7"/>'
                      '</testsuite></testsuites>')
    monkeypatch.setattr(unit_times, "FILE", tmp_path / "unit_times.json")
    assert unit_times.main([str(report)]) == 0
    assert unit_times.load(tmp_path / "unit_times.json") == {"test_a": 7.0}
    assert "1 modules" in capsys.readouterr().out
    assert unit_times.main([str(tmp_path / "absent.xml")]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert unit_times.main([]) == 2


def test_a_missing_or_odd_file_orders_by_the_rule_instead(tmp_path):
    assert unit_times.load(tmp_path / "absent.json") == {}
    odd = tmp_path / "odd.json"
    odd.write_text("[1, 2]")
    assert unit_times.load(odd) == {}
    odd.write_text(json.dumps({"test_a": 3, "test_b": "slow", "test_c": True}))
    assert unit_times.load(odd) == {"test_a": 3.0}


def test_the_committed_record_names_the_longest_units():
    recorded = unit_times.load()
    assert recorded, f"{unit_times.FILE} is missing: python -m harness.unit_times REPORT"
    longest = sorted(recorded, key=recorded.get, reverse=True)[:5]
    assert "test_engine_pipeline" in longest or "test_engine_conformance" in longest, longest
