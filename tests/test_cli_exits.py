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


# -- the exit-code table (console/exitcodes.py) and the README's scripting contract ---------------------------

README_ROWS = {  # a headless row of the README (by how its first cell starts) -> the table's commands
    "`status ": ["status"], "`wait-ready ": ["wait-ready"],
    "`start-server`": ["start-server / stop-server / restart-server"],
    "`run generate ": ["run generate / prepare / extract / train / verify / pipeline / fetch-drafter"],
    "`run prepare\\|": ["run generate / prepare / extract / train / verify / pipeline / fetch-drafter"],
    "`run pipeline ": ["run generate / prepare / extract / train / verify / pipeline / fetch-drafter"],
    "`run fetch-drafter ": ["run generate / prepare / extract / train / verify / pipeline / fetch-drafter"],
    "`run serve-drafter ": ["run serve-drafter / serve-baseline"], "`run bench ": ["run bench"],
    "`run stop ": ["run stop"], "`runs disk ": ["runs disk"], "`runs prune ": ["runs prune"],
    "`demo-host ": ["demo-host"], "`profile init ": ["profile init", "profile check"],
    "`trust-host ": ["trust-host"],
}


def headless_rows() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Headless commands (the scripting contract)", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "the README's headless table is gone"
    return [(row[2:].split(" | ", 1)[0], row) for row in rows]


def test_the_readme_exit_code_table_is_the_one_in_console_exitcodes():
    from console import exitcodes

    text = (ROOT / "README.md").read_text()
    assert exitcodes.README_START in text and exitcodes.README_END in text
    shown = text.split(exitcodes.README_START, 1)[1].split(exitcodes.README_END, 1)[0].strip()
    assert shown == exitcodes.markdown(), "regenerate the README's table from console/exitcodes.markdown()"


def test_every_exit_code_the_headless_table_states_is_in_the_table():
    import re

    from console import exitcodes

    for first, row in headless_rows():
        keys = [v for k, v in README_ROWS.items() if first.startswith(k)]
        assert len(keys) == 1, f"README headless row {first!r}: name its commands in README_ROWS"
        codes = {code for key in keys[0] for code in exitcodes.TABLE[key]}
        for clause in re.findall(r"\bexits? \d[^;|]*", row):
            stated = {int(n) for n in re.findall(r"(?:\bexits? |, )(\d)\b", clause)}
            assert stated <= codes, f"{first}: the README says exit {sorted(stated - codes)}, the table " \
                                    f"(console/exitcodes.py) has {sorted(codes)} for {keys[0]}"


def test_no_bare_exit_numbers_in_the_commands():
    """The commands return the table's names, never a bare number (what 2 means is then said once)."""
    import ast

    files = [ROOT / "console" / "cli.py", *sorted((ROOT / "console" / "commands").glob("*.py"))]
    bare = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            value = None
            if isinstance(node, ast.Return) and node.value is not None:
                value = node.value.elts[0] if isinstance(node.value, ast.Tuple) and node.value.elts else node.value
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "SystemExit" and node.args:
                value = node.args[0]
            for part in ([value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]):
                if isinstance(part, ast.Constant) and type(part.value) is int:
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bare, f"bare exit codes (use console/exitcodes.py's names): {bare}"
