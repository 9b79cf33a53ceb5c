"""The generate stage in the booted systemd rig: started by the console over SSH as a transient unit
(`systemd-run --unit=e3-generate-<run id> --collect`), against a vLLM stand-in running as a real unit.

The rig bind-mounts the repository and this interpreter at their own paths, so the stage runs there with
the interpreter that has aiohttp/datasets (the profile's `paths.python`), from the backend copy the
console uploads by content hash. Each test gets its own stand-in unit, port, work dir and run id.
"""
from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import uuid

import pytest

from backend.generate.records import model_turn
from console.profile import load_profile
from console.host.ssh import SshHost
from console.control.launch import StageRequest, launch_stage, stop_stage_unit
from harness.rig.remote import CLI, events_of, sh, standin_with_dataset, wait_for
from harness.rig.sim_unit import REPO, stop_unit

pytestmark = [pytest.mark.rig, pytest.mark.timeout(180)]


async def read_jsonl(ssh: SshHost, path: str) -> list[dict]:
    text = await sh(ssh, 'cat "$1"', path)
    assert text == "" or text.endswith("\n"), f"{path} ends with a torn line"
    return [json.loads(line) for line in text.splitlines()]


async def unit_state(ssh: SshHost, unit: str) -> dict[str, str]:
    res = await ssh.run(["systemctl", "show", unit, "-p", "LoadState,ActiveState,SubState"], timeout=30)
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)


async def test_run_generate_wait_in_a_transient_unit(systemd_rig, rig_ssh, tmp_path):
    unit, profile_path, _ = await standin_with_dataset(rig_ssh, systemd_rig, tmp_path, rows=40,
                                                       latency=1.0)  # long enough to be seen active
    run_id = f"rig-{uuid.uuid4().hex[:8]}"
    stage_unit = f"e3-generate-{run_id}"
    run_dir = f"{unit.work_dir}/runs/{run_id}"
    try:
        seen_states: list[dict[str, str]] = []

        async def watch() -> None:  # the unit is collected once it exits: look while it runs
            while True:
                seen_states.append(await unit_state(rig_ssh, stage_unit))
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch())
        try:
            done = await asyncio.to_thread(subprocess.run, [
                *CLI, "run", "generate", "--profile", str(profile_path), "--limit", "30", "--run-id", run_id,
                "--wait", "--interval", "0.5"], capture_output=True, text=True, timeout=150, cwd=REPO)
        finally:
            watcher.cancel()
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert f"started {stage_unit}" in done.stdout and "done: 30/30 records, 0 failed" in done.stdout, done.stdout
        start_cmd = next(line for line in done.stderr.splitlines() if "systemd-run" in line)
        assert f"--unit={stage_unit}" in start_cmd and "--collect" in start_cmd
        assert any(s.get("ActiveState") == "active" for s in seen_states), seen_states
        # --collect: gone once it exited; its journal stays
        assert (await unit_state(rig_ssh, stage_unit)).get("LoadState") == "not-found"
        journal = await sh(rig_ssh, 'journalctl -u "$1" -o cat --no-pager', stage_unit)
        assert "generate: completed: 30 done, 0 failed" in journal, journal

        recs = await read_jsonl(rig_ssh, f"{run_dir}/output.jsonl")
        assert len(recs) == 30 and len({r["id"] for r in recs}) == 30
        assert sorted(r["index"] for r in recs) == list(range(30))
        for r in recs:
            turn = r["conversations"][-1]
            assert r["reasoning_captured"] and turn["reasoning_content"]
            assert model_turn(r) == f"<think>{turn['reasoning_content']}</think>{turn['content']}"
        finish = (await events_of(rig_ssh, run_dir))[-1]
        assert finish["kind"] == "finish" and finish["status"] == "completed", finish
    finally:
        await rig_ssh.run(["systemctl", "stop", stage_unit], timeout=60)
        await stop_unit(rig_ssh, unit)


async def test_stop_is_graceful_and_the_same_run_id_resumes(systemd_rig, rig_ssh, tmp_path):
    # 1 s per request at concurrency 2: 40 samples take ~20 s, so the stop lands mid-run even on a
    # loaded machine (a status command in between takes a few seconds there)
    unit, profile_path, _ = await standin_with_dataset(rig_ssh, systemd_rig, tmp_path, rows=40, latency=1.0,
                                                       concurrency=2)
    profile = load_profile(profile_path)
    run_id = f"rig-{uuid.uuid4().hex[:8]}"
    host = SshHost(systemd_rig.host, port=systemd_rig.port, username=systemd_rig.username,
                   identity_file=systemd_rig.identity_file, known_hosts=systemd_rig.known_hosts)
    await host.connect()
    launch = None
    try:
        launch = await launch_stage(host, profile, StageRequest("generate", run_id=run_id))
        assert launch.unit == f"e3-generate-{run_id}"

        async def progressed():
            evs = await events_of(rig_ssh, launch.run_dir)
            return [e for e in evs if e.get("kind") == "progress" and e.get("done", 0) > 0]

        await wait_for(progressed, "a progress event with durable records", timeout=60)
        # a console started now (a new process, a new SSH connection) finds the run and reattaches
        status = await asyncio.to_thread(subprocess.run, CLI + ["status", "--profile", str(profile_path), "--json"],
                                         capture_output=True, text=True, timeout=120, cwd=REPO)
        found = [r for r in json.loads(status.stdout)["runs"] if r["run_id"] == run_id]
        assert found and found[0]["state"] == "running" and found[0]["unit"] == launch.unit, status.stdout
        assert found[0]["done"] > 0 and found[0]["total"] == 40
        shown = await stop_stage_unit(host, profile, launch.unit)  # what `x` runs
        assert shown == [shlex.join(["systemctl", "stop", launch.unit])]

        evs = await events_of(rig_ssh, launch.run_dir)
        finish = evs[-1]
        assert finish["kind"] == "finish" and finish["status"] == "stopped", finish
        assert any(e["kind"] == "error" and "SIGTERM" in e.get("message", "") for e in evs)
        first = await read_jsonl(rig_ssh, f"{launch.run_dir}/output.jsonl")  # intact: every line parses
        assert 0 < len(first) < 40 and finish["summary"]["done"] == len(first)
        assert len({r["id"] for r in first}) == len(first)

        before = len(evs)
        again = await launch_stage(host, profile, StageRequest("generate", run_id=run_id))  # same id, no --fresh: resume
        assert again.run_dir == launch.run_dir

        async def finished():
            new = (await events_of(rig_ssh, launch.run_dir))[before:]
            return next((e for e in new if e["kind"] == "finish"), None)

        try:
            last = await wait_for(finished, "the resumed run's finish event", timeout=90)
        except AssertionError:
            journal = await sh(rig_ssh, 'journalctl -u "$1" -o cat --no-pager | tail -n 30', launch.unit)
            tail = (await events_of(rig_ssh, launch.run_dir))[before:][-5:]
            raise AssertionError(f"no finish event from the resumed run; events {tail}; journal:\n{journal}")
        assert last["status"] == "completed", last
        starts = [e for e in await events_of(rig_ssh, launch.run_dir) if e["kind"] == "start"]
        assert starts[-1]["resumed"] and starts[-1]["already_done"] == len(first)
        recs = await read_jsonl(rig_ssh, f"{launch.run_dir}/output.jsonl")
        assert len(recs) == 40 and len({r["id"] for r in recs}) == 40
        assert recs[:len(first)] == first  # the stopped run's records are kept as they were
    finally:
        if launch is not None:
            await rig_ssh.run(["systemctl", "stop", launch.unit], timeout=60)
        await host.close()
        await stop_unit(rig_ssh, unit)
