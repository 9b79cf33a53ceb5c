"""Disk: the host's survey of run directories and the prune that never touches a protected run
(backend/kit/disk.py), through `eagle3-console runs prune` on the demo host."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.contract.runs import archive
from backend.kit import disk
from console import demo
from console.control.disk import DiskError, parse_duration
from harness.run_dirs import DAY, make_run

REPO = Path(__file__).resolve().parent.parent


def test_plan_keeps_running_runs_their_inputs_and_the_newest_completed(tmp_path):
    work = tmp_path / "w"
    make_run(work, "gen-old", "generate", age_s=9 * DAY)
    make_run(work, "gen-new", "generate", age_s=2 * DAY)
    make_run(work, "prep-a", "prepare", input_run="gen-old", age_s=8 * DAY)
    make_run(work, "prep-b", "prepare", input_run="gen-new", age_s=1 * DAY)
    make_run(work, "train-live", "train", status=None, input_run="prep-a", age_s=5)  # written 5 s ago
    make_run(work, "train-dead", "train", status=None, input_run="prep-b", age_s=3 * DAY)  # a crash long ago
    make_run(work, "verify-failed", "verify", status="failed", age_s=4 * DAY)
    old = make_run(work, "gen-x", "generate", age_s=20 * DAY)
    archived = Path(archive(str(old)))
    _, runs = disk.survey(str(work))
    assert {r.name for r in runs} == {"gen-old", "gen-new", "prep-a", "prep-b", "train-live", "train-dead",
                                      "verify-failed", archived.name}
    by = {r.name: r for r in runs}
    assert by[archived.name].archived and by[archived.name].run_id == "gen-x" and by["gen-old"].size >= 4096
    plan = disk.plan_prune(runs, running=["verify-failed"], now=time.time())
    kept = {r.name: why for r, why in plan.keep}
    assert {r.name for r in plan.delete} == {archived.name}
    assert kept["train-dead"] == "unfinished: resumable (runs prune --resumable deletes it)"
    plan = disk.plan_prune(runs, running=["verify-failed"], now=time.time(), resumable=True)
    kept = {r.name: why for r, why in plan.keep}
    assert {r.name for r in plan.delete} == {"train-dead", archived.name}
    via = "(manifest.json: identity.input_run)"
    assert kept == {"gen-new": "the newest completed generate run", "prep-b": "the newest completed prepare run",
                    "prep-a": f"the input of train-live {via}", "verify-failed": "running",
                    "gen-old": f"the input of prep-a {via}",  # through prep-a
                    "train-live": kept["train-live"]}
    assert kept["train-live"].startswith("unfinished and written")
    assert plan.total == sum(r.size for r in plan.delete)
    # the selection narrows what may go, never what is protected
    assert [r.name for r in disk.plan_prune(runs, now=time.time(), archived_only=True).delete] == [archived.name]
    assert {r.name for r in disk.plan_prune(runs, now=time.time(), older_than_s=5 * DAY).delete} == {archived.name}
    assert {r.name for r in disk.plan_prune(runs, now=time.time(), stage="train", resumable=True).delete} == {"train-dead"}


def test_a_running_pipeline_protects_every_run_of_it(tmp_path):
    work = tmp_path / "w"
    make_run(work, "n-generate", "generate", age_s=3 * DAY)
    make_run(work, "other-generate", "generate", age_s=1 * DAY)
    make_run(work, "n", "pipeline", status=None, stages=[["generate", "n-generate"], ["prepare", "n-prepare"]])
    _, runs = disk.survey(str(work))
    plan = disk.plan_prune(runs, now=time.time())
    assert dict((r.name, why) for r, why in plan.keep)["n-generate"] == "the input of n (manifest.json: identity.stages[0][1])"


def test_delete_removes_only_what_was_agreed_and_allowed(tmp_path):
    work = tmp_path / "w"
    make_run(work, "a", "generate", age_s=3 * DAY)
    make_run(work, "b", "generate", age_s=2 * DAY)
    make_run(work, "c", "generate", age_s=1 * DAY)
    _, runs = disk.survey(str(work))
    plan = disk.plan_prune(runs, now=time.time())
    assert disk.delete(str(work), plan, ["a", "c", "../../etc"]) == [
        disk.Deletion("a", True), disk.Deletion("c", False, "kept: the newest completed generate run"),
        disk.Deletion("../../etc", False, "not in the plan")]
    assert sorted(p.name for p in (work / "runs").iterdir()) == ["b", "c"]


def test_room_hint_names_the_runs_whose_removal_makes_room(tmp_path):
    work = tmp_path / "w"
    make_run(work, "big", "generate", age_s=3 * DAY, payload=1 << 20)
    make_run(work, "new", "generate", age_s=1 * DAY)
    hint = disk.room_hint(str(work), 512 * 1024)
    assert "removing big (" in hint and "would make room" in hint and "new" not in hint
    assert disk.room_hint(str(work), 1 << 40) == ""  # not enough to prune: no false promise


def test_durations():
    assert parse_duration("7d") == 7 * DAY and parse_duration("90") == 90 and parse_duration("2w") == 14 * DAY
    with pytest.raises(DiskError):
        parse_duration("7 days")


@pytest.mark.timeout(180)
def test_prune_on_the_demo_host_never_touches_protected_runs(tmp_path):
    work = tmp_path / "d"
    profile = demo.prepare(work, speed=5)
    host_work = Path(profile.paths.work_dir)
    make_run(host_work, "gen-older", "generate", age_s=12 * DAY)
    make_run(host_work, "gen-old", "generate", age_s=9 * DAY)
    make_run(host_work, "gen-new", "generate", age_s=2 * DAY)
    make_run(host_work, "prep-a", "prepare", input_run="gen-old", age_s=8 * DAY)
    src = make_run(host_work, "train-src", "train", age_s=10 * DAY)
    make_run(host_work, "train-newer", "train", age_s=1 * DAY)
    live = make_run(host_work, "train-live", "train", status=None, input_run="prep-a", age_s=1)
    manifest = json.loads((live / "manifest.json").read_text())  # a warm start: from_pretrained is a path
    manifest["identity"]["from_pretrained"] = str(src / "checkpoints" / "epoch-2")
    (live / "manifest.json").write_text(json.dumps(manifest))
    make_run(host_work, "verify-old", "verify", status="failed", age_s=6 * DAY)

    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "console.cli", "runs", "prune", "--profile", profile.source,
                               *args], cwd=REPO, capture_output=True, text=True, timeout=120, input=stdin)
    try:
        asked = cli()  # no terminal to ask on and no --yes: the list, and nothing deleted
        assert asked.returncode == 2, asked.stderr
        assert "would delete 1 run(s)" in asked.stdout and "gen-older" in asked.stdout
        assert "(breaks nothing)" in asked.stdout
        assert "(the input of prep-a (manifest.json: identity.input_run))" in asked.stdout
        assert "(the input of train-live (manifest.json: identity.from_pretrained))" in asked.stdout
        assert "(the newest completed generate run)" in asked.stdout
        assert "(failed: resumable (runs prune --resumable deletes it))" in asked.stdout
        assert (host_work / "runs" / "gen-older").exists()
        done = cli("--yes")
        assert done.returncode == 0, done.stderr
        assert "deleted 1 of 1 run(s)\n  gen-older: deleted" in done.stdout
        done = cli("--yes", "--resumable")
        assert done.returncode == 0, done.stderr
        assert "deleted 1 of 1 run(s)\n  verify-old: deleted" in done.stdout
        assert sorted(p.name for p in (host_work / "runs").iterdir()) == [
            "gen-new", "gen-old", "prep-a", "train-live", "train-newer", "train-src"]
        again = cli("--yes", "--stage", "generate")
        assert "nothing to delete" in again.stdout and (host_work / "runs" / "gen-old").exists()
    finally:
        import asyncio
        asyncio.run(demo.stop(work))


def test_preflight_disk_checks_name_the_runs_whose_removal_makes_room(tmp_path, monkeypatch):
    from backend.generate import preflight as gp
    from backend.kit import preflight as shared
    from backend.train import preflight as tp
    work = tmp_path / "w"
    make_run(work, "old-gen", "generate", age_s=9 * DAY, payload=1 << 20)
    make_run(work, "new-gen", "generate", age_s=1 * DAY)
    monkeypatch.setattr(shared, "free_bytes", lambda _p: 100 * 1024)  # the one disk check both stages use
    report = gp.PreflightReport()
    gp.check_disk(report, str(work / "runs" / "night"), 600 * 1024)
    assert not report.ok and "removing old-gen (" in report.checks[0].fix and "new-gen" not in report.checks[0].fix
    report = gp.PreflightReport()
    tp.check_disk(report, str(work / "runs" / "t"), 600 * 1024, str(work))
    assert "removing old-gen (" in report.checks[0].fix


# ---- the Disk pane and its keys ----------------------------------------------------------------------

def _report():
    from console.control.disk import DiskReport, RunSpace, VolumeSpace
    now = 1_700_000_010.0
    return DiskReport(volumes=(VolumeSpace("/data/eagle3", 50 * 2**30, 1000 * 2**30),),
                      runs=(RunSpace("hs-1", "hs-1", "extract", "completed", 828 * 2**30, now - 3 * DAY, False),
                            RunSpace("gen-1.archived-20261130T0101", "gen-1", "generate", "completed", 143 * 2**30,
                                     now - 9 * DAY, True),
                            RunSpace("gen-2", "gen-2", "generate", "completed", 2**30, now - DAY, False)))


def test_disk_pane_text_names_volumes_runs_and_archived_space():
    from console.ui.panes.disk import disk_markup
    text = disk_markup(_report(), 1_700_000_010.0).plain
    assert "volume   /data/eagle3  50.0 GiB free of 1000.0 GiB" in text
    assert "runs     3, 972.0 GiB; 1 archived by --fresh hold 143.0 GiB" in text
    lines = text.splitlines()
    assert lines[2].split()[:4] == ["828.0", "GiB", "extract", "completed"] and lines[3].endswith("(archived)")


async def test_u_shows_the_disk_pane_and_p_asks_before_pruning_what_it_lists():
    # the fake: runs of hundreds of GiB, which the demo host cannot hold; the keys on the real Session
    # against the demo host: tests/test_app_live.py
    from console.control.disk import PrunePlan, RunSpace
    from console.session import ActionResult
    from console.ui.app import ConsoleApp
    from console.ui.panes.disk import DiskPane
    from console.ui.screens.confirm import ConfirmScreen
    from harness.fake_controller import FakeController, base_snapshot

    old = RunSpace("gen-1.archived-20261130T0101", "gen-1", "generate", "completed", 143 * 2**30, 0.0, True)
    newest = RunSpace("gen-2", "gen-2", "generate", "completed", 2**30, 0.0, False, "the newest completed generate run")
    deleted: list[list[str]] = []

    class Fake(FakeController):
        async def disk_report(self):
            return _report()

        async def prune_plan(self):
            return PrunePlan(delete=(old,), keep=(newest,), total_bytes=old.size)

        async def prune_runs(self, names):
            deleted.append(names)
            return ActionResult(True, f"deleted {len(names)} run(s)")

    app = ConsoleApp(Fake([base_snapshot()]), clock=lambda: 1_700_000_010.0)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        assert not app.query_one(DiskPane).has_class("-shown")
        await pilot.press("u")
        for _ in range(50):
            if app.query_one(DiskPane).has_class("-shown"):
                break
            await pilot.pause(0.05)
        assert "828.0 GiB" in app.query_one("#disk-body").plain
        await pilot.press("p")
        for _ in range(50):
            if isinstance(app.screen, ConfirmScreen):
                break
            await pilot.pause(0.05)
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question == "Delete these 1 run(s), 143.0 GiB on gpu-host?"
        assert "gen-1.archived-20261130T0101" in app.screen.detail
        assert "kept: gen-2 (the newest completed generate run)" in app.screen.detail
        await pilot.press("enter")  # No has the focus
        await pilot.pause(0.2)
        assert deleted == []
        await pilot.press("p")
        for _ in range(50):
            if isinstance(app.screen, ConfirmScreen):
                break
            await pilot.pause(0.05)
        await pilot.press("y")
        for _ in range(50):
            if deleted:
                break
            await pilot.pause(0.05)
        assert deleted == [["gen-1.archived-20261130T0101"]]


async def test_prune_is_not_offered_read_only():
    from console.ui.app import ConsoleApp
    from harness.fake_controller import FakeController, base_snapshot
    app = ConsoleApp(FakeController([base_snapshot()]), readonly=True, clock=lambda: 1_700_000_010.0)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        assert app.check_action("prune", ()) is False and app.check_action("disk", ()) is True


def test_a_run_linked_to_another_volume_is_listed_with_its_volume_never_deleted(tmp_path):
    work = tmp_path / "w"
    make_run(work, "new", "generate", age_s=DAY)
    elsewhere = tmp_path / "big-volume" / "runs"
    make_run(tmp_path / "big-volume", "hs", "extract", age_s=9 * DAY, payload=1 << 16)
    os.symlink(elsewhere / "hs", work / "runs" / "hs")
    volumes, runs = disk.survey(str(work))
    hs = next(r for r in runs if r.name == "hs")
    assert hs.link == str((elsewhere / "hs").resolve()) and hs.size >= 1 << 16 and hs.stage == "extract"
    plan = disk.plan_prune(runs, now=time.time())
    assert dict((r.name, why) for r, why in plan.keep)["hs"].startswith("a link to ")
    assert not disk.delete(str(work), disk.Plan(delete=[hs]), ["hs"])[0].deleted and (elsewhere / "hs").exists()
