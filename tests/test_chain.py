"""The host-side pipeline chain (backend/chain): order, the first failure's reason, resume, SIGTERM.

The stages here are small programs that keep the run-directory contract exactly as the real stage
programs do (backend/contract/runs.py, backend/contract/events.py); the whole chain over the real stages runs in the
pipeline's end-to-end test.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.chain.plan import PlanError, parse_plan
from backend.contract.lookup import completed_run

REPO = Path(__file__).resolve().parent.parent
STAGE_PROGRAM = """
import os, signal, sys, time
from backend.contract.events import EventLog
from backend.contract.runs import Manifest, open_run_dir
stage, run_id, work = sys.argv[1:4]
rd = open_run_dir(work, run_id, Manifest(stage=stage, run_id=run_id, identity={"stage": stage}))
log = EventLog(rd.events_path, stage, run_id)
log.emit("start", total=1)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
behaviour = os.environ.get("E3_" + stage.upper(), "ok")
if os.environ.get("E3_SERVERS"):  # what the stage found: the baseline held down by the chain, or serving
    with open(os.path.join(work, "seen.txt"), "a") as f:
        up = os.path.exists(os.path.join(os.environ["E3_SERVERS"], "baseline"))
        f.write(f"{stage} held={os.environ.get('E3_BASELINE_HELD')} baseline={'up' if up else 'down'}\\n")
if behaviour == "sleep":
    while not stop:
        time.sleep(0.05)
    rd.write_summary({"status": "stopped"})
    log.emit("finish", status="stopped", summary={"status": "stopped"})
    sys.exit(0)
if behaviour == "fail":
    rd.write_summary({"status": "failed", "error": stage + " could not go on: disk full"})
    log.emit("finish", status="failed", summary={"status": "failed", "error": stage + " could not go on: disk full"})
    sys.exit(1)
with open(os.path.join(work, "order.txt"), "a") as f:
    f.write(stage + "\\n")
summary = {"status": "completed", "outputs": {stage + "_out": rd.path}}
rd.write_summary(summary)
log.emit("finish", status="completed", summary=summary)
"""


def plan(tmp_path: Path, stages=("prepare", "extract", "train")) -> Path:
    prog = tmp_path / "stage.py"
    prog.write_text(STAGE_PROGRAM)
    work = tmp_path / "work"
    entries = [{"stage": s, "run_id": f"night-{s}", "argv": [sys.executable, str(prog), s, f"night-{s}", str(work)],
                "env": {"PYTHONPATH": str(REPO)}} for s in stages]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"stages": entries}))
    return path


def chain(tmp_path: Path, plan_path: Path, env: dict | None = None, run_id: str = "night", **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "backend.chain", "--work-dir", str(tmp_path / "work"),
                             "--run-id", run_id, "--plan", str(plan_path)], cwd=REPO,
                            env={**os.environ, **(env or {})}, stderr=subprocess.PIPE, text=True, **kw)


def events(tmp_path: Path) -> list[dict]:
    return [json.loads(l) for l in (tmp_path / "work" / "runs" / "night" / "events.jsonl").read_text().splitlines()]


def test_stages_run_in_order_and_the_last_outputs_are_the_chains(tmp_path):
    proc = chain(tmp_path, plan(tmp_path))
    assert proc.wait(60) == 0, proc.stderr.read()
    assert (tmp_path / "work" / "order.txt").read_text().split() == ["prepare", "extract", "train"]
    run = completed_run(str(tmp_path / "work"), "night", "pipeline")
    assert run.outputs == {"train_out": str(tmp_path / "work" / "runs" / "night-train")}
    progress = [(e["current"], e["done"]) for e in events(tmp_path) if e["kind"] == "progress"]
    assert progress == [("prepare", 0), ("prepare", 1), ("extract", 1), ("extract", 2), ("train", 2), ("train", 3)]


def test_stops_at_the_first_failure_with_its_reason_and_resumes_there(tmp_path):
    path = plan(tmp_path)
    proc = chain(tmp_path, path, {"E3_EXTRACT": "fail"})
    assert proc.wait(60) == 1
    assert "extract run night-extract failed: extract could not go on: disk full" in proc.stderr.read()
    finish = events(tmp_path)[-1]
    assert finish["status"] == "failed" and finish["summary"]["failed_stage"] == "extract"
    assert (tmp_path / "work" / "order.txt").read_text().split() == ["prepare"]  # train never started
    again = chain(tmp_path, path)  # the same run id: prepare is not run again, extract resumes
    assert again.wait(60) == 0, again.stderr.read()
    assert (tmp_path / "work" / "order.txt").read_text().split() == ["prepare", "extract", "train"]
    assert [s.get("skipped", False) for s in events(tmp_path)[-1]["summary"]["stages"]] == [True, False, False]


def test_sigterm_stops_the_running_stage_cleanly(tmp_path):
    path = plan(tmp_path)
    proc = chain(tmp_path, path, {"E3_EXTRACT": "sleep"})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(e.get("current") == "extract" for e in
                                                  (events(tmp_path) if (tmp_path / "work/runs/night/events.jsonl").exists() else [])):
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert events(tmp_path)[-1]["status"] == "stopped"
    assert json.loads((tmp_path / "work/runs/night-extract/summary.json").read_text())["status"] == "stopped"
    assert chain(tmp_path, path).wait(60) == 0  # and the same id goes on from there


def test_a_stop_that_lands_while_a_stage_is_being_started_reaches_it(tmp_path):
    """The chain says which stage is next, then starts it: a SIGTERM in between found no child to forward
    to, and the chain waited for the stage to end by itself (seen as a 120 s stop on a loaded machine)."""
    from backend.chain.plan import PlannedStage
    from backend.chain.runner import Chain

    (tmp_path / "work").mkdir()
    nap = PlannedStage("generate", "c-generate", (sys.executable, "-c", "import time; time.sleep(120)"))
    c = Chain(str(tmp_path / "work"), "c", [nap])
    c.child.forward("SIGTERM")  # before the child exists
    c.ctx = type("Ctx", (), {"emit": staticmethod(lambda *a, **k: None)})()  # the events are not the point
    started = time.monotonic()
    outcome = c._run_stage(nap, 0)
    assert time.monotonic() - started < 30, outcome
    assert outcome["exit"] == -signal.SIGTERM  # the stage got the stop (this one has no handler: it dies)


@pytest.mark.parametrize("data, message", [
    ({}, "non-empty list `stages`"),
    ({"stages": [{"stage": "nap", "run_id": "a", "argv": ["x"]}]}, "stages[0].stage: expected one of"),
    ({"stages": [{"stage": "train", "run_id": "a\n", "argv": ["x"]}]}, "stages[0].run_id"),
    ({"stages": [{"stage": "train", "run_id": "a", "argv": []}]}, "stages[0].argv"),
    ({"stages": [{"stage": "train", "run_id": "a", "argv": ["x"]}, {"stage": "prepare", "run_id": "b", "argv": ["x"]}]},
     "out of pipeline order"),
])
def test_bad_plans_are_named(data, message):
    with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_plan(data)


# ---- the baseline held down across the GPU stages, and one switching program at a time ----------------------
def held_plan(tmp_path: Path, stages=("prepare", "extract", "train", "verify"), hold=("extract", "verify")) -> Path:
    path = plan(tmp_path, stages)
    data = json.loads(path.read_text())
    servers = tmp_path / "servers"
    servers.mkdir(exist_ok=True)
    (servers / "baseline").touch()
    log = tmp_path / "commands.log"

    def cmd(what: str) -> list[str]:
        body = {"start": 'touch "$1"', "stop": 'rm -f "$1"', "alive": '[ -e "$1" ]'}[what]
        return ["sh", "-c", f'[ "$2" = alive ] || echo "$2" >> "$3"; {body}', "sh", str(servers / "baseline"), what,
                str(log)]

    def server(name: str) -> dict:
        return {"name": name, "unit": name, "start": cmd("start"), "stop": cmd("stop"), "alive": cmd("alive")}

    data["hold"] = {"from": hold[0], "to": hold[1], "switch": {
        "version": 1, "home": server("baseline"), "away": [{**server("extractor"), "start": ["false"]}],
        "endpoint": "http://127.0.0.1:9", "ready_timeout_s": 5, "command_timeout_s": 10, "stop_check_s": 5,
        "lock_path": str(tmp_path / "work" / "state" / "servers.lock")}}
    path.write_text(json.dumps(data))
    return path


def test_the_baseline_stays_down_from_extract_through_verify_one_stop_one_start(tmp_path):
    proc = chain(tmp_path, held_plan(tmp_path), {"E3_SERVERS": str(tmp_path / "servers")})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert (tmp_path / "commands.log").read_text().split() == ["stop", "start"]
    assert (tmp_path / "work" / "seen.txt").read_text().splitlines() == [
        "prepare held=None baseline=up", "extract held=1 baseline=down", "train held=1 baseline=down",
        "verify held=1 baseline=down"]
    assert (tmp_path / "servers" / "baseline").exists()
    evs = events(tmp_path)
    phases = [e.get("phase") for e in evs if e["kind"] == "progress" and e.get("baseline")]
    assert phases == ["baseline_down", "baseline_up"]  # when it went down and came back, in the run's events
    summary = json.loads((tmp_path / "work" / "runs" / "night" / "summary.json").read_text())
    assert summary["baseline"]["held"] == ["extract", "verify"] and summary["baseline"]["baseline_restarted"] is True


def test_a_failure_inside_the_hold_still_starts_the_baseline_once(tmp_path):
    proc = chain(tmp_path, held_plan(tmp_path), {"E3_SERVERS": str(tmp_path / "servers"), "E3_TRAIN": "fail"})
    proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert (tmp_path / "commands.log").read_text().split() == ["stop", "start"]
    assert (tmp_path / "servers" / "baseline").exists()


def test_two_pipelines_at_once_the_second_is_refused_naming_the_first(tmp_path):
    path = held_plan(tmp_path)
    first = chain(tmp_path, path, {"E3_SERVERS": str(tmp_path / "servers"), "E3_TRAIN": "sleep"})
    deadline = time.monotonic() + 60
    seen = tmp_path / "work" / "seen.txt"
    while time.monotonic() < deadline and not (seen.exists() and "train" in seen.read_text()):
        time.sleep(0.1)
    second = chain(tmp_path, path, {"E3_SERVERS": str(tmp_path / "servers")}, run_id="day")
    _, err = second.communicate(timeout=60)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert second.returncode == 1
    summary = json.loads((tmp_path / "work" / "runs" / "day" / "summary.json").read_text())
    assert "refused: the servers are being switched by pipeline run night (pid" in summary["error"], summary
    assert summary["done"] == 0  # it ran nothing
    # the first one's hold: one stop, one start, after its SIGTERM
    assert (tmp_path / "commands.log").read_text().split() == ["stop", "start"]


def _summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "work" / "runs" / "night" / "summary.json").read_text())


def test_a_host_lacking_speculators_fails_before_generate_starts(tmp_path):
    # the prepare stage's python is a bare venv: no speculators (nor anything else beyond the stdlib)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = str(tmp_path / "bare" / "bin" / "python")
    path = plan(tmp_path, ("generate", "prepare"))
    data = json.loads(path.read_text())
    data["stages"][1]["argv"][0] = bare
    path.write_text(json.dumps(data))
    started = time.monotonic()
    proc = chain(tmp_path, path)
    assert proc.wait(60) == 1
    assert time.monotonic() - started < 30  # seconds, not a generation run
    err = proc.stderr.read()
    assert "prepare" in err and "lacks speculators" in err and f"{bare} -m pip install" in err
    assert not (tmp_path / "work" / "order.txt").exists()  # generate never ran
    assert not (tmp_path / "work" / "runs" / "night-generate").exists()
    summary = _summary(tmp_path)
    assert summary["status"] == "failed" and summary["failed_stage"] == "prepare"
    assert "host requirements" in summary["error"] and "speculators" in summary["error"]
    # no stage progress: the fatal error (the lifecycle says every failure so) and the finish
    assert [e["kind"] for e in events(tmp_path)] == ["start", "error", "finish"]


def test_a_missing_verifier_is_named_before_the_first_stage(tmp_path):
    path = plan(tmp_path, ("prepare", "extract"))
    data = json.loads(path.read_text())
    data["stages"][1]["argv"] += ["--verifier", str(tmp_path / "no-such-model")]
    path.write_text(json.dumps(data))
    proc = chain(tmp_path, path)
    assert proc.wait(60) == 1
    summary = _summary(tmp_path)
    assert summary["failed_stage"] == "extract"
    assert f"verifier {tmp_path / 'no-such-model'} does not exist on this host" in summary["error"]
    assert not (tmp_path / "work" / "order.txt").exists()


def test_a_stage_python_that_does_not_run_is_named(tmp_path):
    from backend.chain.plan import PlannedStage
    from backend.chain.requirements import check_plan
    missing = PlannedStage("prepare", "night-prepare", (str(tmp_path / "gone" / "python"), "-m", "backend.prepare"))
    problems = check_plan(str(tmp_path), [missing])
    assert [p.what for p in problems] == ["python_modules"] and "did not answer" in problems[0].detail
