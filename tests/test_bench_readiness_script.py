"""benchmarks/bench_readiness.py's arguments, on a stock install (no pytest, nothing from tests/): which
measurement (the systemd rig over SSH by default, or the local tmux demo) and the refusals. The
measurement itself boots the rig and is run by hand (README: readiness through a forwarded port)."""
from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from harness.stock import GUARDED

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_readiness.py"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-c", GUARDED, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=120, cwd="/")


def test_help_names_both_measurements_without_pytest_or_tests():
    res = run_script("--help")
    assert res.returncode == 0, res.stderr
    assert "--over {systemd,tmux}" in res.stdout and "default; root" in res.stdout.replace("\n", " ")
    assert "--between {restart,stop-start}" in res.stdout  # an operator's restart of the same unit, by default


@pytest.mark.parametrize("args, message", [
    (["--over", "ssh"], "invalid choice: 'ssh'"),
    (["--trials", "0"], "--trials must be at least 1"),
    (["--over", "tmux", "--load-seconds", "0"], "--load-seconds above 0"),
    (["--over", "tmux", "--between", "restart"], "--between restart is systemd's"),
    (["--between", "reload"], "invalid choice: 'reload'"),
])
def test_bad_arguments_are_refused(args, message):
    res = run_script(*args)
    assert res.returncode == 2 and message in res.stderr, res.stderr


def test_systemd_without_root_says_why_and_what_to_run_instead(monkeypatch, tmp_path):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # nothing may be made before the refusal
    main = runpy.run_path(str(SCRIPT))["main"]
    with pytest.raises(SystemExit) as refused:
        main(["--trials", "1"])
    assert "needs root" in str(refused.value) and "--over tmux" in str(refused.value)
    assert not list(tmp_path.iterdir())
