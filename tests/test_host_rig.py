"""SshHost against the booted systemd rig: units, transient units, the journal followed live."""
from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from contextlib import aclosing

import pytest

from console.host.ssh import SshHost
from harness.sim_support import PYTHON

pytestmark = [pytest.mark.rig, pytest.mark.timeout(120)]


@pytest.fixture
async def rig_host(systemd_rig):
    host = SshHost(systemd_rig.host, port=systemd_rig.port, username=systemd_rig.username,
                   identity_file=systemd_rig.identity_file, known_hosts=systemd_rig.known_hosts)
    yield host
    await host.close()


def parse_show(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def journal_message(entry: dict) -> str:
    # journalctl writes a field that is not printable UTF-8 as an array of byte values.
    msg = entry.get("MESSAGE")
    return bytes(msg).decode("utf-8", "replace") if isinstance(msg, list) else str(msg)


async def test_systemctl_show_a_unit(rig_host):
    res = await rig_host.run(["systemctl", "show", "ssh.service", "-p", "ActiveState,SubState,LoadState"],
                             check=True)
    assert parse_show(res.stdout) == {"ActiveState": "active", "SubState": "running", "LoadState": "loaded"}
    res = await rig_host.run(["systemctl", "is-system-running"])
    assert res.stdout.strip() in ("running", "degraded")


async def test_project_python_runs_inside_the_rig(rig_host):
    res = await rig_host.run([*PYTHON, "-c", "import console.host.base, sys; print(sys.version_info[:2])"],
                             check=True)
    assert res.stdout.strip() == str(tuple(sys.version_info[:2]))


async def test_transient_unit_and_journal_followed_live(rig_host):
    unit = f"e3test-{uuid.uuid4().hex[:8]}"
    script = ("for i in 1 2 3 4 5; do echo tick $i; sleep 0.4; done; "
              "printf 'bar 10%%\\rbar 20%%\\n'; sleep 0.5")
    res = await rig_host.run(["systemd-run", f"--unit={unit}", "--collect", "--quiet",
                              "sh", "-c", script], check=True)
    assert res.ok
    show = parse_show((await rig_host.run(["systemctl", "show", f"{unit}.service", "-p",
                                           "ActiveState,SubState"], check=True)).stdout)
    assert show["ActiveState"] in ("active", "activating")

    arrivals: list[tuple[float, str]] = []
    active_during_stream = None
    stream = rig_host.stream(["journalctl", "-u", f"{unit}.service", "-o", "json", "-a", "-f",
                              "--no-pager", "-n", "all"])
    async with aclosing(stream) as lines:
        async def collect():
            nonlocal active_during_stream
            async for line in lines:
                entry = json.loads(line)
                if entry.get("_TRANSPORT") != "stdout":
                    continue  # systemd's own "Started ..." lines
                msg = journal_message(entry)
                arrivals.append((time.monotonic(), msg))
                if msg == "tick 2" and active_during_stream is None:
                    state = await rig_host.run(["systemctl", "show", f"{unit}.service", "-p",
                                                "ActiveState", "--value"])
                    active_during_stream = state.stdout.strip()
                if msg.startswith("bar"):
                    return
        await asyncio.wait_for(collect(), 30)

    messages = [m for _, m in arrivals]
    assert messages == ["tick 1", "tick 2", "tick 3", "tick 4", "tick 5", "bar 10%\rbar 20%"]
    # Live, not a batch at the end: the unit was still running mid-stream and lines came spread out.
    assert active_during_stream == "active"
    assert arrivals[-1][0] - arrivals[1][0] > 0.8

    for _ in range(50):  # --collect: the finished unit is garbage-collected
        gone = parse_show((await rig_host.run(["systemctl", "show", f"{unit}.service", "-p",
                                               "LoadState"])).stdout)
        if gone.get("LoadState") == "not-found":
            break
        await asyncio.sleep(0.1)
    assert gone.get("LoadState") == "not-found"
