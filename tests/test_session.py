"""The session seam on the demo host (tmux manager, real stand-in): restarts, refusals, deadlines."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from console import demo
from console.commands.server_cmd import wait_ready
from console.profile import load_profile, write_profile
from console.session import Session
from harness.polling import until

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parent.parent


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL)


async def test_restart_after_a_failed_load_never_reports_the_old_failure(tmp_path):
    """`status` and `wait-ready` after a restart speak of the new process only: the failed load's root
    cause (in the previous log) must not be read as the new one's, nor a finished deep check kept."""
    work = tmp_path / "d"
    profile = demo.prepare(work, speed=10)
    good = list(profile.server.command)
    profile.server.command = [*good, "--fault", "crash-during-load:0.3"]
    write_profile(profile, profile.source, overwrite=True)
    try:
        assert cli("start-server", "--profile", profile.source).returncode == 0
        rc, snap = await wait_ready(profile, timeout=30, interval=0.2)
        assert rc == 1 and "CUDA out of memory" in snap.server.error

        profile.server.command = good
        write_profile(profile, profile.source, overwrite=True)
        res = cli("restart-server", "--profile", profile.source, "--yes")
        assert res.returncode == 0, res.stderr
        status = json.loads(cli("status", "--profile", profile.source, "--json").stdout)
        assert status["server"]["phase"] != "failed" and status["server"]["error"] is None, status["server"]
        out = cli("wait-ready", "--profile", profile.source, "--timeout", "60")
        assert out.returncode == 0, out.stderr

        async with Session(load_profile(profile.source), interval=0.2) as session:
            await session.settle()
            assert (await session.deep_check()).ok
            assert session.collector.snapshot().server.deep_check.startswith("ok")
            assert (await session.restart_server()).ok
            snap = await until(session.tick, "a snapshot of the restarted server", timeout=30)
            while snap.server.phase == "ready":
                snap = await session.tick()
            assert snap.server.deep_check is None  # a check of the old process says nothing of this one
    finally:
        await demo.stop(work)


def test_run_refuses_a_second_run_of_a_running_stage(tmp_path):
    """`run generate` refuses what the app's `s` refuses: a second generation run next to a live one."""
    work = tmp_path / "d"
    started = cli("demo-host", "start", "--dir", str(work), "--speed", "10")
    assert started.returncode == 0, started.stderr
    profile = started.stdout.strip()
    from console.profile import load_profile, write_profile

    # one request at a time: 200 records outlast the commands below even on a loaded machine (16 at a time
    # the tiny model answers 150 in about 15 s)
    edited = load_profile(profile)
    edited.generate.concurrency = 1
    write_profile(edited, profile, overwrite=True)
    try:
        assert cli("wait-ready", "--profile", profile, "--timeout", "60").returncode == 0
        first = cli("run", "generate", "--profile", profile, "--run-id", "first", "--limit", "200")
        assert first.returncode == 0, first.stderr
        second = cli("run", "generate", "--profile", profile, "--run-id", "second", "--limit", "2")
        assert second.returncode == 1
        assert "already running" in second.stderr and "first" in second.stderr
        assert not (work / "runs" / "second").exists()
        # another stage on the running run's id: refused, naming the program that holds the run (by the
        # console when it has seen the run, else by the host's run lock, which --wait reports). generate's
        # run is listed as running from its start event, written after its preflight and throughput smoke
        # (up to 25 s): until then another stage's input lookup can refuse first, so wait to see it listed
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            listed = json.loads(cli("status", "--profile", profile, "--json").stdout or "{}").get("runs") or []
            if any(r.get("run_id") == "first" and r.get("state") == "running" for r in listed):
                break
            time.sleep(1)
        third = cli("run", "prepare", "--profile", profile, "--run-id", "first", "--wait")
        assert third.returncode == 1, third.stdout + third.stderr
        assert "in use by" in third.stderr and "generate" in third.stderr, third.stderr
    finally:
        cli("demo-host", "stop", "--dir", str(work))


async def test_a_hanging_host_yields_not_answering_snapshots_in_time(tmp_path):
    """A probe that never answers (here the GPU query hangs) must not stop the snapshots: within the
    deadline the session says the host is not answering, since when, and keeps the last values."""
    work = tmp_path / "d"
    profile = demo.prepare(work)
    profile.gpus.command = ["sleep", "3600"]
    async with Session(profile, interval=0.2, deadline=1.0) as session:
        t0 = time.monotonic()
        snap = await session.tick()
        waited = time.monotonic() - t0
        assert waited < 3.0
        assert not snap.host.reachable and snap.host.not_answering_since is not None
        assert "not answering" in snap.host.error
        since = snap.host.not_answering_since
        again = await session.tick()
        assert again.host.not_answering_since == since  # the same outage, still counted from its start


def test_status_gives_up_after_its_timeout(tmp_path):
    work = tmp_path / "d"
    profile = demo.prepare(work)
    profile.gpus.command = ["sleep", "3600"]
    write_profile(profile, profile.source, overwrite=True)
    t0 = time.monotonic()
    res = cli("status", "--profile", profile.source, "--json", "--timeout", "3")
    assert time.monotonic() - t0 < 30
    snap = json.loads(res.stdout)
    assert res.returncode == 3 and "no complete answer within 3 s" in snap["host"]["error"]
