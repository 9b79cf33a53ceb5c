"""Telemetry end to end in the booted systemd rig: a real unit running the vLLM stand-in, its journal
followed over SSH, the one-command probe, readiness through the forwarded port, and the headless CLI.

Loads are short (3-4 s) so the module stays within a couple of minutes; every unit gets its own name,
port and work dir, so a failure in one test leaves nothing for the next to trip on.
"""
from __future__ import annotations

import asyncio
import json
import shlex
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from console.snapshot import LOAD_ORDER as SNAPSHOT_LOAD_ORDER
from console.profile import load_profile
from console.parsers.vllm_load import LoadTracker
from console.session import Session
from console.telemetry.collector import Collector
from console.commands.server_cmd import server_action
from console.snapshot import PHASES
from harness.rig import keys, procs
from harness.rig.remote import cli
# the unit and profile the rig tests share with benchmarks/bench_readiness.py
from harness.rig.sim_unit import SERVED, WEIGHTS_GIB, RigUnit, install_unit, stop_unit, unit_text, write_profile

pytestmark = [pytest.mark.rig, pytest.mark.timeout(120)]

LOAD_ORDER = list(SNAPSHOT_LOAD_ORDER)


@dataclass
class Observed:
    journal: list[tuple[str, str]] = field(default_factory=list)  # (message, tracker phase after it)
    snaps: list = field(default_factory=list)

    def journal_phases(self) -> list[str]:
        out: list[str] = []
        for _, phase in self.journal:
            if not out or out[-1] != phase:
                out.append(phase)
        return out

    def snap_phases(self) -> list[str]:
        out: list[str] = []
        for s in self.snaps:
            if not out or out[-1] != s.server.phase:
                out.append(s.server.phase)
        return out


async def observe(profile_path: Path, *, until=("ready", "failed"), timeout: float = 30.0,
                  start: bool = True, interval: float = 0.2) -> tuple[Observed, Collector]:
    """Start the unit (through the CLI's own server_action), follow its journal through the session's
    one shared stream and tick the session until the server reaches one of `until`; every journal line
    (with the phase a tracker fed the same lines is in) and every snapshot is kept."""
    profile = load_profile(profile_path)
    session = Session(profile, interval=interval)
    seen = Observed()
    await session.tick()  # connected: the session's journal stream runs from here

    async def follow() -> None:
        tracker = LoadTracker()
        async for line in session.journal(profile.server.unit):
            tracker.feed(line.text, line.ts)
            seen.journal.append((line.text, tracker.phase))

    follower = asyncio.create_task(follow())
    try:
        if start:
            rc, shown, out = await server_action(profile, "start-server")
            assert rc == 0, (shown, out)
            assert shown == [shlex.join(["systemctl", "start", profile.server.unit])]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = await session.tick()
            seen.snaps.append(snap)
            if snap.server.phase in until:
                break
            await asyncio.sleep(interval)
        else:
            raise AssertionError(f"no {until} within {timeout} s: {seen.snap_phases()} / {seen.journal_phases()}")
        # let the stream catch the tail of the journal (the last lines can trail the probe), then
        # refresh once more: that snapshot includes them, and the finished load gets remembered
        for _ in range(50):
            if session.collector.tracker.phase in until or session.collector.tracker.phase == "ready":
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        seen.snaps.append(await session.tick())
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await session.close()
    return seen, session.collector


def in_order(seq: list[str], order: list[str]) -> bool:
    ranks = [order.index(p) for p in seq if p in order]
    return ranks == sorted(ranks)


# -- a whole load per vLLM version ------------------------------------------------------------------

@pytest.mark.parametrize("version", ["0.10.1", "0.15.0", "0.33.0"])
async def test_load_phases_progress_and_eta(systemd_rig, rig_ssh, tmp_path, version):
    # 8 s: the weights load for 70% of it; at 4 s (2.8 s of it) a loaded machine's ticks through SSH once
    # took longer than that whole phase, and no snapshot saw it (the journal did)
    unit = await install_unit(rig_ssh, systemd_rig, tmp_path, version=version, load_seconds=8.0)
    try:
        seen, collector = await observe(unit.profile_path)
        # the journal walks every phase in order, whatever the version's line formats
        assert seen.journal_phases()[-len(LOAD_ORDER):] == LOAD_ORDER, (seen.journal_phases(), seen.journal[:8])
        assert seen.snaps[-1].server.phase == "ready"
        assert in_order(seen.snap_phases(), LOAD_ORDER), seen.snap_phases()
        # journald holds the bar back until it ends: the shard counter arrives whole, 8 of 8
        bars = [m for m, _ in seen.journal if "checkpoint shards" in m]
        assert bars and "8/8" in bars[-1]
        final = seen.snaps[-1]
        assert final.server.progress is not None and (final.server.progress.done, final.server.progress.total) == (8, 8)
        assert final.server.model_id == SERVED and final.server.max_model_len == 262144
        assert final.server.version == version and final.server.error is None
        assert collector.tracker.version == version
        # live progress while loading came from GPU memory rising, never from the (held back) shards
        loading = [s for s in seen.snaps if s.server.phase == "loading_weights"]
        assert loading, seen.snap_phases()
        sources = {s.server.eta_source for s in loading}
        assert sources <= {"gpu_memory"}, sources
        fractions = [s.server.fraction for s in loading if s.server.fraction is not None]
        assert fractions and fractions == sorted(fractions) and 0 <= fractions[0] <= fractions[-1] <= 1
        assert any(s.server.eta_s is not None for s in loading)
        assert len(final.gpus) == 2 and final.gpus[0].name == "NVIDIA H200" and final.gpu_error is None
        assert final.gpus[0].memory_used_mib > WEIGHTS_GIB * 1024  # weights + KV cache resident
        assert final.service.active_state == "active" and final.service.sub_state == "running"
        # the finished load is remembered on the host for the next load's ETA
        hist = await rig_ssh.run(["cat", f"{unit.work_dir}/state/loads.jsonl"], check=True)
        rec = json.loads(hist.stdout.splitlines()[-1])
        assert rec["model"] == SERVED and rec["ready"] > rec["started"]
        assert rec["weights_gib"] == pytest.approx(WEIGHTS_GIB, abs=0.1)
    finally:
        await stop_unit(rig_ssh, unit)


async def test_second_load_uses_history_status_json_and_stop(systemd_rig, rig_ssh, tmp_path):
    # 6 s: the later loads are watched from after `restart-server` returns and a new session connects, which
    # a loaded run once took past the whole of a 3 s load (no snapshot while loading)
    unit = await install_unit(rig_ssh, systemd_rig, tmp_path, load_seconds=6.0)
    try:
        first, _ = await observe(unit.profile_path)
        assert first.snaps[-1].server.phase == "ready"

        out = cli("status", "--profile", str(unit.profile_path), "--json")
        assert out.returncode == 0, out.stderr
        status = json.loads(out.stdout)
        assert_contract(status)
        assert status["server"]["phase"] == "ready" and status["server"]["model_id"] == SERVED
        assert status["service"] == status["service"] | {"manager": "systemd", "unit": unit.name,
                                                          "active_state": "active", "sub_state": "running"}
        assert status["host"] == status["host"] | {"name": "127.0.0.1", "reachable": True, "error": None}
        assert status["service"]["restarts"] == 0 and status["service"]["since"]

        human = cli("status", "--profile", str(unit.profile_path))
        assert human.returncode == 0 and "server   ready" in human.stdout and SERVED in human.stdout

        ready = cli("wait-ready", "--profile", str(unit.profile_path), "--timeout", "30")
        assert ready.returncode == 0, ready.stderr
        assert ready.stdout.startswith(f"ready: {SERVED}")

        # second load: restart, the previous load is known (from the host's loads.jsonl)
        restart = cli("restart-server", "--profile", str(unit.profile_path), "--yes")
        assert restart.returncode == 0, restart.stderr
        second, collector = await observe(unit.profile_path, start=False)
        assert len(collector.history) >= 1 and collector.history[0].weights_gib == pytest.approx(WEIGHTS_GIB, abs=0.1)
        loading = [s for s in second.snaps if s.server.phase == "loading_weights"]
        assert loading and {s.server.eta_source for s in loading} <= {"gpu_memory", "previous_load"}
        assert any(s.server.eta_s is not None for s in loading)
        assert second.snaps[-1].server.phase == "ready"

        # with no GPU readings the previous load's duration is what is left: ETA from previous_load
        nogpu = write_profile(tmp_path / "nogpu.toml", systemd_rig, unit.name, unit.port, unit.work_dir,
                              gpu_args=["--simulate-no-driver"])
        restart = cli("restart-server", "--profile", str(nogpu), "--yes")
        assert restart.returncode == 0, restart.stderr
        third, _ = await observe(nogpu, start=False)
        loading = [s for s in third.snaps if s.server.phase in ("starting", "loading_weights")
                   and s.server.eta_source is not None]
        assert loading and {s.server.eta_source for s in loading} == {"previous_load"}
        assert all(s.gpus == () and "driver" in s.gpu_error for s in third.snaps)

        stop = cli("stop-server", "--profile", str(unit.profile_path), "--yes")
        assert stop.returncode == 0, stop.stderr
        assert f"$ systemctl stop {unit.name}" in stop.stdout
        after = json.loads(cli("status", "--profile", str(unit.profile_path), "--json").stdout)
        assert after["server"]["phase"] == "stopped" and after["service"]["active_state"] == "inactive"
        assert after["server"]["error"] is None
    finally:
        await stop_unit(rig_ssh, unit)


CONTRACT = {
    "host": {"name": str, "reachable": bool, "error": (str, type(None))},
    "service": {"manager": str, "unit": str, "active_state": str, "sub_state": str,
                "restarts": (int, type(None)), "since": (str, type(None))},
    "server": {"phase": str, "progress": (dict, type(None)), "eta_s": (int, float, type(None)),
               "model_id": (str, type(None)), "max_model_len": (int, type(None)),
               "version": (str, type(None)), "error": (str, type(None))},
}
GPU_KEYS = {"index": int, "name": str, "memory_used_mib": (int, type(None)),
            "memory_total_mib": (int, type(None)), "utilization_pct": (int, type(None)),
            "temperature_c": (int, type(None)), "power_w": (int, float, type(None))}


def assert_contract(status: dict) -> None:
    for section, fields in CONTRACT.items():
        for key, tp in fields.items():
            assert key in status[section], f"{section}.{key} missing"
            assert isinstance(status[section][key], tp), f"{section}.{key} = {status[section][key]!r}"
    assert status["service"]["manager"] in ("systemd", "tmux")
    assert status["server"]["phase"] in PHASES
    if status["server"]["progress"] is not None:
        assert set(status["server"]["progress"]) == {"done", "total"}
    assert isinstance(status["gpus"], list)
    for gpu in status["gpus"]:
        for key, tp in GPU_KEYS.items():
            assert isinstance(gpu[key], tp), f"gpus[].{key} = {gpu.get(key)!r}"


# -- wait-ready's three answers ---------------------------------------------------------------------

async def test_wait_ready_reports_oom_root_cause(systemd_rig, rig_ssh, tmp_path):
    unit = await install_unit(rig_ssh, systemd_rig, tmp_path, load_seconds=3.0,
                              extra=["--fault", "crash-during-load:0.4"])
    try:
        rc, _, out = await server_action(load_profile(unit.profile_path), "start-server")
        assert rc == 0, out
        res = cli("wait-ready", "--profile", str(unit.profile_path), "--timeout", "40")
        assert res.returncode == 1, (res.stdout, res.stderr)
        assert "load failed" in res.stderr and "CUDA out of memory" in res.stderr
        status = json.loads(cli("status", "--profile", str(unit.profile_path), "--json").stdout)
        assert status["server"]["phase"] == "failed" and "CUDA out of memory" in status["server"]["error"]
        assert status["service"]["active_state"] == "failed"
    finally:
        await rig_ssh.run(["systemctl", "reset-failed", unit.name], timeout=30)


async def test_a_restart_is_judged_by_the_new_process_only(systemd_rig, rig_ssh, tmp_path):
    """journalctl -u UNIT holds every earlier run of the unit: after a restart, `status` and `wait-ready`
    must speak of the new process (its InvocationID) from its first second, before it prints anything."""
    unit = await install_unit(rig_ssh, systemd_rig, tmp_path, load_seconds=3.0,
                              extra=["--fault", "crash-during-load:0.4"])
    try:
        rc, _, out = await server_action(load_profile(unit.profile_path), "start-server")
        assert rc == 0, out
        assert cli("wait-ready", "--profile", str(unit.profile_path), "--timeout", "40").returncode == 1
        # the same unit without the fault, restarted: the new load must not inherit the old failure
        # a different version than the failed run's: the assertions below tell the two processes apart by it,
        # not by how soon `status` runs (a loaded machine may reach it after the new one printed its version)
        text = unit_text(unit.name, unit.port, unit.work_dir, version="0.34.1", load_seconds=6.0,
                         extra=["--import-seconds", "3"])
        await rig_ssh.run(["sh", "-c", 'cat > "$1" && systemctl daemon-reload', "sh",
                           f"/etc/systemd/system/{unit.name}.service"], input=text, check=True, timeout=30)
        assert cli("restart-server", "--profile", str(unit.profile_path), "--yes").returncode == 0
        status = json.loads(cli("status", "--profile", str(unit.profile_path), "--json").stdout)
        assert status["server"]["phase"] in ("starting", "loading_weights"), status["server"]
        assert status["server"]["error"] is None and status["server"]["version"] in (None, "0.34.1"), status
        ready = cli("wait-ready", "--profile", str(unit.profile_path), "--timeout", "60")
        assert ready.returncode == 0, ready.stderr
        # and after a good load, a restart starts over: no "starting_api" with the old shard count
        assert cli("restart-server", "--profile", str(unit.profile_path), "--yes").returncode == 0
        status = json.loads(cli("status", "--profile", str(unit.profile_path), "--json").stdout)
        assert status["server"]["phase"] in ("starting", "loading_weights"), status["server"]
        assert status["server"]["progress"] is None
    finally:
        await stop_unit(rig_ssh, unit)
        await rig_ssh.run(["systemctl", "reset-failed", unit.name], timeout=30)


async def test_wait_ready_times_out_with_exit_2(systemd_rig, rig_ssh, tmp_path):
    unit = await install_unit(rig_ssh, systemd_rig, tmp_path, load_seconds=120.0)
    try:
        rc, _, out = await server_action(load_profile(unit.profile_path), "start-server")
        assert rc == 0, out
        began = time.monotonic()
        # 10 s: on a loaded machine the first reading of the rig (an SSH login, systemctl, the journal) took
        # more than 3, and a wait that never read the server can only say "phase unknown"
        res = cli("wait-ready", "--profile", str(unit.profile_path), "--timeout", "10")
        assert res.returncode == 2, (res.stdout, res.stderr)
        assert time.monotonic() - began < 40
        assert "timed out after 10 s" in res.stderr
        assert any(p in res.stderr for p in ("starting", "loading_weights")), res.stderr
    finally:
        await stop_unit(rig_ssh, unit)


async def test_wrong_model_is_a_failure_not_ready(systemd_rig, rig_ssh, tmp_path):
    unit = await install_unit(rig_ssh, systemd_rig, tmp_path, load_seconds=2.0)
    wrong = write_profile(tmp_path / "wrong.toml", systemd_rig, unit.name, unit.port, unit.work_dir,
                          served="some-other-model")
    try:
        rc, _, out = await server_action(load_profile(wrong), "start-server")
        assert rc == 0, out
        res = cli("wait-ready", "--profile", str(wrong), "--timeout", "40")
        assert res.returncode == 1, (res.stdout, res.stderr)
        assert "wrong model" in res.stderr and SERVED in res.stderr and "some-other-model" in res.stderr
        status = json.loads(cli("status", "--profile", str(wrong), "--json").stdout)
        assert status["server"]["phase"] == "failed" and "wrong model" in status["server"]["error"]
        assert status["server"]["model_id"] == SERVED
    finally:
        await stop_unit(rig_ssh, unit)


# -- reconnect during a journal stream --------------------------------------------------------------

def rig_sshd_sessions(rig) -> list[int]:
    """The per-connection sshd processes (and what they run) under the rig's sshd listener.

    The listener is the `sshd` whose parent is the rig's systemd; everything below it is a session."""
    found = []
    for pid in procs.descendants(rig.pid):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "sshd" and procs.parent_pid(pid) == rig.pid:
            found.extend(procs.descendants(pid))
    return found


async def test_journal_stream_resumes_after_dropped_connection(systemd_rig, rig_ssh, tmp_path):
    name = f"e3lines-{uuid.uuid4().hex[:8]}"
    work_dir = f"/root/e3rig/{name}"
    await rig_ssh.run(["mkdir", "-p", work_dir], check=True)
    profile_path = write_profile(tmp_path / "lines.toml", systemd_rig, name, keys.free_port(), work_dir)
    profile = load_profile(profile_path)
    session = Session(profile)
    await session.tick()  # before the unit exists: its stream starts after the journal's last entry
    script = "for i in $(seq 1 60); do echo line $i; sleep 0.05; done; sleep 0.5"
    await rig_ssh.run(["systemd-run", f"--unit={name}", "--quiet", "sh", "-c", script], check=True)
    got: list[str] = []
    dropped = False

    async def follow() -> None:
        nonlocal dropped
        async for line in session.journal(name):
            message = line.text
            if not message.startswith("line "):
                continue  # systemd's own "Started ..." lines
            got.append(message)
            if len(got) == 10 and not dropped:
                dropped = True
                victims = rig_sshd_sessions(systemd_rig)
                assert victims
                for pid in victims:
                    procs.kill(pid)
            if message == "line 60":
                return

    try:
        await asyncio.wait_for(follow(), 40)
    finally:
        await session.close()
    assert dropped
    assert got == [f"line {i}" for i in range(1, 61)]  # nothing lost, nothing twice


# -- ready the moment it is ready ---------------------------------------------------------------------

async def test_ready_line_in_the_journal_makes_the_session_check_at_once(systemd_rig, rig_ssh, tmp_path):
    """Over SSH under systemd, with a 30 s interval: the journal stream's `Application startup complete.`
    (or the API server's start lines before it) makes the session ask /health and /v1/models at once. The
    load takes 3 s, so the session's next tick is over 20 s after the ready line: ready within 5 s of it
    can only come from that ask (the bound is loose for a loaded CI machine; the figure is
    benchmarks/bench_readiness.py's)."""
    unit = await install_unit(rig_ssh, systemd_rig, tmp_path, load_seconds=3.0)
    profile = load_profile(unit.profile_path)
    try:
        async with Session(profile, interval=30.0) as session:
            snaps = session.snapshots(connecting=False)
            first = await asyncio.wait_for(snaps.__anext__(), 60)
            assert first.server.phase in ("stopped", "unknown"), first.server
            rc, _, out = await server_action(profile, "start-server")
            assert rc == 0, out
            ready_at = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                snap = await asyncio.wait_for(snaps.__anext__(), 45)
                if snap.server.phase == "ready":
                    ready_at = time.time()
                    break
            await snaps.aclose()
            line_ts = None
            for _ in range(100):  # the port watch can say ready before journald hands over the line
                line_ts = next((e.ts for e in session.collector.log.recent
                                if e.message.endswith("Application startup complete.")), None)
                if line_ts is not None:
                    break
                await asyncio.sleep(0.05)
        assert ready_at is not None and line_ts is not None
        delay = ready_at - line_ts
        assert delay < 5.0, f"ready {delay:.2f} s after the ready line (interval 30 s)"
        assert snap.server.model_id == SERVED
    finally:
        await stop_unit(rig_ssh, unit)



async def _restarts_seen_ready(rig_ssh, unit: RigUnit, restarts: int, *, between=None) -> None:
    """Start the unit, then restart it `restarts` times the operator's way (`systemctl stop`,
    `reset-failed`, `start` of the same name, back to back) under one Session with a 60 s interval: no
    tick falls inside after the first, so only the ready ask can find each new run ready. Each must be,
    within 10 s of its port listening (loose for a loaded machine: the figure is
    benchmarks/bench_readiness.py's), and as the run the unit is on now. `between(n)` runs after the nth
    stop (an edit of the unit)."""
    import threading

    from harness.sim_support import first_listen

    profile = load_profile(unit.profile_path)

    async def current_run() -> str:
        res = await rig_ssh.run(["systemctl", "show", unit.name, "-p", "InvocationID", "--value"], timeout=30)
        return res.stdout.strip()

    async with Session(profile, interval=60.0) as session:
        snaps = session.snapshots(connecting=False)
        first = await asyncio.wait_for(snaps.__anext__(), 60)
        assert first.server.phase in ("stopped", "unknown"), first.server
        for attempt in range(restarts + 1):
            if attempt:
                # reset-failed fails once systemd has unloaded the stopped unit: nothing was left to reset
                await rig_ssh.run(["sh", "-c", 'systemctl stop "$1" && { systemctl reset-failed "$1" '
                                   '2>/dev/null || true; }', "sh", unit.name], check=True, timeout=30)
                if between is not None:
                    await between(attempt)
            stop, listened = threading.Event(), list[float]()
            poller = threading.Thread(target=first_listen, args=(unit.port, stop, listened))
            poller.start()
            try:
                await rig_ssh.run(["systemctl", "start", unit.name], check=True, timeout=30)
                snap = await asyncio.wait_for(snaps.__anext__(), 15)
                seen = time.monotonic()
            finally:
                stop.set()
                poller.join()
            assert snap.server.phase == "ready", (attempt, snap.server)
            assert listened, f"start {attempt}: said ready before the port listened"
            assert seen - listened[0] < 10.0, f"start {attempt}: ready {seen - listened[0]:.2f} s after listen"
            assert session.collector.log.invocation == await current_run(), attempt
        await snaps.aclose()


async def test_each_restart_of_one_unit_is_seen_ready_by_the_ready_ask(systemd_rig, rig_ssh, tmp_path):
    """An operator's restart, three times over. (The port watch or the journal's API lines, whichever is
    first: before the watch, restarts were seen fast only while an ask left over from the previous run's
    late lines still ran, and otherwise when journald brought the API lines, up to 250 ms late.)"""
    unit = await install_unit(rig_ssh, systemd_rig, tmp_path, load_seconds=1.0)
    try:
        await _restarts_seen_ready(rig_ssh, unit, 3)
    finally:
        await stop_unit(rig_ssh, unit)


async def test_a_server_that_logs_nothing_to_the_journal_is_seen_ready_by_the_port_watch(
        systemd_rig, rig_ssh, tmp_path):
    """After the first run the unit's output goes nowhere (an operator who logs vLLM to a file): the
    journal brings only systemd's own lines about the unit, no API line, so only the port watch started
    on the new run's `Started` line can make the session ask before its next tick (60 s)."""
    unit = await install_unit(rig_ssh, systemd_rig, tmp_path, load_seconds=1.0)
    dropin = f"/etc/systemd/system/{unit.name}.service.d"

    async def silence(_attempt: int) -> None:
        await rig_ssh.run(["sh", "-c", 'mkdir -p "$1" && cat > "$1/quiet.conf" && systemctl daemon-reload', "sh",
                           dropin], input="[Service]\nStandardOutput=null\nStandardError=null\n", check=True,
                          timeout=30)

    try:
        await _restarts_seen_ready(rig_ssh, unit, 2, between=silence)
    finally:
        await stop_unit(rig_ssh, unit)
        await rig_ssh.run(["rm", "-rf", dropin], timeout=30)
