"""The one server switch (backend/kit/switch.py) and the host's server lock (backend/kit/serverlock.py), with real
processes: servers are marker files handled by the plan's commands (a service manager reduced to
`touch`/`rm`/`test`), readiness is a real HTTP endpoint."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.kit.serverlock import LockHeld, ServerLock
from backend.kit.switch import Switch, SwitchFailed, switch_from_dict
from harness.sim_support import REPO

pytestmark = pytest.mark.timeout(120)


def plan_dict(tmp_path: Path, endpoint: str, *, start_delay: float = 0.0, stubborn: str = "",
              lock: bool = True) -> dict:
    servers = tmp_path / "servers"
    servers.mkdir(exist_ok=True)
    log = tmp_path / "commands.log"

    def cmd(name: str, what: str) -> list[str]:
        flag = servers / name
        body = {"start": f'sleep {start_delay}; touch "$1"', "alive": '[ -e "$1" ]',
                "stop": ':' if name == stubborn else 'rm -f "$1"'}[what]
        return ["sh", "-c", f'[ "$2" = alive ] || echo "$2 $3 (running: $(ls "$4" | tr "\\n" " "))" >> "$5"; {body}',
                "sh", str(flag), what, name, str(servers), str(log)]

    def server(name: str) -> dict:
        return {"name": name, "unit": f"u-{name}", "start": cmd(name, "start"), "stop": cmd(name, "stop"),
                "alive": cmd(name, "alive")}

    return {"version": 1, "home": server("baseline"), "away": [server("drafter")], "endpoint": endpoint,
            "ready_timeout_s": 20, "command_timeout_s": 20, "stop_check_s": 1,
            "lock_path": str(tmp_path / "state" / "servers.lock") if lock else ""}


def commands(tmp_path: Path) -> list[str]:
    path = tmp_path / "commands.log"
    return path.read_text().splitlines() if path.exists() else []


def test_go_and_back_stop_see_down_start_and_always_bring_the_baseline_back(tmp_path, answering):
    (tmp_path / "servers").mkdir()
    (tmp_path / "servers" / "baseline").touch()
    progress: list[dict] = []
    sw = Switch(switch_from_dict(plan_dict(tmp_path, answering)), holder="test",
                progress=lambda phase, force=False, **kw: progress.append({"phase": phase, **kw}))

    async def run() -> None:
        try:
            await sw.go("drafter")
            assert sw.lock is not None and sw.lock.held
            raise RuntimeError("the body failed")
        finally:
            await sw.back()

    with pytest.raises(RuntimeError):
        asyncio.run(run())
    assert commands(tmp_path) == ["stop baseline (running: baseline )", "start drafter (running: )",
                                  "stop drafter (running: drafter )", "start baseline (running: )"]
    record = sw.record.to_dict()
    assert [(s["step"], s["ok"]) for s in record["steps"]] == [
        ("stop_baseline", True), ("start_drafter", True), ("stop_drafter", True), ("start_baseline", True)]
    assert record["baseline_restarted"] is True and record["baseline_down_at"] <= record["baseline_up_at"]
    # the events say when the baseline went down and came back, and when the drafter answered
    phases = [p["phase"] for p in progress]
    assert phases.index("baseline_down") < phases.index("drafter_ready") < phases.index("baseline_up")
    assert not sw.lock.held  # released after back()


def test_a_server_that_stays_up_after_its_stop_is_never_joined_by_another(tmp_path, answering):
    (tmp_path / "servers").mkdir()
    (tmp_path / "servers" / "baseline").touch()
    sw = Switch(switch_from_dict(plan_dict(tmp_path, answering, stubborn="baseline")))

    async def run() -> None:
        try:
            await sw.go("drafter")
        finally:
            await sw.back()

    with pytest.raises(SwitchFailed, match=r"the baseline server \(u-baseline\) still runs 1 s after its stop"):
        asyncio.run(run())
    assert commands(tmp_path) == ["stop baseline (running: baseline )"]  # the drafter never started


def test_the_lock_names_its_holder_and_is_passed_to_a_child(tmp_path):
    path = str(tmp_path / "state" / "servers.lock")
    first = ServerLock(path, "pipeline run p1").acquire()
    with pytest.raises(LockHeld, match=r"switched by pipeline run p1 \(pid \d+, since .*UTC\).*wait for it"):
        ServerLock(path, "bench run b1").acquire()
    # a child given the descriptor holds it too (the pipeline's stages)
    code = ("import sys; from backend.kit.serverlock import ServerLock; l = ServerLock(sys.argv[1], 'extract').acquire(); "
            "print(l.inherited)")
    out = subprocess.run([sys.executable, "-c", code, path], env={**os.environ, **first.child_env(),
                                                                  "PYTHONPATH": str(REPO)},
                         pass_fds=first.pass_fds(), capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr
    first.release()
    ServerLock(path, "bench run b1").acquire().release()  # free again


def switch_cli(plan: Path, to: str, events: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "backend.kit.switch", "--plan", str(plan), "--to", to,
                             "--events", str(events)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_switching_programs_at_once_the_second_is_refused_naming_the_first(tmp_path, answering):
    (tmp_path / "servers").mkdir()
    (tmp_path / "servers" / "baseline").touch()
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_dict(tmp_path, answering, start_delay=3)))
    events = tmp_path / "switches.jsonl"
    first = switch_cli(plan, "drafter", events)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any("start drafter" in c for c in commands(tmp_path)):
        time.sleep(0.1)
    second = switch_cli(plan, "baseline", events)
    out2, _ = second.communicate(timeout=60)
    out1, _ = first.communicate(timeout=60)
    assert first.returncode == 0, out1
    assert second.returncode == 1 and "the servers are being switched by serve-drafter switch (pid" in out2, out2
    # the second touched nothing: the drafter serves, the baseline stays down
    assert sorted(os.listdir(tmp_path / "servers")) == ["drafter"]
    assert commands(tmp_path) == ["stop baseline (running: baseline )", "start drafter (running: )"]
    finish = [json.loads(l) for l in events.read_text().splitlines() if '"finish"' in l]
    assert finish[-1]["status"] == "completed" and finish[-1]["summary"]["baseline_down_at"]


def test_a_serve_switch_whose_server_never_answers_brings_the_baseline_back(tmp_path):
    (tmp_path / "servers").mkdir()
    (tmp_path / "servers" / "baseline").touch()
    data = plan_dict(tmp_path, "http://127.0.0.1:9")
    data["ready_timeout_s"] = 2
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    proc = switch_cli(plan, "drafter", tmp_path / "switches.jsonl")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "did not answer http://127.0.0.1:9/health" in out, out
    assert sorted(os.listdir(tmp_path / "servers")) == ["baseline"]
    assert commands(tmp_path)[-2:] == ["stop drafter (running: drafter )", "start baseline (running: )"]


def test_detached_the_caller_returns_once_the_server_started_and_the_switch_goes_on(tmp_path):
    """The console's serve switch: its SSH command ends when the drafter started; the wait for it to answer
    (and the fall back to the baseline when it never does) goes on without the caller."""
    (tmp_path / "servers").mkdir()
    (tmp_path / "servers" / "baseline").touch()
    data = plan_dict(tmp_path, "http://127.0.0.1:9")
    data["ready_timeout_s"] = 3
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    events = tmp_path / "switches.jsonl"
    out = subprocess.run([sys.executable, "-m", "backend.kit.switch", "--plan", str(plan), "--to", "drafter", "--events",
                          str(events), "--detach", str(tmp_path / "logs" / "switch.log")], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "started drafter; it goes on detached" in out.stdout, out
    assert sorted(os.listdir(tmp_path / "servers")) == ["drafter"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (events.exists() and '"finish"' in events.read_text()):
        time.sleep(0.2)
    finish = [json.loads(l) for l in events.read_text().splitlines() if '"finish"' in l][-1]
    assert finish["status"] == "failed" and "did not answer" in finish["summary"]["error"]
    assert sorted(os.listdir(tmp_path / "servers")) == ["baseline"]  # brought back, the caller long gone


async def test_the_consoles_own_server_actions_are_refused_while_a_program_holds_the_lock(tmp_path):
    from console.profile import profile_from_dict
    from console.session import Session

    profile = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                                 "server": {"model_path": "/m", "manager": "tmux", "unit": "e3-lock-test",
                                            "command": ["sleep", "60"]},
                                 "paths": {"work_dir": str(tmp_path)}})
    lock = ServerLock(str(tmp_path / "state" / "servers.lock"), "bench run b1").acquire()
    try:
        async with Session(profile) as session:
            for result in (await session.restart_server(), await session.stop_stage("serve"),
                           await session.start_stage("serve")):
                assert not result.ok and "refused: the servers are being switched by bench run b1 (pid" \
                    in result.message, result
    finally:
        lock.release()


def test_a_units_secret_environment_never_lands_in_the_switchs_events(tmp_path, answering):
    """A derived server carries the operator's unit's Environment= as --setenv; its token is run, not recorded."""
    plan = plan_dict(tmp_path, answering)
    (tmp_path / "servers" / "baseline").touch()  # the baseline runs: the port's listener is its own
    start = plan["away"][0]["start"]
    plan["away"][0]["start"] = ["env", "HF_TOKEN=hf_secret_value", "--setenv=API_KEY=sk-secret",
                                "HTTPS_PROXY=http://alice:pw-secret@proxy.example", *start, "--api-key", "sk-space",
                                "--api-key=sk-eq"]
    progress: list[dict] = []
    sw = Switch(switch_from_dict(plan), holder="test",
                progress=lambda phase, force=False, **kw: progress.append({"phase": phase, **kw}))

    async def run() -> None:
        try:
            await sw.go("drafter")
        finally:
            await sw.back()

    asyncio.run(run())
    shown = json.dumps([sw.record.to_dict(), progress])
    assert "start_drafter" in shown and "HF_TOKEN=***" in shown
    for secret in ("hf_secret_value", "sk-secret", "pw-secret", "sk-space", "sk-eq"):
        assert secret not in shown


def test_sigterm_stops_a_serve_switch_through_the_lifecycle_and_brings_the_baseline_back(tmp_path):
    """The serve switch's own program has no signal handler of its own: the lifecycle's (backend/kit/lifecycle.py
    install_stop_handler) stops it while its server loads; it ends stopped, exit 1, the baseline back."""
    (tmp_path / "servers").mkdir()
    (tmp_path / "servers" / "baseline").touch()
    data = plan_dict(tmp_path, "http://127.0.0.1:9")
    data["ready_timeout_s"] = 120
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    events = tmp_path / "switches.jsonl"
    proc = switch_cli(plan, "drafter", events)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any("start drafter" in c for c in commands(tmp_path)):
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    finish = [json.loads(l) for l in events.read_text().splitlines() if '"finish"' in l][-1]
    assert finish["status"] == "stopped"
    assert sorted(os.listdir(tmp_path / "servers")) == ["baseline"]


def test_a_leftover_server_on_the_port_is_refused_before_anything_is_stopped(tmp_path, answering):
    """Issue 31 item 7: none of the plan's servers runs, yet something listens on the endpoint's port (a
    previous model's server): the switch refuses before its first stop, naming the listener and the fix."""
    progress: list[dict] = []
    sw = Switch(switch_from_dict(plan_dict(tmp_path, answering)), holder="test",
                progress=lambda phase, force=False, **kw: progress.append({"phase": phase, **kw}))

    async def run() -> None:
        try:
            await sw.go("drafter")
        finally:
            await sw.back()

    with pytest.raises(SwitchFailed, match="a leftover server holds port") as caught:
        asyncio.run(run())
    assert f"pid {os.getpid()}" in str(caught.value) and "nothing was stopped" in str(caught.value)
    assert commands(tmp_path) == []  # nothing stopped, nothing started
    assert any(p["phase"] == "leftover_server" for p in progress)
