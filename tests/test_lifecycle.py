"""The stage lifecycle (backend/kit/lifecycle.py) with a toy stage that writes only its body: the run directory,
events, signals, summary, finish and exit code come from the lifecycle. Also a full disk (a real, tiny
tmpfs): every program ends with a finish, the toy's naming the full volume."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from backend.contract import exitcodes
from harness.rig.tmpfs import small_tmpfs

REPO = Path(__file__).resolve().parent.parent

TOY = textwrap.dedent('''
    """A toy stage: its body and nothing else."""
    import os, sys, time
    from backend.contract.runs import Manifest
    from backend.kit.lifecycle import StageFailed, StageRun

    def body(ctx):
        ctx.start(total=3)
        how = os.environ.get("TOY_HOW") or sys.argv[3]  # the same run (identity), another behaviour
        try:
            for i in range(3):
                ctx.emit("progress", done=i, total=3)
                if how == "fail":
                    raise StageFailed("the toy cannot go on: no widgets")
                if how == "crash":
                    {}["missing"]
                if how == "full":
                    with open(os.path.join(ctx.path, "blob"), "wb") as f:
                        while True:
                            f.write(b"x" * 65536)
                            f.flush()
                            os.fsync(f.fileno())
                if how == "sleep":
                    time.sleep(60)
        finally:
            with open(os.path.join(sys.argv[1], "finally-ran"), "w") as f:
                f.write("yes")

    ctx = StageRun("toy", sys.argv[2], work_dir=sys.argv[1],
                   manifest=Manifest(stage="toy", run_id=sys.argv[2], identity={"how": sys.argv[3]}),
                   fresh=bool(os.environ.get("TOY_FRESH")))
    ctx.summarize = lambda status, error: {"widgets": 3, "how": sys.argv[3]}
    sys.exit(ctx.run(body))
''')


def toy(tmp_path: Path, work: Path, run_id: str, how: str, **env: str) -> subprocess.Popen:
    script = tmp_path / "toy.py"
    script.write_text(TOY)
    return subprocess.Popen([sys.executable, str(script), str(work), run_id, how], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO), **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


def test_the_exit_code_table():
    assert exitcodes.for_status("completed") == 0 and exitcodes.for_status("stopped") == 0
    assert exitcodes.for_status("failed") == 1 and exitcodes.for_status("nonsense") == 1
    assert exitcodes.for_status("completed", slower=True) == exitcodes.SLOWER == 3
    assert exitcodes.for_status("stopped", slower=True) == 0  # a stopped bench compared nothing
    assert exitcodes.BAD_INPUT == 2


@pytest.mark.parametrize("how, code, status, error", [
    ("ok", 0, "completed", None),
    ("fail", 1, "failed", "the toy cannot go on: no widgets"),
    ("crash", 1, "failed", "KeyError: 'missing'"),
])
def test_a_toy_stage_needs_only_its_body(tmp_path, how, code, status, error):
    proc = toy(tmp_path, tmp_path / "w", "t", how)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    run = tmp_path / "w" / "runs" / "t"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == status and summary["widgets"] == 3 and summary["stage"] == "toy"
    assert summary.get("error") == error
    evs = events(run)
    assert evs[0]["kind"] == "start" and evs[0]["manifest"]["identity"] == {"how": how}
    assert evs[-1]["kind"] == "finish" and evs[-1]["status"] == status and evs[-1]["summary"] == summary
    if error:
        assert f"toy: failed: {error}" in err
        assert [e for e in evs if e["kind"] == "error" and e.get("fatal")][0]["message"] == error
    assert (tmp_path / "w" / "finally-ran").exists()


def test_sigterm_interrupts_the_body_runs_its_finally_and_ends_stopped(tmp_path):
    proc = toy(tmp_path, tmp_path / "w", "t", "sleep")
    run = tmp_path / "w" / "runs" / "t"
    deadline = time.monotonic() + 30
    while not ((run / "events.jsonl").exists() and any(e["kind"] == "progress" for e in events(run))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert (tmp_path / "w" / "finally-ran").read_text() == "yes"
    evs = events(run)
    assert evs[-1]["kind"] == "finish" and evs[-1]["status"] == "stopped"
    assert any(e["kind"] == "error" and e["message"].startswith("received SIGTERM") for e in evs)
    assert json.loads((run / "summary.json").read_text())["status"] == "stopped"


def started(proc: subprocess.Popen, run: Path) -> None:
    deadline = time.monotonic() + 30
    while not ((run / "events.jsonl").exists() and any(e["kind"] == "progress" for e in events(run))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


def test_a_second_program_on_a_run_is_refused_naming_the_holder(tmp_path):
    work, run = tmp_path / "w", tmp_path / "w" / "runs" / "t"
    first = toy(tmp_path, work, "t", "sleep")
    try:
        started(first, run)
        before = (run / "events.jsonl").read_text()
        second = toy(tmp_path, work, "t", "sleep")
        out, err = second.communicate(timeout=60)
        assert second.returncode == exitcodes.BAD_INPUT, err
        assert f"run t is in use by toy run t (pid {first.pid}, since " in err
        assert "eagle3-console run stop --run-id t" in err
        assert (run / "events.jsonl").read_text() == before  # the refused one wrote nothing
        # --fresh is refused too: it would archive the directory under the running program
        fresh = toy(tmp_path, work, "t", "ok", TOY_FRESH="1")
        out, err = fresh.communicate(timeout=60)
        assert fresh.returncode == exitcodes.BAD_INPUT and "in use by toy run t" in err
        assert sorted(p.name for p in (work / "runs").iterdir()) == ["t"]  # nothing archived
        assert first.poll() is None
    finally:
        first.kill()
        first.communicate(timeout=30)


def test_the_run_lock_goes_with_a_killed_holder_so_a_resume_works(tmp_path):
    work, run = tmp_path / "w", tmp_path / "w" / "runs" / "t"
    first = toy(tmp_path, work, "t", "sleep")
    started(first, run)
    first.send_signal(signal.SIGKILL)  # no finally, no release: only the kernel lets go of the flock
    first.communicate(timeout=30)
    resume = toy(tmp_path, work, "t", "sleep", TOY_HOW="ok")
    out, err = resume.communicate(timeout=60)
    assert resume.returncode == 0, err
    starts = [e for e in events(run) if e["kind"] == "start"]
    assert len(starts) == 2 and starts[-1]["resumed"] is True
    assert events(run)[-1]["status"] == "completed"


def test_bad_input_creates_nothing(tmp_path):
    work = tmp_path / "w"
    (work / "runs" / "t").mkdir(parents=True)
    (work / "runs" / "t" / "stray").write_text("not a run")
    proc = toy(tmp_path, work, "t", "ok")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "has no manifest.json" in err
    assert sorted(p.name for p in (work / "runs" / "t").iterdir()) == ["stray"]
    assert not (work / "finally-ran").exists()  # the body never ran


def test_a_failed_event_write_never_takes_the_run_down(tmp_path, capsys):
    from backend.contract.runs import Manifest
    from backend.kit.lifecycle import StageRun

    ctx = StageRun("toy", "t", work_dir=str(tmp_path), manifest=Manifest(stage="toy", run_id="t", identity={}))

    def body(ctx):
        ctx.start(total=1)

        def refuse(*_a, **_kw):
            raise OSError(errno.ENOSPC, "No space left on device")

        ctx.events.emit = refuse  # every write from now on fails, as on a full disk
        ctx.emit("progress", done=1, total=1)

    assert ctx.run(body) == 0
    assert "could not write the progress event" in capsys.readouterr().err
    assert json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())["status"] == "completed"


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "small", "256k") as mnt:
        yield mnt


def test_a_full_disk_ends_the_run_with_a_finish_naming_the_full_volume(tmp_path, small_disk):
    proc = toy(tmp_path, small_disk, "t", "full")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    run = small_disk / "runs" / "t"
    finish = events(run)[-1]
    assert finish["kind"] == "finish" and finish["status"] == "failed"
    assert finish["summary"]["error"].startswith(f"disk full: no space left on the volume of {run}")
    assert "disk full" in err


def _fill_then(cmd: str) -> list[str]:
    """A stage program that fills the disk under its run, then fails."""
    return [sys.executable, "-c", "import os, sys\ntry:\n    f = open(sys.argv[1], 'wb')\n    while True:\n"
            "        f.write(b'x' * 65536); f.flush()\nexcept OSError:\n    pass\nsys.exit(1)", cmd]


@pytest.mark.parametrize("program", ["chain", "benchpair"])
def test_every_program_ends_with_a_finish_on_a_full_disk(tmp_path, small_disk, program, answering):
    """The chain and the bench pair died with a traceback when their summary no longer fitted."""
    work = small_disk
    filler = str(small_disk / "filler")
    if program == "chain":
        plan = {"stages": [{"stage": "generate", "run_id": "c-generate", "argv": _fill_then(filler)}]}
        argv = ["backend.chain", "--run-id", "c"]
        run = work / "runs" / "c"
    else:
        # the baseline runs already and answers (a loopback server that says 200 to the switch's checks)
        home = {"name": "baseline", "unit": "baseline", "start": ["true"], "stop": ["true"], "alive": ["true"]}
        drafter = {"name": "drafter", "unit": "drafter", "start": ["true"], "stop": ["true"], "alive": ["false"]}
        plan = {"switch": {"version": 1, "home": home, "away": [drafter], "ready_timeout_s": 30,
                           "endpoint": answering}}
        plan["baseline"] = {"server": "baseline", "run_id": "p-baseline", "argv": _fill_then(filler)}
        plan["contenders"] = [{"server": "drafter", "run_id": "p-drafter", "argv": ["true"], "title": "drafter",
                               "k": 3, "ours": True}]
        argv = ["backend.benchpair", "--run-id", "p"]
        run = work / "runs" / "p"
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    res = subprocess.run([sys.executable, "-m", *argv, "--work-dir", str(work), "--plan", str(tmp_path / "plan.json")],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    finish = events(run)[-1]
    assert finish["kind"] == "finish" and finish["status"] == "failed", events(run)
    assert finish["summary"]["error"]
