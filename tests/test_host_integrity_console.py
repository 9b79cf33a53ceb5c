"""The host's integrity as the console asks it (console/control/integrity.py, `python -m backend.ask
integrity`): `profile check` on the demo host with two `vllm` executables on its PATH warns naming both, and
the answer's parser keeps warnings apart from the refusal of a leftover server."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from console import demo
from console.control.integrity import integrity_argv, parse_integrity

ROOT = Path(__file__).resolve().parents[1]


def test_the_answer_splits_warnings_from_a_leftover_refusal():
    answer = json.dumps({"ok": False, "checks": [
        {"name": "vllm_installs", "ok": False, "detail": "vllm importable from /a/vllm, /b/vllm\x1b[2J",
         "fix": "keep one", "warning": True},
        {"name": "driver_cuda", "ok": True, "detail": "driver 570.133.20", "fix": "", "warning": True},
        {"name": "server_port", "ok": False, "detail": "port 8000: pid 7 in old.service listens",
         "fix": "stop the leftover", "warning": False}]})
    got = parse_integrity(answer)
    assert got.warnings == ["vllm_installs: vllm importable from /a/vllm, /b/vllm -> keep one"]
    assert got.refusals == ["server_port: port 8000: pid 7 in old.service listens -> stop the leftover"]
    assert parse_integrity("Traceback (most recent call last)").note == "the host's answer was not JSON"


def test_profile_check_on_the_demo_host_warns_of_two_vllm_installs(tmp_path):
    profile = demo.prepare(tmp_path / "demo")
    argv = integrity_argv(profile)
    assert argv[2:4] == ["backend.ask", "integrity"] and "--nvidia-smi" in argv  # the simulated GPUs
    bins = []
    for d in ("venv-old/bin", "venv-new/bin"):  # a previous model's venv left on PATH beside the current one
        (tmp_path / d).mkdir(parents=True)
        exe = tmp_path / d / "vllm"
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
        bins.append(str(tmp_path / d))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": os.pathsep.join([*bins, os.environ["PATH"]])}
    res = subprocess.run([sys.executable, "-m", "console.cli", "profile", "check", str(profile.source)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr  # a warning, never a refusal
    line = next(x for x in res.stdout.splitlines() if x.startswith("warning: host integrity: vllm_installs"))
    assert str(tmp_path / "venv-old/bin/vllm") in line and str(tmp_path / "venv-new/bin/vllm") in line
    assert "pip uninstall vllm" in line
    clean_env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ok = subprocess.run([sys.executable, "-m", "console.cli", "profile", "check", str(profile.source)],
                        capture_output=True, text=True, env=clean_env, cwd=ROOT, timeout=120)
    assert ok.returncode == 0 and "vllm_installs" not in ok.stdout, ok.stdout + ok.stderr


def test_a_generate_start_passes_the_baselines_command_line_redacted(tmp_path):
    """Where the host hides the listening process (a root unit, a non-root SSH user), the run records the
    baseline's command line as the profile states it, never its secret."""
    from backend.kit.redact import redacted
    from console.control.server_argv import server_command
    from console.control.stage_argv import generate_argv

    profile = demo.prepare(tmp_path / "demo")
    profile.server.command = [*profile.server.command, "--api-key", "sk-secret"]
    argv = generate_argv(profile, "g1")
    sent = json.loads(argv[argv.index("--server-command") + 1])
    assert sent == redacted(server_command(profile)) and sent[-2:] == ["--api-key", "***"]
    assert "sk-secret" not in " ".join(argv)
