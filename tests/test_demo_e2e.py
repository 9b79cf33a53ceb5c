"""End to end, as an operator would: the real app in tmux on the demo host, keys in, screen out.

`eagle3-console --demo` must start, show a loading server, reach ready, stop and start the server
through its keys (stop behind a confirmation whose default is No), and leave no process behind on quit.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from console import demo

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None and os.environ.get("CI") != "true",
                                reason="tmux is not installed (scripts/install-system-deps.sh installs it)")


class Screen:
    """A tmux session on a private socket running one command; send keys, read the screen."""

    def __init__(self, tmp: Path, command: list[str], env: dict[str, str]):
        self.socket = f"e3test-{os.getpid()}-{tmp.name[-16:]}"
        self.env = {**os.environ, **env}
        # the pane's size is the app's: Textual takes COLUMNS and LINES over the terminal's, and a test
        # worker (pytest-xdist) has them set to 80x24
        for name in ("TMUX", "COLUMNS", "LINES"):
            self.env.pop(name, None)
        self.tmux("new-session", "-d", "-s", "app", "-x", "170", "-y", "50",
                  " ".join(subprocess.list2cmdline([c]) for c in command))

    def tmux(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              env=self.env, timeout=30)

    def text(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "app").stdout

    def keys(self, *keys: str) -> None:
        for k in keys:
            self.tmux("send-keys", "-t", "app", k)
            time.sleep(0.3)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if re.search(pattern, text):
                return text
            time.sleep(0.25)
        raise AssertionError(f"{pattern!r} never appeared; screen:\n{text}")

    def alive(self) -> bool:
        return self.tmux("has-session", "-t", "app").returncode == 0

    def close(self) -> None:
        self.tmux("kill-server")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


def pids_running(*needles: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if all(n in cmd for n in needles):
                found.append(int(proc.name))
    return found


def server_pid(demo_dir: Path) -> int:
    return int(json.loads((demo_dir / "gpus.json").read_text())["pid"])


def test_demo_app_end_to_end(tmp_path):
    demo_dir = tmp_path / "demo"
    cmd = [sys.executable, "-m", "console.cli", "--demo", "--demo-speed", "2", "--demo-dir", str(demo_dir)]
    screen = Screen(tmp_path, cmd, {"PYTHONPATH": str(ROOT)})
    try:
        screen.wait_for(r"SIMULATED", 60)
        screen.wait_for(r"phase\s+(starting|loading_weights|compiling|allocating|capturing)", 60)
        first_pid = server_pid(demo_dir)
        text = screen.wait_for(r"phase\s+ready", 120)  # the first use builds the tiny verifier
        # the ready line's immediate check asks /health and /v1/models only, so the model's details and
        # what the stand-in serves (header: a tiny real model with the train extra, or canned text) arrive
        # with the next full tick (on a busy machine, with the test command's other workers, a tick can
        # take longer than its interval)
        text = screen.wait_for(r"max_model_len \d+", 30)
        assert "kimi-k2.5-int4" in text
        screen.wait_for(r"SIMULATED: (tiny language model|canned text)", 30)

        # stop asks first; Enter answers the focused default, which is No
        screen.keys("x")
        screen.wait_for(r"Stop stage serve\?", 10)
        screen.keys("Enter")
        time.sleep(1.5)
        assert pid_alive(first_pid) and re.search(r"phase\s+ready", screen.text())

        # now really stop it: focus Yes, confirm
        screen.keys("x")
        screen.wait_for(r"Stop stage serve\?", 10)
        screen.keys("Tab", "Enter")
        screen.wait_for(r"phase\s+stopped", 60)
        deadline = time.monotonic() + 10
        while pid_alive(first_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(first_pid), Path(f"/proc/{first_pid}/status").read_text()[:300]
        assert "tmux -L" not in screen.text()

        # start it again with `s`: the command shows in the command log, the load runs to ready
        screen.keys("s")
        screen.wait_for(r"start serve: start server: done", 20)
        assert "tmux start session" in screen.text()
        screen.wait_for(r"phase\s+(starting|loading_weights|compiling|allocating|capturing|starting_api)", 30)
        screen.wait_for(r"phase\s+ready", 120)
        second_pid = server_pid(demo_dir)
        assert second_pid != first_pid and pid_alive(second_pid)

        # a generation run on the demo host, started with `s` on the generate stage
        screen.keys("j", "s")
        screen.wait_for(r"run\s+generate-\S+\s+running", 60)
        stage_pids = pids_running("backend.generate", str(demo_dir))
        assert stage_pids

        screen.keys("q")
        deadline = time.monotonic() + 30
        while screen.alive() and time.monotonic() < deadline:
            time.sleep(0.25)
        assert not screen.alive(), screen.text()
        # quitting --demo ends the demo host it started: no stray stand-in, no demo tmux server
        deadline = time.monotonic() + 10
        while pid_alive(second_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(second_pid)
        assert not [p for p in stage_pids if pid_alive(p)]
        tmux_env = {**os.environ, "TMUX_TMPDIR": str(demo_dir / "tmux")}
        tmux_env.pop("TMUX", None)
        left = subprocess.run(["tmux", "list-sessions"], capture_output=True, text=True, env=tmux_env)
        assert left.returncode != 0, left.stdout
    finally:
        screen.close()
        subprocess.run([sys.executable, "-m", "console.cli", "demo-host", "stop", "--dir", str(demo_dir)],
                       capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)


def test_demo_host_headless_start_status_stop(tmp_path):
    demo_dir = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TMUX", None)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                              env=env, timeout=120, cwd=ROOT)

    try:
        start = cli("demo-host", "start", "--dir", str(demo_dir), "--speed", "10")
        assert start.returncode == 0, start.stderr
        profile = start.stdout.strip()
        assert profile == str(demo_dir / "profile.toml")
        assert cli("wait-ready", "--profile", profile, "--timeout", "60").returncode == 0
        status = cli("demo-host", "status", "--dir", str(demo_dir))
        assert "SIMULATED" in status.stdout and "ready" in status.stdout
        snap = json.loads(cli("status", "--profile", profile, "--json").stdout)
        assert snap["host"]["simulated"] is True and snap["server"]["phase"] == "ready"
        pid = server_pid(demo_dir)
        assert cli("demo-host", "stop", "--dir", str(demo_dir)).returncode == 0
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(pid)
    finally:
        cli("demo-host", "stop", "--dir", str(demo_dir))


def test_a_second_demo_host_start_reuses_the_running_profile(tmp_path):
    """It rewrote the running demo's profile with a new port: every console using it lost the server."""
    demo_dir = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TMUX", None)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                              env=env, timeout=120, cwd=ROOT)

    try:
        first = cli("demo-host", "start", "--dir", str(demo_dir), "--speed", "10")
        assert first.returncode == 0, first.stderr
        profile = Path(first.stdout.strip())
        before = profile.read_bytes()
        second = cli("demo-host", "start", "--dir", str(demo_dir), "--speed", "10")
        assert second.returncode == 0, second.stderr
        assert second.stdout.strip() == str(profile) and "already running" in second.stderr
        assert profile.read_bytes() == before
        # the console opened on the running demo names its profile as a fresh start does ("demo", not the
        # file's stem "profile")
        again = asyncio.run(demo.running(demo_dir))
        assert again is not None and again.name == "demo"
        assert cli("wait-ready", "--profile", str(profile), "--timeout", "60").returncode == 0
    finally:
        cli("demo-host", "stop", "--dir", str(demo_dir))
