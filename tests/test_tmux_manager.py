"""The tmux manager for real (a private tmux server per test): every last line a program prints reaches
its log, every exit status is known, stop is graceful then final, and arguments arrive literally."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from console.control.units import (UnitNameError, exit_status_path, server_log_path, tmux_start_argv,
                                   tmux_stop_argv)
from console.parsers.tmux import tmux_status
from console.profile import profile_from_dict
from console.telemetry.probe import service_argv

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tmux_env(tmp_path):
    sock = tmp_path / "tmux"  # short: tmux's socket path must stay under 108 bytes
    sock.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    env["TMUX_TMPDIR"] = str(sock)
    yield env
    subprocess.run(["tmux", "kill-server"], env=env, capture_output=True, timeout=30)


def sh(argv: list[str], env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def tmux_profile(work: Path, unit: str):
    return profile_from_dict({"host": {"name": "gpu-host.example", "transport": "local"},
                              "server": {"manager": "tmux", "unit": unit, "model_path": "/m", "port": 1},
                              "paths": {"work_dir": str(work)}})


def pane_dead(session: str, env: dict) -> bool:
    out = sh(["tmux", "list-panes", "-t", f"={session}", "-F", "#{pane_dead}"], env).stdout.split()
    return out == ["1"]


def wait_until(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_every_last_line_and_exit_status_arrives(tmp_path, tmux_env):
    """Many short programs that print a last line and exit non-zero at once (a loaded host): the old
    `tee` in the pane died with the pane's hang-up and lost those lines in most runs."""
    work = tmp_path / "w"
    count = 40
    profiles = [tmux_profile(work, f"e3t-{i}") for i in range(count)]
    for i, p in enumerate(profiles):
        script = f"i=0; while [ $i -lt 300 ]; do echo line $i; i=$((i+1)); done; echo 'LAST {i}'; exit {1 + i % 3}"
        res = sh(tmux_start_argv(p.server.unit, ["sh", "-c", script], server_log_path(p)), tmux_env)
        assert res.returncode == 0, res.stderr
    for p in profiles:
        wait_until(lambda: pane_dead(p.server.unit, tmux_env), f"{p.server.unit} to exit")
    for i, p in enumerate(profiles):
        lines = Path(server_log_path(p)).read_text().splitlines()
        assert lines[-1] == f"LAST {i}" and len(lines) == 301, (p.server.unit, lines[-3:])
        assert Path(exit_status_path(server_log_path(p))).read_text() == f"{1 + i % 3}\n"
        # the console's own reading of it: the probe's service command, then the parser
        res = sh(["sh", "-c", "; ".join(shlex.join(c) for c in service_argv(p))], tmux_env)
        st = tmux_status(p.server.unit, res.returncode, "", res.stdout)
        assert st.exit_status == 1 + i % 3 and st.service.active_state == "failed", (res.stdout, st)


def test_recorded_status_stands_in_for_an_empty_pane_dead_status():
    text = "4242 1 \ne3-exit-status 1\n"
    st = tmux_status("s", 0, "", text)
    assert st.exit_status == 1 and st.service.result == "exit-code"
    assert tmux_status("s", 0, "", "4242 1 \n").exit_status is None  # nothing recorded: unknown
    assert tmux_status("s", 0, "", "4242 1 0\ne3-exit-status 0\n").service.result == "success"


def test_stop_is_graceful_then_kills_the_whole_pane(tmp_path, tmux_env):
    work = tmp_path / "w"
    graceful = tmux_profile(work, "e3t-graceful")
    log = server_log_path(graceful)
    prog = [sys.executable, "-c", "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM, cleaning up', flush=True), sys.exit(0)))\n"
            "print('ready', flush=True)\ntime.sleep(60)"]
    assert sh(tmux_start_argv("e3t-graceful", prog, log), tmux_env).returncode == 0
    wait_until(lambda: Path(log).exists() and "ready" in Path(log).read_text(), "the program to start")
    assert sh(tmux_stop_argv("e3t-graceful", 10), tmux_env).returncode == 0
    assert Path(log).read_text().splitlines()[-1] == "got TERM, cleaning up"
    assert Path(exit_status_path(log)).read_text() == "0\n"

    stubborn = tmux_profile(work, "e3t-stubborn")
    log = server_log_path(stubborn)
    pid_file = tmp_path / "pid"
    prog = [sys.executable, "-c", "import os, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\nprint('ready', flush=True)\ntime.sleep(120)"]
    assert sh(tmux_start_argv("e3t-stubborn", prog, log), tmux_env).returncode == 0
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), "the program to start")
    pid = int(pid_file.read_text())
    res = sh(tmux_stop_argv("e3t-stubborn", 1), tmux_env)
    assert "SIGKILL" in res.stderr
    wait_until(lambda: not os.path.exists(f"/proc/{pid}")
               or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(),
               "the program itself to be killed, not only its wrapper", timeout=10)


def test_arguments_reach_the_program_literally(tmp_path, tmux_env):
    work = tmp_path / "w"
    log = f"{work}/logs/e3t-args.log"
    args = ["$HOME", "${HOME}", "$$", "#{pane_id}", "#(echo hi)", "a;b", "it's", '{"k": "$x"}', "%n", ""]
    prog = [sys.executable, "-c", "import json, os, sys; print(json.dumps([sys.argv[1:], os.getcwd(), "
            "os.environ.get('E3_T')]))", *args]
    argv = tmux_start_argv("e3t-args", prog, log, cwd=str(tmp_path), env={"E3_T": "v $HOME #{x}"})
    assert sh(argv, tmux_env).returncode == 0
    wait_until(lambda: pane_dead("e3t-args", tmux_env), "the program to exit")
    import json
    got = json.loads(Path(log).read_text().splitlines()[-1])
    assert got == [args, str(tmp_path), "v $HOME #{x}"]


@pytest.mark.parametrize("name", ["x\n", "a#b", "a.b", "a:b", "-a", "", "a b"])
def test_session_names_tmux_would_misread_are_refused(name):
    with pytest.raises(UnitNameError):
        tmux_start_argv(name, ["true"], "/tmp/x.log")
    with pytest.raises(UnitNameError):
        tmux_stop_argv(name, 1)


def test_a_stop_never_removes_a_session_started_after_its_program_exited(tmp_path, tmux_env):
    """The app lets the operator start the server again as soon as its pane is dead, while the stop
    command may still be running: the stop's clean-up must remove the session it stopped, never the new
    one of the same name (that killed the freshly started server with SIGHUP). The worst moment, made
    certain: a shim first on the stop's PATH marks the stop's last tmux command (the removal) and holds it
    a second, and the start runs inside that second. A removal asked after a separate check took the new
    session there (a loaded CI run hit the same order by chance)."""
    import shutil
    shim = tmp_path / "shim"
    shim.mkdir()
    real = shutil.which("tmux")
    removing = tmp_path / "removing"
    (shim / "tmux").write_text(f'#!/bin/sh\ncase $1 in kill-session|if-shell) touch {removing}; sleep 1;; esac\n'
                               f'exec {real} "$@"\n')
    (shim / "tmux").chmod(0o755)
    slow_env = {**tmux_env, "PATH": f"{shim}:{tmux_env['PATH']}"}
    log = str(tmp_path / "w" / "logs" / "e3t-race.log")
    prog = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"]
    assert sh(tmux_start_argv("e3t-race", prog, log), tmux_env).returncode == 0
    time.sleep(0.3)
    stop = subprocess.Popen(tmux_stop_argv("e3t-race", 10), env=slow_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not removing.exists():
        assert stop.poll() is None and time.monotonic() < deadline, "the stop never reached its removal"
        time.sleep(0.02)
    res = sh(tmux_start_argv("e3t-race", ["sleep", "60"], log), tmux_env)
    assert res.returncode == 0, res.stderr
    assert stop.poll() is None, "the start ran after the stop's removal, not inside it"
    _, stop_err = stop.communicate(timeout=30)
    panes = sh(["tmux", "list-panes", "-t", "=e3t-race", "-F", "#{pane_dead}"], tmux_env)
    assert panes.stdout.split() == ["0"], (panes.stdout, panes.stderr, stop_err)


def test_a_missing_session_on_a_busy_tmux_server_is_inactive(tmp_path, tmux_env):
    """With other sessions on the server, tmux answers `list-panes -t =NAME` with "can't find window"."""
    assert sh(["tmux", "new-session", "-d", "-s", "e3t-other"], tmux_env).returncode == 0
    p = tmux_profile(tmp_path / "w", "e3t-missing")
    res = sh(["sh", "-c", "; ".join(shlex.join(c) for c in service_argv(p))], tmux_env)
    st = tmux_status("e3t-missing", res.returncode, res.stdout + res.stderr, None)
    assert st.service.active_state == "inactive", (res.stderr, st)
