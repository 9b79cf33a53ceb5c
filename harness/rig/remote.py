"""What the rig tests do on the booted systemd rig over SSH (harness/rig/systemd_host.py): shell steps, the
stand-in's health, a started stand-in unit with a dataset, a run's events, a completed verify run put in
place; and the console's CLI as the operator runs it on this machine."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from backend.contract.events import EventLog
from backend.contract.runs import Manifest, open_run_dir
from console.host.ssh import SshHost
from console.profile import load_profile
from harness.polling import until
from harness.rig.sim_unit import REPO, RigUnit, install_unit

CLI = [sys.executable, "-m", "console.cli"]


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


async def sh(ssh: SshHost, script: str, *args: str, input: str | None = None, timeout: float = 30) -> str:
    res = await ssh.run(["sh", "-c", script, "sh", *args], input=input, timeout=timeout)
    assert res.ok, f"{script} {args}: exit {res.returncode}: {res.stderr}"
    return res.stdout


async def standin_with_dataset(ssh: SshHost, rig, tmp_path: Path, *, rows: int, latency: float = 0.0,
                               concurrency: int = 8) -> tuple[RigUnit, Path, str]:
    """A started, ready stand-in unit, a ShareGPT dataset on the rig, and a profile for both."""
    unit = await install_unit(ssh, rig, tmp_path, load_seconds=0.5,
                              extra=["--response-tokens", "40", "--latency", str(latency)])
    dataset = f"{unit.work_dir}/prompts.jsonl"
    lines = "".join(json.dumps({"conversations": [{"from": "human", "value": f"Question {i}: explain topic {i}."},
                                                  {"from": "gpt", "value": "the dataset's own answer"}]}) + "\n"
                    for i in range(rows))
    await sh(ssh, 'cat > "$1"', dataset, input=lines)
    # The stage must run with the interpreter that has its modules (bind-mounted at the same path).
    text = unit.profile_path.read_text().replace(
        f'[paths]\nwork_dir = "{unit.work_dir}"',
        f'[paths]\nwork_dir = "{unit.work_dir}"\npython = "{sys.executable}"')
    text += "\n".join(["", "[generate]", f'dataset = "{dataset}"', f"samples = {rows}",
                       f"concurrency = {concurrency}", "max_tokens = 256", "request_timeout_s = 60.0",
                       'return_token_ids = "auto"', "max_retries = 2", ""])
    unit.profile_path.write_text(text)
    assert load_profile(unit.profile_path).paths.python == sys.executable
    await ssh.run(["systemctl", "start", unit.name], check=True, timeout=30)
    await wait_health(ssh, unit.port)
    return unit, unit.profile_path, dataset


async def wait_health(ssh: SshHost, port: int, timeout: float = 30.0) -> None:
    probe = [sys.executable, "-c", "import sys, urllib.request; "
             "sys.exit(urllib.request.urlopen(sys.argv[1], timeout=2).status != 200)",
             f"http://127.0.0.1:{port}/health"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await ssh.run(probe, timeout=10)).ok:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the stand-in on port {port} did not become ready in {timeout:.0f} s")


async def events_of(ssh: SshHost, run_dir: str) -> list[dict]:
    res = await ssh.run(["cat", f"{run_dir}/events.jsonl"], timeout=30)
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()] if res.ok else []


async def wait_for(predicate, what: str, timeout: float = 60.0, interval: float = 0.3):
    return await until(predicate, what, timeout=timeout, interval=interval)


async def put_verify_run(ssh, tmp_path: Path, work_dir: str, checkpoint: str) -> None:
    """A completed verify run of `checkpoint` in the rig's work dir: made here, its files copied there."""
    local = tmp_path / "runs-src"
    run = open_run_dir(str(local), "verify-rig", Manifest(stage="verify", run_id="verify-rig", identity={}))
    events = EventLog(run.events_path, "verify", "verify-rig")
    events.emit("start", total=1, manifest=run.manifest.to_dict())
    summary = {"stage": "verify", "run_id": "verify-rig", "ok": True, "outputs": {"checkpoint": checkpoint}}
    run.write_summary(summary)
    events.emit("finish", status="completed", summary=summary)
    events.close()
    target = f"{work_dir}/runs/verify-rig"
    await sh(ssh, 'mkdir -p "$1" "$2"', target, checkpoint)
    for f in sorted(Path(run.path).iterdir()):
        await sh(ssh, 'cat > "$1"', f"{target}/{f.name}", input=f.read_text())
