"""Telemetry on a local host: the SIMULATED demo profile (tmux manager, the stand-in's log file), stage
run directories in `status --json`, and the GPU table through the probe on varied nvidia-smi outputs.

The demo's tmux server is private to the test's work dir; `demo.stop` ends every process it started.
"""
from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from backend.contract.events import EventLog
from console.snapshot import LOAD_ORDER as SNAPSHOT_LOAD_ORDER
from console.profile import profile_from_dict
from console import demo
from console.session import Session
from console.telemetry.collector import Collector
from console.commands.server_cmd import watch_key, server_action
from console.host.factory import host_for_profile
from console.host.local import LocalHost
from console.control.units import tmux_start_argv
from harness.sim_support import PYTHON, first_listen

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "tests" / "samples" / "nvidia_smi"
LOAD_ORDER = list(SNAPSHOT_LOAD_ORDER)


def in_order(seq: list[str]) -> bool:
    ranks = [LOAD_ORDER.index(p) for p in seq if p in LOAD_ORDER]
    return ranks == sorted(ranks)


def dedup(seq: list[str]) -> list[str]:
    return [p for i, p in enumerate(seq) if i == 0 or seq[i - 1] != p]


@pytest.fixture
async def demo_host(tmp_path):
    work = tmp_path / "d"  # short: tmux's socket path must stay under 108 bytes
    yield work
    await demo.stop(work)


class LineReader:
    """Read a subprocess's stdout lines on a thread, so the test can wait with a deadline."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._run, args=(proc,), daemon=True)
        self._thread.start()

    def _run(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)


async def test_demo_load_live_shards_phases_and_watch(demo_host):
    profile = demo.prepare(demo_host, speed=5)  # a 4 s load
    watch = subprocess.Popen([sys.executable, "-m", "console.cli", "status", "--profile", profile.source,
                              "--watch", "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, cwd=REPO)
    try:
        reader = LineReader(watch)
        collector = Collector(profile, host_for_profile(profile))
        await collector.connect()
        rc, shown, out = await server_action(profile, "start-server")
        assert rc == 0, out
        assert shown[0].startswith("tmux start session ")
        snaps = []
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            snap = await collector.refresh()
            snaps.append(snap)
            if snap.server.phase in ("ready", "failed"):
                break
            await asyncio.sleep(0.1)
        await collector.close()
        phases = dedup([s.server.phase for s in snaps])
        assert phases[-1] == "ready" and in_order(phases), phases
        assert "loading_weights" in phases
        # the log file brings tqdm's '\r' redraws as written: the shard counter moves live
        loading = [s.server for s in snaps if s.server.phase == "loading_weights" and s.server.progress]
        assert loading and all(s.eta_source == "shards" for s in loading)
        done = [s.progress.done for s in loading]
        assert done == sorted(done) and any(0 < d < 64 for d in done), done
        assert all(s.progress.total == 64 for s in loading)
        assert any(s.eta_s is not None and s.eta_s > 0 for s in loading)
        assert all(0 <= s.fraction <= 1 for s in loading)
        final = snaps[-1]
        assert (final.server.progress.done, final.server.progress.total) == (64, 64)
        assert final.server.model_id == profile.server.model_id and final.server.error is None
        assert final.service.manager == "tmux" and final.service.active_state == "active"
        assert len(final.gpus) == 8 and final.gpu_error is None and final.host.simulated

        # status --watch: one JSON line per change, in load order, ending at ready
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any(json.loads(l)["server"]["phase"] == "ready" for l in reader.lines):
                break
            await asyncio.sleep(0.1)
        docs = [json.loads(l) for l in reader.lines]
        watched = [d["server"]["phase"] for d in docs]
        assert "ready" in watched and in_order(dedup(watched)), watched
        assert len(docs) >= 3
        stable = [watch_key(d) for d in docs]
        assert all(a != b for a, b in zip(stable, stable[1:]))  # a line only when something changed
    finally:
        watch.kill()
        watch.wait(timeout=10)
    stop = await server_action(profile, "stop-server")
    assert stop[0] == 0
    collector = Collector(profile, host_for_profile(profile))
    await collector.connect()
    snap = await collector.refresh()
    assert snap.server.phase == "stopped" and snap.service.active_state == "inactive"


async def test_stage_runs_in_status_json(demo_host):
    profile = demo.prepare(demo_host)
    runs = demo_host.resolve() / "runs"

    def write_run(run_id: str, *, finish: str | None) -> None:
        (runs / run_id).mkdir(parents=True)
        log = EventLog(str(runs / run_id / "events.jsonl"), "generate", run_id)
        log.emit("start", total=100, manifest={})
        log.emit("progress", done=40, total=100, failed=2, rate=3.5, eta_s=17.0)
        if finish:
            log.emit("progress", done=100, total=100, failed=2, rate=3.5, eta_s=0.0)
            log.emit("finish", status=finish, summary={})
        log.close()

    write_run("r-done", finish="completed")
    write_run("r-live", finish=None)
    write_run("r-dead", finish=None)
    write_run("r-failed", finish="failed")
    # r-live's stage still runs in its tmux session; r-dead's is gone (killed, or the host rebooted)
    start = demo.env_prefix(profile.paths.work_dir) + tmux_start_argv(
        "e3-generate-r-live", ["sleep", "60"], f"{profile.paths.work_dir}/logs/r-live.log")
    res = await LocalHost().run(start)
    assert res.ok, res.stderr

    out = subprocess.run([sys.executable, "-m", "console.cli", "status", "--profile", profile.source, "--json"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    got = {r["run_id"]: r for r in status["runs"]}
    assert {k: v["state"] for k, v in got.items()} == {
        "r-done": "done", "r-live": "running", "r-dead": "stale", "r-failed": "failed"}
    assert (got["r-live"]["done"], got["r-live"]["total"], got["r-live"]["failed"]) == (40, 100, 2)
    assert got["r-live"]["rate"] == 3.5 and got["r-live"]["unit"] == "e3-generate-r-live"
    assert got["r-done"]["done"] == 100 and got["r-done"]["last_event"]["kind"] == "finish"
    assert status["server"]["phase"] == "stopped"  # the demo server was never started
    human = subprocess.run([sys.executable, "-m", "console.cli", "status", "--profile", profile.source],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "SIMULATED" in human.stdout and "run      generate r-live: running 40/100, 2 failed" in human.stdout


# -- GPU table through the probe --------------------------------------------------------------------

def gpu_profile(tmp_path: Path, command: list[str]):
    return profile_from_dict({
        "host": {"name": "gpu-host.example", "transport": "local"},
        "server": {"model_path": "/m", "manager": "tmux", "unit": "e3-no-such-session", "port": 1},
        "paths": {"work_dir": str(tmp_path)},
        "gpus": {"command": command},
    })


async def probe_gpus(tmp_path: Path, command: list[str]):
    collector = Collector(gpu_profile(tmp_path, command), LocalHost())
    await collector.connect()
    return await collector.refresh()


def shell(script: str) -> list[str]:
    return ["sh", "-c", script]


async def test_gpus_h200_rows(tmp_path):
    snap = await probe_gpus(tmp_path, ["cat", str(SAMPLES / "h200x8.csv")])
    assert snap.gpu_error is None and len(snap.gpus) == 8
    assert (snap.gpus[0].name, snap.gpus[0].memory_used_mib, snap.gpus[0].power_w) == ("NVIDIA H200", 130512, 612.45)


async def test_gpus_not_available_and_not_supported(tmp_path):
    snap = await probe_gpus(tmp_path, ["cat", str(SAMPLES / "odd_values.csv")])
    assert snap.gpu_error is None
    g0, g1, g2 = snap.gpus
    assert g0.name == "NVIDIA GeForce RTX 4090" and g0.power_w is None and g0.utilization_pct == 100
    assert (g1.utilization_pct, g1.temperature_c, g1.power_w) == (None, None, None)
    assert g2.name == "Quadro RTX 8000, Rev A" and g2.memory_total_mib == 46080  # a comma in the name


async def test_gpus_mig_parent_rows(tmp_path):
    snap = await probe_gpus(tmp_path, ["cat", str(SAMPLES / "mig_parent.csv")])
    assert snap.gpu_error is None and [g.index for g in snap.gpus] == [0, 1]
    assert snap.gpus[0].memory_used_mib is None and snap.gpus[0].utilization_pct is None
    assert snap.gpus[0].memory_total_mib == 81920 and snap.gpus[1].memory_used_mib == 4


async def test_gpus_simulated_tool_with_state(tmp_path):
    cmd = [*PYTHON, "-m", "sim.nvidia_smi", "--state", str(tmp_path / "none.json"),
           "--query-gpu=index,name,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw",
           "--format=csv,noheader,nounits"]
    snap = await probe_gpus(tmp_path, ["env", f"PYTHONPATH={REPO}", *cmd])
    assert snap.gpu_error is None and len(snap.gpus) == 8 and snap.gpus[7].memory_total_mib == 143771


async def test_gpus_no_driver(tmp_path):
    snap = await probe_gpus(tmp_path, ["env", f"PYTHONPATH={REPO}", sys.executable, "-m", "sim.nvidia_smi",
                                       "--simulate-no-driver"])
    assert snap.gpus == () and "cannot talk to the NVIDIA driver" in snap.gpu_error
    assert snap.host.reachable  # a GPU problem is not a host problem


async def test_gpus_driver_mismatch_and_no_devices(tmp_path):
    snap = await probe_gpus(tmp_path, shell(f"cat {shlex.quote(str(SAMPLES / 'mismatch.txt'))}; exit 18"))
    assert snap.gpus == () and "version mismatch" in snap.gpu_error
    snap = await probe_gpus(tmp_path, shell(f"cat {shlex.quote(str(SAMPLES / 'no_devices.txt'))}; exit 6"))
    assert snap.gpus == () and "found no NVIDIA GPU" in snap.gpu_error


async def test_gpus_command_missing(tmp_path):
    snap = await probe_gpus(tmp_path, ["nvidia-smi-e3-not-installed", "--query-gpu=index"])
    assert snap.gpus == () and "not found on the host" in snap.gpu_error
    assert snap.host.reachable and snap.service.active_state == "inactive"


async def test_ready_line_is_checked_at_once_not_at_the_next_tick(demo_host):
    """With a 5 s interval, polling alone would say ready 2.5 s (on average) after the server listens;
    the ready line in the server's log makes the session ask /health and /v1/models at once."""
    profile = demo.prepare(demo_host, speed=5)  # a 4 s load
    listened: list[float] = []
    stop = threading.Event()

    async with Session(profile, interval=5.0) as session:
        snaps = session.snapshots(connecting=False)
        first = await snaps.__anext__()
        assert first.server.phase == "stopped"
        rc, _, out = await server_action(profile, "start-server")
        assert rc == 0, out
        threading.Thread(target=first_listen, args=(profile.server.port, stop, listened), daemon=True).start()
        try:
            ready_at = None
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                snap = await asyncio.wait_for(snaps.__anext__(), 20)
                if snap.server.phase == "ready":
                    ready_at = time.monotonic()
                    break
        finally:
            stop.set()
            await snaps.aclose()
    assert ready_at is not None and listened
    delay = ready_at - listened[0]
    assert delay < 1.0, f"ready {delay:.2f} s after the server listened (interval 5 s)"
    assert snap.server.model_id == profile.server.model_id


async def test_ready_is_said_while_a_probe_is_still_under_way(demo_host):
    """A probe costs a round trip and the host's own time (100-500 ms over SSH); here every probe hangs
    once one has seen the server running (its GPU query waits on a gate file): the server log's API-start
    lines make the session ask beside it, so ready comes within moments of the server listening, not
    when the probe ends. The log does not exist when its `tail -F` starts (GNU tail then polls: -s)."""
    profile = demo.prepare(demo_host, speed=5)  # a 4 s load
    gate = demo_host / "gate"
    profile.gpus.command = ["sh", "-c", 'while [ -e "$0" ]; do sleep 0.05; done; exec "$@"', str(gate),
                            *profile.gpus.command]
    stop, listened = threading.Event(), []
    async with Session(profile, interval=0.2, deadline=120) as session:
        snaps = session.snapshots(connecting=False)
        assert (await snaps.__anext__()).server.phase == "stopped"
        rc, _, out = await server_action(profile, "start-server")
        assert rc == 0, out
        threading.Thread(target=first_listen, args=(profile.server.port, stop, listened), daemon=True).start()
        try:
            snap = await asyncio.wait_for(snaps.__anext__(), 30)
            while snap.service.active_state != "active":
                snap = await asyncio.wait_for(snaps.__anext__(), 30)
            assert snap.server.phase not in ("ready", "failed"), snap.server
            gate.touch()
            while snap.server.phase != "ready":
                snap = await asyncio.wait_for(snaps.__anext__(), 30)
            ready_at = time.monotonic()
            assert gate.exists() and session._refresh is not None  # the probe is still hanging
            gate.unlink()
            after = [await asyncio.wait_for(snaps.__anext__(), 30) for _ in range(3)]
        finally:
            stop.set()
            await snaps.aclose()
    assert listened and ready_at - listened[0] < 0.6, f"ready {ready_at - listened[0]:.2f} s after the server listened"
    assert snap.server.model_id == profile.server.model_id
    assert [s.server.phase for s in after] == ["ready"] * 3  # the probe that hung did not take it back


async def test_a_probe_asked_before_the_ready_ask_never_takes_ready_back(tmp_path, answering):
    """The probe's "not listening" was asked when it started; a ready ask that asked later found the port
    answering. Whichever answer comes last, the newer question's stands (the probe here is held until
    the ask has answered: its timing is the one thing a real host cannot be made to repeat)."""
    profile = demo.prepare(tmp_path / "d")
    profile.server.port = int(answering.rsplit(":", 1)[1])
    collector = Collector(profile, host_for_profile(profile))
    collector.service = replace(collector.service, active_state="active", sub_state="running")
    held = asyncio.Event()

    async def probe_answering_late() -> float:
        collector.port_listening = False  # what its listen check saw, before the server listened
        await held.wait()
        return 0.01

    collector._probe = probe_answering_late
    refresh = asyncio.create_task(collector.refresh())
    try:
        await asyncio.sleep(0.05)
        assert await collector.ask_ready()
        held.set()
        snap = await asyncio.wait_for(refresh, 10)
    finally:
        await collector.close()
    assert collector.http.listening and snap.server.model_id == "tiny", (collector.http, snap.server)
