"""The headless commands' contract around the edges: exit codes, messages, the readable summary, and
wait-ready's failure path on a tmux host (the stand-in's log file)."""
from __future__ import annotations

import json
import time
import subprocess
import sys
from pathlib import Path

import pytest

from console.profile import write_profile
from console import demo
from console.commands.server_cmd import watch_key, human, wait_ready
from console.snapshot import GpuInfo, HostInfo, Progress, RunInfo, ServerInfo, ServiceInfo, Snapshot
from harness.rig import keys

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parent.parent


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL)


def test_missing_profile_exits_2_with_the_path(tmp_path):
    res = cli("status", "--profile", str(tmp_path / "nope.toml"), "--json")
    assert res.returncode == 2 and "nope.toml" in res.stderr and "file not found" in res.stderr


def test_bad_profile_names_the_key(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[host]\nname = "gpu host"\n[server]\nmodel_path = "/m"\n[paths]\nwork_dir = "/w"\n')
    res = cli("wait-ready", "--profile", str(path), "--timeout", "1")
    assert res.returncode == 2 and "host.name" in res.stderr


def test_stop_needs_yes_without_a_terminal(tmp_path):
    profile = demo.prepare(tmp_path / "d")
    res = cli("stop-server", "--profile", profile.source)
    assert res.returncode == 2 and "--yes" in res.stderr


def test_refused_host_keeps_the_json_shape(tmp_path, sshd_server):
    # a key the server does not accept: not retried, so this answers at once (a closed port is
    # retried with backoff for several seconds)
    stranger = keys.generate_key(tmp_path / "stranger_key")
    path = tmp_path / "refused.toml"
    path.write_text("\n".join([
        "[host]", 'name = "127.0.0.1"', f"port = {sshd_server.port}", f'user = "{sshd_server.username}"',
        f'identity_file = "{stranger}"', f'known_hosts = "{sshd_server.known_hosts}"', "",
        "[server]", 'model_path = "/m"', 'unit = "vllm"', "", "[paths]", 'work_dir = "/tmp/e3-none"', ""]))
    res = cli("status", "--profile", str(path), "--json")
    assert res.returncode == 3
    status = json.loads(res.stdout)
    assert status["host"]["reachable"] is False and "refused" in status["host"]["error"]
    assert status["server"]["phase"] == "unknown" and status["gpus"] == []
    assert status["service"]["manager"] == "systemd" and status["service"]["unit"] == "vllm"
    plain = cli("status", "--profile", str(path))
    assert plain.returncode == 3 and "UNREACHABLE" in plain.stdout
    # a refusal ends the wait at once (1 s on a quiet machine), not at the timeout; a timeout of 1 s lost the
    # race to the SSH handshake on a loaded machine and then could only say "phase unknown"
    began = time.monotonic()
    wait = cli("wait-ready", "--profile", str(path), "--timeout", "60")
    assert wait.returncode == 2 and "refused" in wait.stderr, wait.stderr
    assert time.monotonic() - began < 45


def test_wait_ready_times_out_on_a_stopped_server(tmp_path):
    profile = demo.prepare(tmp_path / "d")
    res = cli("wait-ready", "--profile", profile.source, "--timeout", "1", "--interval", "0.2")
    assert res.returncode == 2 and "timed out after 1 s; server phase stopped" in res.stderr


async def test_wait_ready_on_tmux_reports_the_oom_root_cause(tmp_path):
    work = tmp_path / "d"
    profile = demo.prepare(work, speed=10)  # demo.start would rewrite the profile: start it ourselves
    profile.server.command = [*profile.server.command, "--fault", "crash-during-load:0.3"]
    write_profile(profile, profile.source, overwrite=True)
    res = cli("start-server", "--profile", profile.source)
    try:
        assert res.returncode == 0, res.stderr
        rc, snap = await wait_ready(profile, timeout=30, interval=0.2)
        assert rc == 1, snap.server
        assert "CUDA out of memory" in snap.server.error
        out = cli("wait-ready", "--profile", profile.source, "--timeout", "10")
        assert out.returncode == 1 and "load failed: torch.OutOfMemoryError: CUDA out of memory" in out.stderr
    finally:
        await demo.stop(work)


def snapshot(**server) -> Snapshot:
    return Snapshot(
        host=HostInfo(name="gpu-1", reachable=True, rtt_ms=12.5),
        service=ServiceInfo(manager="systemd", unit="vllm", active_state="active", sub_state="running",
                            restarts=2, since="Mon 2026-11-30 05:04:29 UTC"),
        server=ServerInfo(**server),
        gpus=[GpuInfo(0, "NVIDIA H200", 70000, 143771, 0, 40, 120.0), GpuInfo(1, "NVIDIA H200", None, 143771)],
        runs=[RunInfo(stage="generate", run_id="r1", state="running", done=5, total=10, failed=1)])


def test_human_summary_while_loading():
    text = human(snapshot(phase="loading_weights", progress=Progress(3, 8), fraction=0.375, eta_s=41.7,
                          eta_source="gpu_memory"))
    lines = text.splitlines()
    assert lines[0] == "host     gpu-1: reachable (12.5 ms)"
    assert lines[1] == "service  systemd vllm: active/running since Mon 2026-11-30 05:04:29 UTC, 2 restarts"
    assert lines[2] == "server   loading_weights 3/8 shards 38% ETA 41 s (gpu_memory)"
    assert "gpu 0    NVIDIA H200: 70000/143771 MiB, util 0%" in lines
    assert "gpu 1    NVIDIA H200: memory N/A, util N/A" in lines
    assert lines[-1] == "run      generate r1: running 5/10, 1 failed"


def test_ready_eta_beside_the_weights_eta_in_json_and_text():
    snap = snapshot(phase="loading_weights", fraction=0.5, eta_s=600.0, eta_source="gpu_memory",
                    eta_ready_s=805.0, eta_ready_confidence="previous_loads", eta_ready_basis=3)
    server = snap.to_json()["server"]
    assert (server["eta_s"], server["eta_ready_s"], server["eta_ready_confidence"], server["eta_ready_basis"]) \
        == (600.0, 805.0, "previous_loads", 3)
    assert "ETA 600 s (gpu_memory), ready in 805 s (previous_loads)" in human(snap)
    later = snapshot(phase="loading_weights", fraction=0.5, eta_s=590.0, eta_source="gpu_memory",
                     eta_ready_s=795.0, eta_ready_confidence="previous_loads", eta_ready_basis=3)
    assert watch_key(snap.to_json()) == watch_key(later.to_json())  # an ETA ticking down is not a change


def test_human_summary_on_failure():
    text = human(snapshot(phase="failed", error="wrong model served: 'a', the profile expects 'b'"))
    assert "server   failed" in text and "ERROR: wrong model served" in text


def test_watch_ignores_what_changes_every_tick():
    a = snapshot(phase="ready").to_json()
    b = json.loads(json.dumps(a))
    b["taken_at"], b["host"]["rtt_ms"] = 99.0, 1.0
    b["free_bytes"] = (a["free_bytes"] or 0) + 4096
    b["gpus"][0].update(power_w=131.5, temperature_c=41, utilization_pct=3, memory_used_mib=70010)
    assert watch_key(a) == watch_key(b)  # jitter of power, disk and memory is not a change of state
    b["server"]["phase"] = "failed"
    assert watch_key(a) != watch_key(b)


async def test_one_bad_load_record_is_counted_and_skipped(tmp_path):
    """A wrong-typed or non-finite number in the host's state/loads.jsonl: before, `status --json`
    died in a TypeError while the server loaded, `wait-ready` exited 1 ("the load failed") and the
    downtime read "about inf h". Now the record is skipped and counted in host.unreadable."""
    work = tmp_path / "d"
    profile = demo.prepare(work, speed=0.05)  # a 400 s load: the first status lands in its first steps
    model = profile.server.model_id
    loads = work / "state" / "loads.jsonl"
    loads.parent.mkdir(parents=True)
    loads.write_text("\n".join([
        "{torn", json.dumps({"model": model, "started": 1000, "ready": 1090, "weights_gib": float("nan")}),
        json.dumps({"model": model, "started": 1000, "ready": 1100, "weights_gib": "70", "weights_s": "30"}),
        ""]))
    res = cli("start-server", "--profile", profile.source)
    try:
        assert res.returncode == 0, res.stderr
        status = cli("status", "--profile", profile.source, "--json")
        assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
        snap = json.loads(status.stdout)
        assert snap["server"]["phase"] in ("starting", "loading_weights")
        assert snap["host"]["unreadable"] == 3 and "loads.jsonl" in snap["host"]["unreadable_note"]
        wait = cli("wait-ready", "--profile", profile.source, "--timeout", "2", "--interval", "0.2")
        assert wait.returncode == 2 and "timed out" in wait.stderr, wait.stderr
        # what a server switch costs, said from the measured loads: a 1e999 one is no measurement
        loads.write_text('{"model": "%s", "started": 1000, "ready": 1e999}\n' % model)
        switch = cli("run", "serve-baseline", "--profile", profile.source)
        assert "server load" in switch.stderr and "Traceback" not in switch.stderr, switch.stderr
        assert "inf" not in switch.stderr and "about 0 s" not in switch.stderr, switch.stderr
    finally:
        await demo.stop(work)
