"""A call when it matters (console/ui/calls.py): the notify command's stdin, its failures, the user
config over the profile, and the bell and the tmux message from the real console running in tmux."""
from __future__ import annotations

import asyncio
import json
import os
import pty
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from console import demo
from console.profile import NotifySection, ProfileError, notify_settings, profile_from_dict
from console.ui.calls import CallEvent, Caller, tmux_message
from console.ui.panes.notices import transitions
from harness.fake_controller import base_snapshot

REPO = Path(__file__).resolve().parent.parent
EVENT = CallEvent(event="stage_failed", text="Stage train failed (night-train)", profile="p", host="gpu-host",
                  ts=1.5, stage="train", run_id="night-train", error="CUDA out of memory")


async def test_notify_command_gets_the_event_as_json_on_stdin(tmp_path):
    out = tmp_path / "event.json"
    rings: list[int] = []
    caller = Caller(NotifySection(bell=True, tmux=True, command=["sh", "-c", f"cat > {out}"]),
                    bell=lambda: rings.append(1), env={})  # not inside tmux: no message
    assert await caller.call(EVENT) == []
    assert json.loads(out.read_text()) == {
        "event": "stage_failed", "text": "Stage train failed (night-train)", "profile": "p", "host": "gpu-host",
        "ts": 1.5, "stage": "train", "run_id": "night-train", "model": None, "error": "CUDA out of memory"}
    assert rings == [1]


async def test_each_channel_off_and_failures_said(tmp_path):
    rings: list[int] = []
    off = Caller(NotifySection(bell=False, tmux=False, command=[]), bell=lambda: rings.append(1),
                 env={"TMUX": "/nonexistent,1,0"})
    assert await off.call(EVENT) == [] and rings == []
    failing = Caller(NotifySection(bell=False, tmux=False, command=["sh", "-c", "echo no pager >&2; exit 3"]),
                     bell=lambda: None, env={})
    assert await failing.call(EVENT) == ["notify command sh: exit 3 (no pager)"]
    missing = Caller(NotifySection(bell=False, tmux=False, command=[str(tmp_path / "nope")]), bell=lambda: None)
    assert "cannot start" in (await missing.call(EVENT))[0]


async def test_a_hanging_notify_command_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr("console.ui.calls.COMMAND_TIMEOUT_S", 0.5)
    caller = Caller(NotifySection(bell=False, tmux=False, command=["sleep", "30"]), bell=lambda: None, env={})
    started = time.monotonic()
    assert await caller.call(EVENT) == ["notify command sleep: still running after 0.5 s: killed"]
    assert time.monotonic() - started < 5


def test_tmux_message_is_one_line_without_formats():
    assert tmux_message("a #{pane_id}\nb") == "eagle3-console: a ##{pane_id} b"
    assert len(tmux_message("x" * 1000)) < 230


def test_user_config_overrides_the_profiles_notify(tmp_path):
    profile = profile_from_dict({"host": {"name": "gpu-host.example"}, "server": {"model_path": "/m"},
                                 "paths": {"work_dir": "/w"}, "notify": {"bell": False, "command": ["a"]}})
    assert notify_settings(profile, tmp_path / "none.toml") == NotifySection(bell=False, tmux=True, command=["a"])
    cfg = tmp_path / "config.toml"
    cfg.write_text('[notify]\ncommand = ["notify-send", "eagle3"]\ntmux = false\n')
    assert notify_settings(profile, cfg) == NotifySection(bell=False, tmux=False, command=["notify-send", "eagle3"])
    cfg.write_text('[notify]\nbell = "loud"\ncommand = ["a\\nb"]\n')
    with pytest.raises(ProfileError) as err:
        notify_settings(profile, cfg)
    assert str(cfg) in str(err.value) and "notify.bell" in str(err.value) and "notify.command" in str(err.value)


def test_every_notice_that_calls_names_its_event():
    loading, ready, failed = (base_snapshot(phase=p) for p in ("loading_weights", "ready", "failed"))
    assert [(n.event, n.model) for n in transitions(loading, ready)] == [("load_ready", "Qwen/Qwen3-8B")]
    assert transitions(loading, failed)[0].event == "load_failed"


# ---- the real console in tmux ---------------------------------------------------------------------

class Terminal:
    """A tmux client attached in a pseudo-terminal: what it draws (status-line messages included)."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
        os.close(slave)
        self.data = bytearray()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.data.extend(chunk)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        os.close(self.master)


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_the_readonly_console_in_tmux_rings_the_bell_says_it_in_tmux_and_runs_the_notify_command(tmp_path):
    sock_dir = Path(f"/tmp/e3calls-{os.getpid()}")  # tmux's socket path must stay short
    sock_dir.mkdir(mode=0o700, exist_ok=True)
    config = tmp_path / "config"
    (config / "eagle3-console").mkdir(parents=True)
    out = tmp_path / "events.jsonl"
    (config / "eagle3-console" / "config.toml").write_text(
        f'[notify]\ncommand = ["sh", "-c", "cat >> {out}"]\n')
    work = tmp_path / "d"
    env = {**os.environ, "TMUX_TMPDIR": str(sock_dir), "XDG_CONFIG_HOME": str(config), "TERM": "xterm-256color"}
    env.pop("TMUX", None)
    tmux = ["tmux", "-f", "/dev/null"]

    def t(*args: str) -> str:
        return subprocess.run([*tmux, *args], env=env, capture_output=True, text=True, check=True).stdout

    console = f"cd {REPO} && exec {sys.executable} -m console.cli --demo --demo-dir {work} --demo-speed 20 --readonly"
    terminal = None
    try:
        t("new-session", "-d", "-s", "ops", "-x", "160", "-y", "50", "-n", "shell", "sleep 600")
        t("new-window", "-d", "-t", "ops", "-n", "console", console)
        terminal = Terminal([*tmux, "attach", "-t", "ops:shell"], env)  # the operator looks elsewhere
        assert wait_for(lambda: out.exists() and "load_ready" in out.read_text(), 150), \
            t("capture-pane", "-p", "-t", "ops:console")
        event = json.loads(out.read_text().splitlines()[0])
        assert event["event"] == "load_ready" and event["text"].startswith("Server ready: ")
        assert event["profile"] == "demo" and event["ts"] > 0
        # the bell rang in the console's window (not the one looked at), and the message reached the client
        assert t("display-message", "-p", "-t", "ops:console", "#{window_bell_flag}").strip() == "1"
        assert wait_for(lambda: b"eagle3-console: Server ready" in bytes(terminal.data), 10)
    finally:
        if terminal is not None:
            terminal.close()
        subprocess.run([*tmux, "send-keys", "-t", "ops:console", "q"], env=env, capture_output=True)
        time.sleep(1)
        subprocess.run([*tmux, "kill-server"], env=env, capture_output=True)
        asyncio.run(demo.stop(work))
        shutil.rmtree(sock_dir, ignore_errors=True)
