"""The link to the host fails in the ways operators meet: the console says when it is dead, and never
drops a unit's first lines (booted systemd rig, real sshd, a link that swallows packets)."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from console.profile import load_profile
from console.session import Session
from harness.polling import until
from harness.rig import keys
from harness.rig.availability import rig_unavailable
from harness.rig.blackhole import Blackhole
from harness.rig.rootfs import RigUnavailable
from harness.sim_support import PYTHON

pytestmark = [pytest.mark.rig, pytest.mark.timeout(240)]
REPO = Path(__file__).resolve().parents[1]


def profile_text(rig, host: str, port: int, known_hosts: Path, unit: str, work_dir: str) -> str:
    return "\n".join([
        "[host]", f'name = "{host}"', f"port = {port}", f'user = "{rig.username}"',
        f'identity_file = "{rig.identity_file}"', f'known_hosts = "{known_hosts}"', "",
        "[server]", 'manager = "systemd"', f'unit = "{unit}"', 'model_path = "/m"', "port = 8000", "",
        "[paths]", f'work_dir = "{work_dir}"', "",
        "[gpus]", f"command = {json.dumps(['true'])}", "",
    ])


class WatchLines:
    """`status --watch` running inside the namespace; its JSON lines with the time each arrived."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
        self.lines: list[tuple[float, dict]] = []

    async def collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, self.proc.stdout.readline)
            if not line:
                return
            self.lines.append((time.monotonic(), json.loads(line)))

    def since(self, t: float) -> list[dict]:
        return [doc for at, doc in self.lines if at >= t]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


async def test_a_blackholed_link_is_said_within_the_deadline_and_rtt_stays_true(systemd_rig, tmp_path):
    try:
        hole = Blackhole(systemd_rig.port).__enter__()
    except RigUnavailable as exc:
        rig_unavailable(str(exc))
    try:
        port = await hole.relay()
        known = tmp_path / "known_hosts"
        known.write_text(keys.known_hosts_line(hole.host_addr, port, systemd_rig.workdir / "rig_host_key"))
        profile = tmp_path / "p.toml"
        profile.write_text(profile_text(systemd_rig, hole.host_addr, port, known, "e3-none", "/root/e3bh"))
        watch = WatchLines(hole.inside([*PYTHON, "-m", "console.cli", "status", "--profile", str(profile),
                                        "--watch", "--interval", "0.5"]))
        reader = asyncio.create_task(watch.collect())
        try:
            await until(lambda: any(d["host"]["reachable"] for _, d in watch.lines), "a first answer", timeout=60)
            cut_at = time.monotonic()
            hole.cut()
            # the deadline is max(5 s, 3 intervals): a "not answering" line well before 15 s
            first = await until(lambda: next((at for at, d in watch.lines if at > cut_at
                                              and d["host"]["not_answering_since"] is not None), None),
                                "a not-answering snapshot", timeout=20)
            assert first - cut_at < 10.0, first - cut_at
            await asyncio.sleep(15 - (time.monotonic() - cut_at))
            during = watch.since(first)
            assert during and all(not d["host"]["reachable"] for d in during)
            mended_at = time.monotonic()
            hole.mend()
            back = await until(lambda: next((d for d in watch.since(mended_at) if d["host"]["reachable"]), None),
                               "an answer after the outage", timeout=90)
            # the probe's own round trip, never the 15 s and more it spent waiting for the dead link
            assert back["host"]["rtt_ms"] is not None and back["host"]["rtt_ms"] < 5000, back["host"]
        finally:
            watch.stop()
            reader.cancel()
    finally:
        hole.__exit__()


async def test_a_unit_followed_before_its_first_line_delivers_its_whole_first_burst(systemd_rig, rig_ssh, tmp_path):
    """`journalctl -u UNIT -f -n 200` started before UNIT has entries loses the unit's first burst;
    the session's stream starts after the journal's last cursor instead and gets every line."""
    unit = f"e3burst-{uuid.uuid4().hex[:8]}"
    profile = tmp_path / "p.toml"
    profile.write_text(profile_text(systemd_rig, "127.0.0.1", systemd_rig.port, systemd_rig.known_hosts,
                                    "e3-server-none", "/root/e3burst"))
    got: list[str] = []
    async with Session(load_profile(profile), interval=0.5) as session:
        await session.tick()

        async def follow() -> None:
            async for line in session.journal(unit):
                if line.text.startswith("burst "):
                    got.append(line.text)
                    if len(got) == 50:
                        return

        follower = asyncio.create_task(follow())
        await asyncio.sleep(2.0)  # following for a while already, before the unit exists
        script = ("for i in $(seq 1 30); do echo burst $i; done; sleep 1; "
                  "for i in $(seq 31 50); do echo burst $i; done; sleep 1")
        await rig_ssh.run(["systemd-run", f"--unit={unit}", "--quiet", "sh", "-c", script], check=True)
        await asyncio.wait_for(follower, 30)
    assert got == [f"burst {i}" for i in range(1, 51)]
