"""Stage arguments on the booted systemd rig (Debian bookworm, systemd 252): a `$` reaches the program
literally although systemd expands environment variables in a transient unit's command line; a relative
`--dataset` on an SSH host means `[paths].data_dir`; a stage that dies before its first event is
reported at once with its last lines."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import pytest

from console.control.launch import stage_ended, systemd_run_expands
from console.control.units import stage_start_argv
from console.profile import load_profile
from harness.rig.remote import CLI, events_of, sh, standin_with_dataset, wait_for
from harness.rig.sim_unit import REPO, stop_unit

pytestmark = [pytest.mark.rig, pytest.mark.timeout(180)]

LITERAL = ["$HOME", "${HOME}", "a$HOME", "$$", "$", "%n", '{"note":"${USER} costs $5"}']


async def journal_of(ssh, unit: str) -> str:
    return await sh(ssh, 'journalctl -u "$1" -o cat --no-pager', unit)


async def test_dollar_arguments_reach_the_program_literally(systemd_rig, rig_ssh, tmp_path):
    unit, profile_path, _ = await standin_with_dataset(rig_ssh, systemd_rig, tmp_path, rows=1)
    await stop_unit(rig_ssh, unit)
    profile = load_profile(profile_path)
    expands = await systemd_run_expands(rig_ssh)
    assert expands is False  # 252 has no --expand-environment: the escaping path is the one tested
    name = f"e3-args-{uuid.uuid4().hex[:8]}"
    prog = [sys.executable, "-c", "import json, sys; print('ARGV ' + json.dumps(sys.argv[1:]), flush=True)", *LITERAL]
    argv = stage_start_argv(profile, name, prog, log_path="/unused", cwd=unit.work_dir, env={"E3": "x"},
                            no_expand_option=expands)
    res = await rig_ssh.run(argv, timeout=60)
    assert res.ok, res.stderr

    async def printed():
        lines = [l for l in (await journal_of(rig_ssh, name)).splitlines() if l.startswith("ARGV ")]
        return lines[-1] if lines else None

    line = await wait_for(printed, "the program's output in the journal", timeout=30)
    assert json.loads(line[len("ARGV "):]) == LITERAL


async def test_relative_dataset_and_dollar_values_end_to_end(systemd_rig, rig_ssh, tmp_path):
    """`run generate --dataset NAME` over SSH: NAME is under [paths].data_dir, resolved before the
    preflight, and a `$` in it or in chat_template_kwargs is not rewritten on the way."""
    unit, profile_path, dataset = await standin_with_dataset(rig_ssh, systemd_rig, tmp_path, rows=4)
    name = "prompts $HOME.jsonl"
    await sh(rig_ssh, 'cp "$1" "$2"', dataset, f"{unit.work_dir}/{name}")
    text = profile_path.read_text().replace(f'[paths]\nwork_dir = "{unit.work_dir}"',
                                            f'[paths]\nwork_dir = "{unit.work_dir}"\ndata_dir = "{unit.work_dir}"')
    text += '\n[generate.chat_template_kwargs]\nthinking = true\nnote = "${HOME} $$ $x"\n'
    profile_path.write_text(text)
    run_id = f"rig-{uuid.uuid4().hex[:8]}"
    try:
        done = await asyncio.to_thread(subprocess.run, [
            *CLI, "run", "generate", "--profile", str(profile_path), "--dataset", name, "--run-id", run_id,
            "--wait", "--interval", "0.5"], capture_output=True, text=True, timeout=150, cwd=REPO)
        assert done.returncode == 0, (done.stdout, done.stderr)
        start = (await events_of(rig_ssh, f"{unit.work_dir}/runs/{run_id}"))[0]
        identity = start["manifest"]["identity"]
        assert identity["dataset"] == f"{unit.work_dir}/{name}"
        assert identity["chat_template_kwargs"] == {"thinking": True, "note": "${HOME} $$ $x"}
    finally:
        await rig_ssh.run(["systemctl", "stop", f"e3-generate-{run_id}"], timeout=60)
        await stop_unit(rig_ssh, unit)


async def test_a_stage_that_dies_before_any_event_is_reported_with_its_last_lines(systemd_rig, rig_ssh, tmp_path):
    unit, profile_path, _ = await standin_with_dataset(rig_ssh, systemd_rig, tmp_path, rows=1)
    await stop_unit(rig_ssh, unit)
    profile = load_profile(profile_path)
    name = f"e3-generate-dies-{uuid.uuid4().hex[:8]}"
    prog = ["sh", "-c", "echo 'FileNotFoundError: no such dataset' >&2; exit 3"]
    res = await rig_ssh.run(stage_start_argv(profile, name, prog, log_path="/unused", cwd=unit.work_dir, env={}),
                            timeout=60)
    assert res.ok, res.stderr

    async def ended():
        return await stage_ended(rig_ssh, profile, name)

    how = await wait_for(ended, "the unit to end", timeout=30)
    assert "status=3" in how and "FileNotFoundError: no such dataset" in how  # the journal's own words
