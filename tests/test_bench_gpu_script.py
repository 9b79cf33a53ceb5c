"""benchmarks/bench_gpu_speedup.py on a stock install: it imports nothing from tests/ (nor pytest), parses its
arguments, and the local host profile it drives the console's commands with loads and holds the pipeline's
settings; every step is a command the console's own parser accepts. The GPU run itself needs a GPU."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from console.cli import build_parser
from console.profile import load_profile
from harness.stock import GUARDED

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_gpu_speedup.py"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-c", GUARDED, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300, cwd="/")


def test_help_without_pytest_or_tests():
    res = run_script("--help")
    assert res.returncode == 0, res.stderr
    assert "--plan-only" in res.stdout and "--concurrency" in res.stdout


def test_plan_only_writes_a_profile_the_console_loads(tmp_path):
    work = tmp_path / "work"
    res = run_script("--plan-only", "--work", str(work), "--layers", "12", "--samples", "40", "--prompts", "8")
    assert res.returncode == 0, res.stderr
    profile = load_profile(work / "profile.toml")
    assert profile.host.transport == "local" and profile.server.manager == "tmux"
    assert profile.server.command[:3] == ["vllm", "serve", str(work / "verifier")]
    assert profile.drafter.aux_layer_ids == [2, 6, 9] and profile.drafter.verifier == str(work / "verifier")
    assert profile.extract.online is False and profile.train.gpus == 1
    assert profile.bench.dataset == str(work / "heldout.jsonl") and profile.bench.concurrency == [1, 8]
    assert len((work / "heldout.jsonl").read_text().splitlines()) == 8
    steps = [line.split(": eagle3-console ", 1)[1].split() for line in res.stdout.splitlines()
             if ": eagle3-console " in line]
    assert [s[0] if s[0] != "run" else s[1] for s in steps] == [
        "start-server", "wait-ready", "generate", "prepare", "extract", "stop-server", "train", "verify",
        "start-server", "wait-ready", "bench"]
    parser = build_parser()
    for argv in steps:
        parser.parse_args(argv)  # SystemExit on an option the console does not have


def test_too_few_layers_is_refused():
    res = run_script("--plan-only", "--layers", "4")
    assert res.returncode == 2 and "--layers must be at least 6" in res.stderr
