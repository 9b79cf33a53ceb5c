"""The stage table (console/control/stages.py): a stage added as one row is listed, started, followed and
stopped like the others; `run stop` and `run --wait` after a resume, headless, on the demo host."""
from __future__ import annotations

import ast
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

from backend.contract import stages as host_stages
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


def test_every_host_row_has_a_console_row_and_its_modules():
    from backend.chain.requirements import stage_modules

    assert set(host_stages.names()) <= set(stages.names())
    for row in host_stages.TABLE:
        # the chain checks a pipeline stage's modules before its first stage starts: each names its list
        assert row.modules is not None or not row.in_pipeline, row.name
        modules = stage_modules(row.name)
        assert modules == () if row.modules is None else modules and all(isinstance(m, str) for m in modules)
    with pytest.raises(KeyError, match="no host stage 'nope'"):
        host_stages.get("nope")


DISTILL = host_stages.HostStage("distill", gpus="trainer", input_stage="train", in_pipeline=True,
                                modules="backend.train.preflight:TRAIN_MODULES")


def test_a_new_host_row_is_picked_up_by_every_reader(monkeypatch):
    """A pipeline stage added as one host row (and one console row): the chain's order, the GPU plan, the
    chain's checks, `backend.ask` and the console's host facts all read it, none restates it."""
    from backend.ask import parser as ask_parser
    from backend.chain.plan import PlanError, parse_plan
    from backend.chain.requirements import stage_modules
    from backend.kit.gpu_owners import TRAINER, HostShape, plan_gpus
    from backend.train.preflight import TRAIN_MODULES

    rows = list(host_stages.TABLE)
    rows.insert([r.name for r in rows].index("verify"), DISTILL)
    monkeypatch.setattr(host_stages, "TABLE", tuple(rows))
    console_rows = list(stages.TABLE)
    console_rows.insert(stages.names().index("verify"), stages.Stage("distill", "distill", cli="distill",
                                                                     build=_toy_argv))
    monkeypatch.setattr(stages, "TABLE", tuple(console_rows))

    assert host_stages.pipeline() == ("generate", "prepare", "extract", "train", "distill", "verify")
    assert host_stages.input_stages()["distill"] == "train"
    # the chain's plan takes it in pipeline order and refuses it out of order
    plan = {"stages": [{"stage": s, "run_id": f"n-{s}", "argv": ["python3", "-m", f"backend.{s}"]}
                       for s in ("train", "distill", "verify")]}
    assert [p.stage for p in parse_plan(plan)] == ["train", "distill", "verify"]
    plan["stages"].reverse()
    with pytest.raises(PlanError, match="out of pipeline order"):
        parse_plan(plan)
    assert stage_modules("distill") == TRAIN_MODULES
    # the GPU plan: the trainer's GPUs, beside the baseline on disjoint GPUs
    step = plan_gpus(HostShape(gpus=2, server=(0,), trainer=(1,)), ["distill"]).steps[0]
    assert step.holders[TRAINER] == (1,)
    assert ask_parser().parse_args(["latest", "--work-dir", "w", "--stage", "distill"]).stage == "distill"
    # the console's row takes the host's facts: in the pipeline, takes the GPUs online, computes on them
    row = stages.get("distill")
    assert (row.input_stage, row.in_pipeline, row.takes_gpus, row.gpu_user) == ("train", True, "online", True)
    assert stages.pipeline_stages() == host_stages.pipeline()
    assert "distill" in stages.swap_exclusive()
    assert pipeline_range(StageRequest("pipeline", from_stage="train", to_stage="verify", online=False)) == \
        ["train", "distill", "verify"]


# modules that name two host stages together for a rule of their own, not as a list of the stages
OWN_RULES = {
    "backend/bench/workload.py": "the runs a bench takes its prompts from (a prepare run's held-out rows, or "
                                 "a generate run)",
    "backend/kit/servable.py": "the runs that hold a servable checkpoint (verify, or a train run it verified)",
    "backend/train/runner.py": "what train takes as its input run: its own message words it",
}


def _stage_literals(source: str, names: set[str]) -> list[int]:
    """Lines of tuple, list, set or dict literals naming two or more host stages, and of functions that
    branch on two or more (`stage == "extract"` ... `stage == "train"`: a per-stage table of their own)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        items: list = []
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [*node.keys, *node.values]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            items = [x for c in ast.walk(node) if isinstance(c, ast.Compare)
                     and all(isinstance(op, (ast.Eq, ast.NotEq)) for op in c.ops) for x in (c.left, *c.comparators)]
        named = {i.value for i in items if isinstance(i, ast.Constant) and i.value in names}
        if len(named) >= 2:
            lines.append(node.lineno)
    return sorted(lines)


def test_no_module_but_the_host_table_lists_the_stages():
    names = set(host_stages.names())
    found = {}
    for top in ("backend", "console", "sim"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel != "backend/contract/stages.py" and rel not in OWN_RULES:
                if lines := _stage_literals(path.read_text(), names):
                    found[rel] = lines
    assert found == {}
    # and the scan does see a restated list
    restated = ('X = 1\nSERVED = ("generate", "prepare")\nI = {"train": "extract"}\n'
                'def modules(stage):\n    if stage == "prepare":\n        return P\n    if stage == "extract":\n'
                '        return E\n')
    assert _stage_literals(restated, names) == [2, 3, 4]


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
    from console.profile import load_profile, write_profile

    # one request at a time, as an operator throttles a shared server: 120 records take about 25 s on a
    # quiet machine and the stop lands about 25 in (16 at a time, 120 took 13 s, and on a loaded machine
    # `run stop` came after the last one)
    edited = load_profile(profile)
    edited.generate.concurrency = 1
    write_profile(edited, profile, overwrite=True)
    try:
        assert _cli("wait-ready", "--profile", profile, "--timeout", "120").returncode == 0
        run = _cli("run", "generate", "--profile", profile, "--run-id", "g1", "--limit", "120")
        assert run.returncode == 0, run.stderr
        deadline = time.monotonic() + 120
        while (state := _run_state(profile, "g1")) is None or state["state"] != "running" or state["done"] < 1:
            assert time.monotonic() < deadline, state
            time.sleep(0.5)
        stop = _cli("run", "stop", "generate", "--profile", profile, "--wait")
        assert stop.returncode == 0, stop.stderr
        assert "stopped e3-generate-g1" in stop.stdout and "stopped:" in stop.stdout
        stopped = _run_state(profile, "g1")
        assert stopped["state"] == "stopped" and stopped["done"] < 120
        again = _cli("run", "stop", "--run-id", "g1", "--profile", profile)
        assert again.returncode == 1 and "not running (stopped)" in again.stderr
        # the documented recovery: the same command again resumes, and --wait follows that run
        resumed = _cli("run", "generate", "--profile", profile, "--run-id", "g1", "--limit", "120", "--wait",
                       "--interval", "0.5", timeout=400)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert "done: 120/120" in resumed.stdout and "stopped:" not in resumed.stdout
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
