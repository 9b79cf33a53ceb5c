"""Headless exit codes and refusals: the server commands go through the keys' session actions (and their
refusals), an unreachable host is an error with a reason (never a traceback), the app's crash is a
non-zero exit, and unit names from a listing reach a message only when they are names this console gives."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from console import demo
from console.control.units import parse_live_stage_units
from console.profile import profile_from_dict

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    base = {**os.environ, "PYTHONPATH": str(ROOT)}
    base.pop("TMUX", None)
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          env={**base, **(env or {})}, timeout=timeout, cwd=ROOT)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("action", ["start-server", "stop-server", "restart-server"])
def test_server_commands_on_an_unreachable_host_say_why(tmp_path, action):
    """They used to die with NameError (HostError caught but never imported)."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps({
        "host": {"name": "127.0.0.1", "port": _closed_port(), "user": "nobody", "known_hosts": str(known)},
        "server": {"manager": "tmux", "unit": "e3t-gone", "model_path": "/m"}, "paths": {"work_dir": "/tmp/e3t"}}))
    res = cli(action, "--profile", str(path), "--yes")
    assert res.returncode == 3, res.stderr
    assert "Traceback" not in res.stderr and "NameError" not in res.stderr
    assert "error: 127.0.0.1:" in res.stderr


def test_start_server_is_refused_while_the_drafter_server_runs(tmp_path):
    """The `r` key and `s` on serve refuse to start the baseline beside the drafter server; so do the
    headless commands now (they used to start it regardless)."""
    profile = demo.prepare(tmp_path / "d")
    # the demo host's own tmux server (console/host/factory.py), never the operator's
    tmux_env = {**os.environ, "TMUX_TMPDIR": f"{profile.paths.work_dir}/tmux"}
    tmux_env.pop("TMUX", None)
    env = None
    drafter = f"{profile.server.unit}-drafter"
    try:
        subprocess.run(["tmux", "new-session", "-d", "-s", drafter, "sleep 300"], env=tmux_env, check=True)
        for action in ("start-server", "restart-server"):
            res = cli(action, "--profile", profile.source, "--yes", env=env)
            assert res.returncode == 1, (action, res.stdout, res.stderr)
            assert f"the drafter server runs in {drafter}" in res.stderr
        listing = subprocess.run(["tmux", "list-sessions", "-F", "#{session_name}"], env=tmux_env,
                                 capture_output=True, text=True).stdout.split()
        assert profile.server.unit not in listing  # nothing was started beside it
    finally:
        subprocess.run(["tmux", "kill-server"], env=tmux_env, capture_output=True)


def test_live_unit_listings_yield_only_our_names():
    p = profile_from_dict({"host": {"name": "h", "transport": "local"},
                           "server": {"manager": "tmux", "unit": "u", "model_path": "/m"}, "paths": {"work_dir": "/w"}})
    listing = "e3-generate-g1 0\ne3-generate-\x1b]52;c;Zm9v\x07 0\ne3-generate-a.b 0\ne3-generate-dead 1\nother 0\n"
    assert parse_live_stage_units(p, "generate", listing) == ["e3-generate-g1"]
    s = profile_from_dict({"host": {"name": "h"}, "server": {"unit": "u", "model_path": "/m"},
                           "paths": {"work_dir": "/w"}})
    units = "e3-train-t1.service loaded active running x\ne3-train-\x1b[2Jx.service loaded active running\n"
    assert parse_live_stage_units(s, "train", units) == ["e3-train-t1"]


def test_the_app_exits_non_zero_after_a_crash(tmp_path, monkeypatch):
    from console.commands.app_cmd import run_app
    from console.cli import build_parser
    from console.ui.app import ConsoleApp

    profile = demo.prepare(tmp_path / "d")

    def crash(self) -> None:
        raise RuntimeError("a pane blew up")

    run = ConsoleApp.run
    monkeypatch.setattr(ConsoleApp, "on_mount", crash)
    monkeypatch.setattr(ConsoleApp, "run", lambda self, **kw: run(self, headless=True, **kw))
    assert run_app(build_parser().parse_args(["--profile", profile.source])) == 1
