"""The stage table (console/control/stages.py): a stage added as one row is listed, started, followed and
stopped like the others; `run stop` and `run --wait` after a resume, headless, on the demo host."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace as dataclasses_replace
from pathlib import Path

import pytest
import tomli_w

from backend.contract.lookup import INPUT_STAGE, STAGES as HOST_STAGES
from console.cli import main
from console.control import stages
from console.control.launch import StageRequest, busy_stages, pipeline_range, stops_baseline
from backend.verify.report import K_MAX
from console.telemetry.progress import StageProgress, counted
from console.snapshot import HostInfo, RunInfo, ServiceInfo, Snapshot

ROOT = Path(__file__).resolve().parents[1]

TOY_PROGRAM = """
import os, sys, time
from backend.contract.events import EventLog
work, run_id, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
run_dir = os.path.join(work, "runs", run_id)
os.makedirs(run_dir, exist_ok=True)
log = EventLog(os.path.join(run_dir, "events.jsonl"), "toy", run_id)
log.emit("start", total=n)
for i in range(n):
    time.sleep(0.3)
    log.emit("progress", done=i + 1, total=n)
log.emit("finish", status="completed", summary={"outputs": {"widgets": run_dir + "/widgets"}})
"""


async def _toy_argv(ctx, run_id, input_run, req):
    return [sys.executable, "-c", TOY_PROGRAM, ctx.profile.paths.work_dir, run_id, "3"], None


TOY = stages.Stage("toy", "toy widgets", cli="toy", build=_toy_argv, view=counted("widgets"))


@pytest.fixture
def toy_table(monkeypatch):
    monkeypatch.setattr(stages, "TABLE", (*stages.TABLE, TOY))


def test_the_table_agrees_with_the_host_stages():
    assert stages.pipeline_stages() == HOST_STAGES
    for name in HOST_STAGES:
        assert stages.get(name).input_stage == INPUT_STAGE.get(name), name
    assert len(set(stages.names())) == len(stages.names()) and len(set(stages.cli_names())) == len(stages.cli_names())
    # what used to be written by hand: the swap rule's list
    assert set(stages.swap_exclusive()) == {"extract", "bench", "train", "verify", "pipeline"}


def test_a_toy_stage_needs_only_its_row(toy_table, tmp_path, capsys, monkeypatch):
    from console.ui.panes.stages import row_markup, stage_rows

    # the busy rules and the swap confirmation read the row
    assert busy_stages(StageRequest("toy"), None) == ["toy", "pipeline"]
    assert stops_baseline(StageRequest("toy")) is False
    assert "toy" not in pipeline_range(StageRequest("pipeline"))
    # the stages pane lists it with its label, and its newest run
    snap = Snapshot(HostInfo("h", reachable=True), ServiceInfo("tmux", "u"),
                    runs=(RunInfo("toy", "t1", "running", unit="e3-toy-t1", done=1, total=4),))
    rows = {r.stage: r for r in stage_rows(snap)}
    assert rows["toy"].state == "running" and rows["toy"].detail == "25%"
    assert "toy widgets" in row_markup(rows["toy"]).plain
    # its typed view words the progress in its unit
    assert stages.view_of(snap.runs[0]).line() == "running: 1/4 widgets, 0 failed"

    # `run toy --wait` starts it detached on a (local, tmux) host and follows it to the end
    work = tmp_path / "w"
    (work / "tmux").mkdir(parents=True, mode=0o700)
    profile = tmp_path / "p.toml"
    profile.write_text(tomli_w.dumps({
        "host": {"name": "localhost", "transport": "local"},
        "server": {"manager": "tmux", "unit": "e3t-toysrv", "model_path": "/m", "port": 1},
        "paths": {"work_dir": str(work), "python": sys.executable}, "gpus": {"command": ["true"]}}))
    sockets = tempfile.mkdtemp(prefix="e3toy", dir="/tmp")  # a tmux server of this test's own
    monkeypatch.setenv("TMUX_TMPDIR", sockets)
    monkeypatch.delenv("TMUX", raising=False)
    try:
        rc = main(["run", "toy", "--profile", str(profile), "--run-id", "t1", "--wait", "--interval", "0.2"])
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert "started e3-toy-t1" in out.out and "done: 3/3 widgets, 0 failed" in out.out
        assert f"widgets: {work}/runs/t1/widgets" in out.out
    finally:
        subprocess.run(["tmux", "kill-server"], capture_output=True, env={**os.environ, "TMUX_TMPDIR": sockets})
        shutil.rmtree(sockets, ignore_errors=True)


def test_views_are_total_on_odd_values():
    run = RunInfo("generate", "g", "running", done=3, total=5,
                  last_event={"done": "x", "total": float("nan"), "failed": True, "completion_tokens": float("inf"),
                              "skipped_by_reason": {"a": -1, "b": 2.5, "c": 2}, "rate": "fast"})
    v = stages.view_of(run)
    assert (v.done, v.total, v.failed, v.rate) == (3, 5, 0, None)
    assert v.completion_tokens is None and v.skipped_by_reason == (("b", 2), ("c", 2))
    verify = RunInfo("verify", "v", "done", last_event={"checks": [{"name": "x", "ok": True}],
                                                         "acceptance": {"k": 10**9, "trained": {"per_position": [1] * 5}}})
    assert stages.view_of(verify).k == K_MAX  # a claimed k is cut, never iterated
    assert isinstance(stages.view_of(RunInfo("nonesuch", "n", "done")), StageProgress)


def test_run_stop_needs_one_target_and_never_a_server(tmp_path, capsys):
    profile = tmp_path / "p.toml"
    profile.write_text(tomli_w.dumps({"host": {"name": "localhost", "transport": "local"},
                                      "server": {"manager": "tmux", "unit": "u", "model_path": "/m"},
                                      "paths": {"work_dir": str(tmp_path)}}))
    assert main(["run", "stop", "--profile", str(profile)]) == 2
    assert "a STAGE or --run-id ID" in capsys.readouterr().err
    assert main(["run", "stop", "generate", "--run-id", "x", "--profile", str(profile)]) == 2
    assert main(["run", "stop", "serve", "--profile", str(profile)]) == 2
    assert "is a server" in capsys.readouterr().err
    assert main(["run", "stop", "nonesuch", "--profile", str(profile)]) == 2
    assert main(["run", "generate", "extra", "--profile", str(profile)]) == 2


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TMUX", None)
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def _run_state(profile: str, run_id: str) -> dict | None:
    snap = json.loads(_cli("status", "--profile", profile, "--json").stdout)
    return next((r for r in snap["runs"] if r["run_id"] == run_id), None)


@pytest.mark.timeout(600)
def test_run_stop_then_resume_with_wait_on_the_demo_host(tmp_path):
    """`run stop generate --wait` stops a running generation (exit 0 once stopped); rerunning the same
    command with --wait then follows the resumed run to its end, not the stop it finds on disk."""
    work = tmp_path / "d"
    started = _cli("demo-host", "start", "--dir", str(work), "--speed", "10")
    assert started.returncode == 0, started.stderr
    profile = started.stdout.strip()
    try:
        assert _cli("wait-ready", "--profile", profile, "--timeout", "120").returncode == 0
        run = _cli("run", "generate", "--profile", profile, "--run-id", "g1", "--limit", "300")
        assert run.returncode == 0, run.stderr
        deadline = time.monotonic() + 120
        while (state := _run_state(profile, "g1")) is None or state["state"] != "running" or state["done"] < 1:
            assert time.monotonic() < deadline, state
            time.sleep(0.5)
        stop = _cli("run", "stop", "generate", "--profile", profile, "--wait")
        assert stop.returncode == 0, stop.stderr
        assert "stopped e3-generate-g1" in stop.stdout and "stopped:" in stop.stdout
        stopped = _run_state(profile, "g1")
        assert stopped["state"] == "stopped" and stopped["done"] < 300
        again = _cli("run", "stop", "--run-id", "g1", "--profile", profile)
        assert again.returncode == 1 and "not running (stopped)" in again.stderr
        # the documented recovery: the same command again resumes, and --wait follows that run
        resumed = _cli("run", "generate", "--profile", profile, "--run-id", "g1", "--limit", "300", "--wait",
                       "--interval", "0.5", timeout=400)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert "done: 300/300" in resumed.stdout and "stopped:" not in resumed.stdout
    finally:
        _cli("demo-host", "stop", "--dir", str(work))


async def test_wait_after_a_resumed_pipeline_follows_the_new_start(monkeypatch, capsys):
    """`run pipeline --run-id X --wait` after a failed stage: the chain's old finish (failed) is on disk
    until the resumed chain writes its new start; --wait must not report it."""
    from console.commands import run_cmd

    before = RunInfo("pipeline", "p1", "failed", unit="e3-pipeline-p1", done=2, total=5, started=100.0,
                     last_event={"kind": "finish", "status": "failed", "error": "extract failed"})
    resumed = [dataclasses_replace(before, state="running", started=200.0, done=3,
                                   last_event={"kind": "progress", "current_run": "p1-train"}),
               dataclasses_replace(before, state="done", started=200.0, done=5,
                                   last_event={"kind": "finish", "status": "completed"})]

    class Session:
        host, profile = None, None

        async def snapshots(self, connecting=True):
            for run in (before, before, *resumed):
                yield Snapshot(HostInfo("h", reachable=True), ServiceInfo("tmux", "u"), runs=(run,))

        async def settle(self):  # run --wait reads every run to the end before it prints the results
            return Snapshot(HostInfo("h", reachable=True), ServiceInfo("tmux", "u"), runs=(resumed[-1],))

    async def alive(*args):
        return None  # its unit still runs: the resume has not written its start yet

    monkeypatch.setattr(run_cmd, "stage_ended", alive)
    assert await run_cmd.follow_run(Session(), "pipeline", "p1", before=before) == 0
    out = capsys.readouterr()
    assert "failed" not in out.out and "extract failed" not in out.err
    assert out.out.splitlines() == ["running: 3/5 stages", "done: 5/5 stages"]
