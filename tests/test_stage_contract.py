"""The stage contract, one test over every host program (backend/kit/lifecycle.py, backend/contract/exitcodes.py):

- SIGTERM mid-body: exit 0, a summary.json and a finish event that say "stopped"; a program that switched
  servers has the baseline back (the stand-in baseline answers again);
- a failure: exit 1, with a summary.json and a finish event that say "failed" and why;
- bad input: exit 2, one line on stderr, nothing created in the work dir (and no server touched).

The programs run as the console starts them (subprocesses, `python -m backend.<program>`), on real inputs;
the cases (harness/stage_cases.py) say how each is started in each scenario.
"""
from __future__ import annotations

import json
import signal
import time

import pytest

from harness.stage_cases import PROGRAMS, Kit, events, finish_of, make_case, start, tree

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    return Kit(tmp_path_factory)


@pytest.mark.parametrize("program", PROGRAMS)
def test_sigterm_mid_body_stops_with_a_summary_and_the_baseline_back(program, tmp_path, kit, request):
    case = make_case(program, "stop", tmp_path, kit, request)
    proc = start(case)
    try:
        deadline = time.monotonic() + 240
        while not case.ready(events(case.run)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"{program} never got mid-body: {events(case.run)}"
            time.sleep(0.1)
        if case.baseline is not None and program != "benchpair":
            assert not case.baseline.answers()  # swapped: the baseline is down while the stage waits
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    finish = finish_of(case)
    summary = json.loads((case.run / "summary.json").read_text())
    assert finish["status"] == "stopped" and summary["status"] == "stopped", (finish, summary)
    assert finish["summary"]["status"] == "stopped"
    assert any(e["kind"] == "error" and "SIGTERM" in e.get("message", "") for e in events(case.run))
    if case.baseline is not None:
        assert case.baseline.answers(), f"{program}: the baseline is not back after the stop"


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_failure_exits_1_with_a_summary_that_says_why(program, tmp_path, kit, request):
    case = make_case(program, "fail", tmp_path, kit, request)
    proc = start(case)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    finish = finish_of(case)
    summary = json.loads((case.run / "summary.json").read_text())
    assert finish["status"] == "failed" and summary["status"] == "failed"
    assert isinstance(summary.get("error"), str) and summary["error"], summary
    assert summary["error"].split(";")[0][:40] in err  # said on stderr too
    if case.baseline is not None:
        assert case.baseline.answers(), f"{program}: the baseline is not back after the failure"


@pytest.mark.parametrize("program", PROGRAMS)
def test_bad_input_exits_2_and_creates_nothing(program, tmp_path, kit, request):
    case = make_case(program, "bad", tmp_path, kit, request)
    before = tree(case.work)
    proc = start(case)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-2000:] + err[-3000:]
    assert err.strip(), "a refusal says why on stderr"
    assert tree(case.work) == before and not case.run.exists()
    if case.baseline is not None:
        assert case.baseline.answers()  # never touched
