"""benchmarks/bench_real_engine.py, the GPU benchmark and its CPU twin, as far as a machine without a GPU can
check it: it imports nothing from tests/ (nor pytest), and writing its profile needs no torch (the GPU run
must never hold a CUDA context in its own process: the verifier is built in a child); its arguments are
checked; the local host profile it drives the console's commands with loads and holds the pipeline's
settings, and every step is a command the console's own parser accepts; what the run needs is checked up
front, each missing program or module named with what installs it. The GPU run itself needs a GPU; the CPU
run is the engine tier's (tests/test_engine_pipeline.py runs the same phases, harness/real_engine.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from console.cli import build_parser
from console.profile import load_profile
from harness.stock import GUARDED as STOCK

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_real_engine.py"
# and torch unimportable too: the GPU run must never hold a CUDA context in its own process
GUARDED = STOCK.replace("sys.argv =", "sys.modules['torch'] = None; sys.argv =", 1)


def run_script(*args: str, env: dict[str, str] | None = None, hidden: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The script as `python SCRIPT ARGS` on a stock install; `hidden`: modules made unimportable too."""
    hide = "".join(f"sys.modules[{m!r}] = None; " for m in hidden)
    return subprocess.run([sys.executable, "-I", "-c", GUARDED.replace("sys.argv =", hide + "sys.argv =", 1),
                           str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd="/", env=env)


def test_help_without_pytest_tests_or_torch():
    res = run_script("--help")
    assert res.returncode == 0, res.stderr
    for option in ("--device {cpu,cuda}", "--plan-only", "--concurrency", "--install", "--limit"):
        assert option in res.stdout
    assert "--build-verifier" not in res.stdout  # the child's own option


def test_plan_only_writes_a_profile_the_console_loads(tmp_path):
    work = tmp_path / "work"
    res = run_script("--device", "cuda", "--plan-only", "--work", str(work), "--layers", "12", "--samples", "40",
                     "--prompts", "8")
    assert res.returncode == 0, res.stderr
    profile = load_profile(work / "profile.toml")
    assert profile.host.transport == "local" and profile.server.manager == "tmux"
    command = profile.server.command
    # every server (baseline, extraction, drafter) starts from this line: one vLLM cache for all of them
    assert command[0] == "env" and command[1].startswith("VLLM_CACHE_ROOT=") and command[1].endswith("/vllm")
    assert command[2:5] == ["vllm", "serve", str(work / "verifier")] and "--max-num-seqs" in command
    assert profile.drafter.aux_layer_ids == [2, 6, 9] and profile.drafter.verifier == str(work / "verifier")
    assert profile.extract.online is False and profile.train.gpus == 1
    assert profile.bench.dataset == str(work / "heldout.jsonl") and profile.bench.concurrency == [8]  # one level
    assert len((work / "heldout.jsonl").read_text().splitlines()) == 8
    steps = [line.split(": eagle3-console ", 1)[1].split() for line in res.stdout.splitlines()
             if ": eagle3-console " in line]
    assert [s[0] if s[0] != "run" else s[1] for s in steps] == [
        "start-server", "wait-ready", "generate", "prepare", "extract", "stop-server", "train", "verify",
        "start-server", "wait-ready", "bench"]
    parser = build_parser()
    for argv in steps:
        parser.parse_args(argv)  # SystemExit on an option the console does not have


@pytest.mark.parametrize("args, says", [
    (["--device", "cuda", "--plan-only", "--layers", "4"], "--layers must be at least 6"),
    (["--device", "cuda", "--plan-only", "--hidden", "1000"], "--hidden must be a multiple of 256"),
    (["--device", "cuda", "--plan-only", "--concurrency", "8,x"], "--concurrency '8,x'"),
    (["--device", "cpu", "--plan-only"], "--plan-only is for --device cuda"),
    (["--device", "tpu"], "invalid choice: 'tpu'"),
    (["--plan-only"], "the following arguments are required: --device"),
])
def test_bad_arguments_are_refused(args, says):
    res = run_script(*args)
    assert res.returncode == 2 and says in res.stderr, res.stderr


def _tools(tmp_path: Path, *present: str) -> str:
    """A PATH holding only stand-ins for `present` (the script runs nothing from PATH before its checks)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in present:
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    return str(bin_dir)


def test_a_missing_tool_stops_the_cpu_run_before_anything_runs(tmp_path):
    """tmux and vLLM's CPU build, each named with what installs it; nothing is started (exit 2)."""
    env = {**os.environ, "PATH": _tools(tmp_path), "EAGLE3_VLLM_CPU_VENV": str(tmp_path / "no-venv")}
    res = run_script("--device", "cpu", "--dir", str(tmp_path / "demo"), env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "tmux is not on PATH: install it (apt-get install tmux)" in res.stderr
    assert f"vLLM's CPU build is not installed at {tmp_path / 'no-venv'}: sh " in res.stderr
    assert not (tmp_path / "demo").exists()
    with_tmux = run_script("--device", "cpu", "--dir", str(tmp_path / "demo"),
                           env={**env, "PATH": _tools(tmp_path, "tmux")})
    assert with_tmux.returncode == 2 and "tmux" not in with_tmux.stderr and "CPU build" in with_tmux.stderr


def test_the_gpu_runs_needs_are_named_up_front(tmp_path):
    """Without a GPU, vLLM or tmux the cuda run stops at once, naming each missing piece."""
    env = {**os.environ, "PATH": _tools(tmp_path)}
    res = run_script("--device", "cuda", "--work", str(tmp_path / "work"), env=env, hidden=("vllm",))
    assert res.returncode == 2, res.stdout + res.stderr
    for said in ("tmux is not on PATH", "`vllm` is not on PATH", "nvidia-smi is not on PATH",
                 "python module vllm is not importable"):
        assert said in res.stderr, res.stderr
    assert not (tmp_path / "work").exists()
    # a GPU driver that lists no GPU is named too
    (Path(_tools(tmp_path, "tmux", "vllm")) / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found' >&2\n"
                                                                       "exit 6\n")
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    res = run_script("--device", "cuda", "--work", str(tmp_path / "work"), env=env, hidden=("vllm",))
    assert "nvidia-smi -L lists no GPU (exit 6): No devices were found" in res.stderr, res.stderr
    assert "tmux is not on PATH" not in res.stderr


def test_a_missing_python_module_is_named_with_its_distribution(tmp_path):
    """tomli_w (the profile writer's) missing: the message names the distribution, tomli-w, and nothing runs."""
    res = run_script("--device", "cuda", "--plan-only", "--work", str(tmp_path / "w"), hidden=("tomli_w",))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "python module tomli_w is not importable" in res.stderr and "pip install 'tomli-w'" in res.stderr
    assert not (tmp_path / "w").exists()
