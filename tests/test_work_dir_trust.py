"""The work dir is trusted only when no one else can write there, and a run's unit only when it is one this
project names (issue 23)."""
from __future__ import annotations

import os
import re

import pytest

from backend.contract.events import Event
from console import demo
from console.control import launch
from console.control.units import is_stage_unit
from console.host.local import LocalHost
from console.telemetry.probe import RunFile
from console.telemetry.runs import RunBook

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("stat, problem", [
    ("1000 1000 755 /w\n1000 1000 755 /w/code\n1000 1000 700 /w/plans\n1000 1000 755 /w/runs", None),
    ("1000 1000 775 /w\n0 0 755 /w/code\n1000 1000 755 /w/plans\n1000 1000 755 /w/runs", None),  # own group
    ("1000 1000 755 /w\n1000 1000 1777 /w/code\n", "/w/code can be written by every user"),
    ("1000 1000 755 /w\n1000 100 775 /w/plans\n", "/w/plans can be written by group 100"),
    ("1000 1000 755 /w\n1001 1000 755 /w/runs\n", "/w/runs can be written by its owner, user 1001"),
    ("1000 1000 garbage\n", "cannot tell who owns"),
])
def test_work_dir_problem(stat, problem):
    found = launch.work_dir_problem("1000\n1000\n" + stat + "\n")
    assert (found is None) if problem is None else (problem in found), found


def test_state_and_secrets_are_checked_and_secrets_not_even_for_the_own_group():
    found = launch.work_dir_problem("1000\n1000\n1000 1000 755 /w\n1001 1000 755 /w/state\n")
    assert found and "/w/state can be written by its owner, user 1001" in found
    stat = "1000\n1000\n1000 1000 755 /w\n1000 1000 770 /w/secrets\n"
    assert launch.work_dir_problem(stat) is None  # own group, not a private dir
    found = launch.work_dir_problem(stat, private=("/w/secrets",))
    assert found and "/w/secrets can be written by group 1000" in found


@pytest.mark.parametrize("sub, mode, problem", [
    ("state", 0o777, "can be written by every user"),
    ("secrets", 0o770, "can be written by group"),
    ("secrets", 0o700, None),
    ("state", 0o775, None),
])
async def test_check_work_dir_reads_state_and_secrets(tmp_path, sub, mode, problem):
    from console.profile import profile_from_dict

    work = tmp_path / "w"
    profile = profile_from_dict({"host": {"name": "gpu-host.example"}, "server": {"model_path": "/models/m"},
                                 "paths": {"work_dir": str(work)}})
    (work / sub).mkdir(parents=True)
    os.chmod(work / sub, mode)
    host = LocalHost()
    await host.connect()
    try:
        if problem is None:
            await launch.check_work_dir(host, profile)
        else:
            with pytest.raises(launch.StageError, match=re.escape(f"refusing the work dir: {work / sub} {problem}")):
                await launch.check_work_dir(host, profile)
        assert (work / "state").is_dir() and (work / "secrets").is_dir()  # created when missing
    finally:
        await host.close()


@pytest.mark.parametrize("sub", ["", "code", "plans", "runs"])
async def test_a_work_dir_others_can_write_is_refused_before_any_upload(tmp_path, sub):
    profile = demo.prepare(tmp_path / "d")
    host = LocalHost()
    await host.connect()
    try:
        await launch.ensure_backend(host, profile, [])  # sound: accepted
        target = os.path.join(profile.paths.work_dir, sub) if sub else profile.paths.work_dir
        os.chmod(target, 0o777)
        for name in os.listdir(os.path.join(profile.paths.work_dir, "code")):
            os.rename(os.path.join(profile.paths.work_dir, "code", name),
                      os.path.join(profile.paths.work_dir, "code", name + ".old"))
        shown: list[str] = []
        with pytest.raises(launch.StageError, match=f"{target} can be written by every user"):
            await launch.ensure_backend(host, profile, shown)
        assert shown == [] and all(n.endswith(".old") for n in os.listdir(f"{profile.paths.work_dir}/code"))
    finally:
        await host.close()


@pytest.mark.parametrize("name, ok", [
    ("e3-generate-r1", True), ("e3-pipeline-p1", True), ("e3-fetch_drafter-x", True),
    ("vllm-kimi", False), ("sshd", False), ("e3-generate-", False), ("e3-nosuchstage-r1", False),
    ("e3-generate-a;b", False), ("e3-generate-r1\n", False), (["e3-generate-r1"], False), (None, False),
])
def test_stage_units_are_the_projects_names(name, ok):
    assert is_stage_unit(name) is ok


def test_a_run_naming_a_foreign_unit_is_followed_in_its_own():
    book = RunBook("systemd")
    start = Event(kind="start", stage="generate", run_id="r1", ts=1.0, data={"total": 3, "unit": "vllm-kimi"})
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=len(start.to_line()), mtime=0)])
    book.apply_events("/w/runs/r1", start.to_line())
    assert book.pending_units() == ["e3-generate-r1"] and book.infos()[0].unit == "e3-generate-r1"
