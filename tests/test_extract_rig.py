"""The extraction swap on a booted systemd host (the rig): the baseline is a real unit, the extract stage runs
as a transient unit (as the console starts it), and the swap plan built from the profile stops the baseline
with systemctl, runs the extraction stand-in as its own transient unit (`<unit>-extract`, systemd-run
--collect), and starts the baseline again.

The rig sees the repository and this interpreter at their own paths; the tiny verifier and the prepared
runs are copied in (the rig's /tmp is its own)."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import shlex
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from console.control.extraction import build_plan, extractor_unit
from console.control.units import stage_start_argv
from console.host.ssh import SshHost
from console.profile import profile_from_dict
from harness.drafter_support import PREPARED_ROWS, REPO, prepared_work, tiny_verifier
from harness.rig import keys

pytestmark = [pytest.mark.rig, pytest.mark.timeout(300)]

AUX = [1, 2, 3]


def tarball(entries: dict[str, Path], rewrite: tuple[str, str]) -> bytes:
    """A tar.gz of directories under new names; summary.json paths rewritten to where they land."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, src in entries.items():
            for path in sorted(src.rglob("*")):
                if not path.is_file():
                    continue
                data = path.read_bytes()
                if path.name == "summary.json":
                    data = data.replace(rewrite[0].encode(), rewrite[1].encode())
                info = tarfile.TarInfo(f"{name}/{path.relative_to(src)}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def sh(ssh: SshHost, script: str, *args: str, input: str | None = None, timeout: float = 60) -> str:
    res = await ssh.run(["sh", "-c", script, "sh", *args], input=input, timeout=timeout)
    assert res.ok, f"{script} {args}: exit {res.returncode}: {res.stderr}"
    return res.stdout


async def active_state(ssh: SshHost, unit: str) -> str:
    res = await ssh.run(["systemctl", "show", unit, "-p", "ActiveState", "--value"], timeout=30)
    return res.stdout.strip()


async def test_the_swap_runs_with_real_units(systemd_rig, rig_ssh, tmp_path_factory):
    tiny = tiny_verifier(tmp_path_factory)
    work = prepared_work(tmp_path_factory, tiny)
    name = f"e3xr-{uuid.uuid4().hex[:6]}"
    rig_work = f"/root/e3rig/{name}"
    xdg = f"{rig_work}/xdg"
    verifier = f"{xdg}/eagle3-console/tiny-verifier/{tiny.name}"  # where the stand-in's tinylm finds it
    bundle = tarball({f"xdg/eagle3-console/tiny-verifier/{tiny.name}": tiny, "runs/gen": work / "runs/gen",
                      "runs/prep": work / "runs/prep"}, (str(work) + "/", rig_work + "/"))
    await sh(rig_ssh, 'mkdir -p "$1" && base64 -d | tar -xzf - -C "$1"', rig_work,
             input=base64.b64encode(bundle).decode())
    port = keys.free_port()
    command = ["env", f"PYTHONPATH={REPO}", f"XDG_CACHE_HOME={xdg}", "HF_HUB_OFFLINE=1", sys.executable, "-m",
               "sim.vllm_server", "--host", "127.0.0.1", "--port", str(port), "--model", "/shared/tiny",
               "--served-model-name", "tiny", "--load-seconds", "0.2", "--shards", "2", "--text-backend", "tinylm",
               "--stats-interval", "60"]
    unit_file = "\n".join(["[Unit]", f"Description=baseline stand-in {name}", "", "[Service]", "Type=simple",
                           f"ExecStart={shlex.join(command)}", "Restart=no", "TimeoutStopSec=20", ""])
    await sh(rig_ssh, 'cat > "$1" && systemctl daemon-reload && systemctl start "$2"',
             f"/etc/systemd/system/{name}.service", name, input=unit_file)
    profile = profile_from_dict({
        "host": {"name": "127.0.0.1"}, "paths": {"work_dir": rig_work, "python": sys.executable},
        "server": {"manager": "systemd", "unit": name, "model_path": "/shared/tiny", "served_model_name": "tiny",
                   "port": port, "command": command, "stop_timeout_s": 20.0, "load_timeout_s": 120.0},
        "drafter": {"verifier": verifier, "aux_layer_ids": AUX}})
    run_id = "ex-rig"
    plan = build_plan(profile, run_id, AUX, 4)  # the tiny verifier has 4 layers: the server is asked for AUX + [4]
    switch = plan["switch"]
    assert switch["away"][0]["start"][0] == "systemd-run" and switch["home"]["stop"] == ["systemctl", "stop", name]
    plan_file = f"{rig_work}/plans/{run_id}.extract.json"
    await sh(rig_ssh, 'mkdir -p "$(dirname "$1")" && cat > "$1"', plan_file, input=json.dumps(plan))
    stage = f"e3-extract-{run_id}-{name}"
    argv = [sys.executable, "-m", "backend.extract", "--work-dir", rig_work, "--run-id", run_id, "--input-run",
            "prep", "--verifier", verifier, "--aux-layer-ids", "1,2,3", "--plan", plan_file, "--concurrency", "4",
            "--health-interval", "0.5"]
    extractor = extractor_unit(profile)
    try:
        start = stage_start_argv(profile, stage, argv, log_path="", cwd=rig_work,
                                 env={"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
        await rig_ssh.run(start, check=True, timeout=60)
        seen: set[tuple[str, str]] = set()
        summary_path = f"{rig_work}/runs/{run_id}/summary.json"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # the stage runs detached: watch the units while it does
            seen.add(("baseline", await active_state(rig_ssh, name)))
            seen.add(("extractor", await active_state(rig_ssh, extractor)))
            if (await rig_ssh.run(["test", "-f", summary_path], timeout=30)).ok \
                    and await active_state(rig_ssh, stage) in ("inactive", "failed", ""):
                break
            await asyncio.sleep(0.5)
        summary = json.loads(await sh(rig_ssh, 'cat "$1"', summary_path))
        journal = await sh(rig_ssh, 'journalctl -u "$1" -o cat --no-pager', stage)
        assert summary["status"] == "completed", (summary, journal)
        assert [(s["step"], s["ok"]) for s in summary["swap"]["steps"]] == [
            ("stop_baseline", True), ("start_extractor", True), ("stop_extractor", True), ("start_baseline", True)]
        assert summary["done"] == PREPARED_ROWS
        assert ("extractor", "active") in seen and ("baseline", "inactive") in seen  # the swap happened
        counts = await sh(rig_ssh, 'ls "$1/train_hidden_states" | wc -l; ls "$1/heldout_hidden_states" | wc -l',
                          f"{rig_work}/runs/{run_id}")
        assert [int(n) for n in counts.split()] == [20, 4]
        # afterwards: the baseline unit runs again, the transient extraction unit is gone (collected), and
        # its journal shows the extraction server it was
        assert await active_state(rig_ssh, name) in ("active", "activating")
        assert (await rig_ssh.run(["systemctl", "show", extractor, "-p", "LoadState", "--value"],
                                  timeout=30)).stdout.strip() == "not-found"
        extractor_log = await sh(rig_ssh, 'journalctl -u "$1" -o cat --no-pager', extractor)
        assert f"Shared storage path is {rig_work}/extract-staging/{run_id}" in extractor_log
        assert "extract ex-rig: completed (24 of 24 rows" in journal
    finally:
        await rig_ssh.run(["systemctl", "stop", stage, extractor, name], timeout=90)
