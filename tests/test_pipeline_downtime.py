"""`run pipeline`'s question names the whole time the baseline is down before the answer, on a demo host
shaped like the seed host (the server holds all eight simulated GPUs, training asks for one): from extract
through train (hours on the seed host, not the "2 server loads" it used to say), from this host's completed
runs or "unknown: first run", with verify on the CPU and the baseline serving again."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parent.parent


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL)


def completed(work: Path, stage: str, run_id: str, started: float, seconds: float) -> None:
    """A completed run's events as the stage writes them (backend/contract/events.py): its start and its finish."""
    run = work / "runs" / run_id
    run.mkdir(parents=True)
    events = [{"ts": started, "kind": "start", "stage": stage, "run_id": run_id, "total": 1},
              {"ts": started + seconds, "kind": "finish", "stage": stage, "run_id": run_id, "status": "completed",
               "summary": {}}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_the_pipelines_question_names_the_whole_downtime_before_the_answer(tmp_path):
    work = tmp_path / "demo"
    started = cli("demo-host", "start", "--dir", str(work), "--speed", "10", "--seed-shape")
    assert started.returncode == 0, started.stderr
    profile = started.stdout.strip()
    try:
        assert cli("wait-ready", "--profile", profile, "--timeout", "120").returncode == 0
        first = cli("run", "pipeline", "--profile", profile)
        assert first.returncode == 2, first.stderr
        said = first.stderr
        assert said.startswith("error: pipeline stops the baseline server: the baseline is down from extract through "
                               "train for unknown: first run (no completed extract or train run on this host yet), "
                               "started again once after train; verify runs on the CPU with the baseline serving "
                               "again; 2 server loads"), said
        assert "pass --yes" in said and not list(work.glob("runs/*/events.jsonl"))  # nothing started
        completed(work, "extract", "extract-old", 1_000_000.0, 3600.0)
        completed(work, "train", "train-old", 1_010_000.0, 4 * 3600.0)
        again = cli("run", "pipeline", "--profile", profile)
        assert again.returncode == 2
        assert ("the baseline is down from extract through train for about 5.0 h by the last completed runs on "
                "this host (extract about 60 min; train about 4.0 h), started again once after train"
                in again.stderr), again.stderr
    finally:
        cli("demo-host", "stop", "--dir", str(work))


@pytest.mark.timeout(240)
async def test_the_apps_pipeline_dialog_names_the_whole_downtime(tmp_path):
    from console import demo
    from console.control import stages
    from console.session import Session
    from console.ui.app import ConsoleApp
    from console.ui.screens.confirm import ConfirmScreen
    from harness.polling import until

    profile = await demo.start(tmp_path / "demo", speed=10, seed_shape=True)
    app = ConsoleApp(Session(profile, interval=0.5))
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await until(lambda: app.last_snapshot and app.last_snapshot.server.phase == "ready", "ready",
                        timeout=90, pause=pilot.pause)
            for _ in range(stages.names().index("pipeline")):
                await pilot.press("j")
            await pilot.pause()
            assert app.selected_stage == "pipeline"
            await pilot.press("s")
            await until(lambda: isinstance(app.screen, ConfirmScreen), "the question", timeout=10, pause=pilot.pause)
            detail = app.screen.detail
            assert ("the baseline is down from extract through train for unknown: first run (no completed extract "
                    "or train run on this host yet), started again once after train; verify runs on the CPU with "
                    "the baseline serving again; 2 server loads") in detail, detail
            assert app.screen.focused.id == "no"
            await pilot.press("enter")  # No: nothing starts
            await pilot.pause()
    finally:
        await demo.stop(tmp_path / "demo")
