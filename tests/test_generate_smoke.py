"""The throughput smoke before a generation (backend/generate/smoke.py, issue 31 item 9): the parsers on
nvidia-smi's own output, the history as another program may have left it, and a generation run on the demo
host's stand-ins (sim/vllm_server.py, sim/nvidia_smi.py) whose start says the smoke beside the history."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from backend.generate import smoke
from harness.generate_support import REPO as ROOT, events, gen_argv, run_gen, write_dataset

# nvidia-smi --query-gpu=index,clocks_throttle_reasons.active --format=csv,noheader on an 8-GPU host: one idle
# GPU, one at its power cap, one slowed down for heat (NVML's bit values)
SMI_ROWS = ("0, 0x0000000000000001\n1, 0x0000000000000004\n2, 0x0000000000000060\n"
            "3, 0x0000000000000000\n")


def test_throttle_rows_parsed_and_named():
    rows = smoke.parse_throttle(SMI_ROWS + "garbage, line\n\n")
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["reasons"] == ["gpu_idle"]
    assert rows[2]["reasons"] == ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert rows[3]["reasons"] == []
    text = smoke.throttle_text(rows)
    assert "GPU 1: sw_power_cap" in text and "GPU 2: sw_thermal_slowdown" in text and "GPU 0" not in text
    assert smoke.throttle_text(smoke.parse_throttle("0, 0x0000000000000001\n")) == "no throttle reason on 1 GPU(s)"


def test_history_reads_only_finite_rates_of_the_same_model_and_concurrency(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    lines = [{"model": "m", "concurrency": 8, "tokens_per_s": 100.0},
             {"model": "m", "concurrency": 8, "tokens_per_s": 1e999},  # JSON's infinity: no reading
             {"model": "m", "concurrency": 8, "tokens_per_s": "fast"},
             {"model": "m", "concurrency": 16, "tokens_per_s": 400.0},
             {"model": "other", "concurrency": 8, "tokens_per_s": 50.0},
             {"model": "m", "concurrency": 8, "tokens_per_s": 120.0}]
    (state / "smoke.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{torn")
    assert smoke.read_history(str(tmp_path), "m", 8) == [100.0, 120.0]
    assert smoke.read_history(str(tmp_path / "none"), "m", 8) == []


def test_warnings_only_for_a_slow_burst_or_a_throttle_reason_other_than_idle():
    s = smoke.Smoke(model="m", concurrency=8, requests=8, completed=8, tokens_per_s=100.0,
                    history=[300.0, 310.0, 290.0], throttle=smoke.parse_throttle("0, 0x0000000000000001\n"))
    [slow] = smoke.judge(s)
    assert "100.0 tokens/s, 33% of this host's median 300.0" in slow
    s.tokens_per_s = 280.0
    assert smoke.judge(s) == []
    s.throttle = smoke.parse_throttle("0, 0x0000000000000040\n")
    [hot] = smoke.judge(s)
    assert "GPU 0: hw_thermal_slowdown" in hot
    first = smoke.Smoke(model="m", concurrency=8, requests=8, completed=8, tokens_per_s=5.0)
    assert smoke.judge(first) == []  # no history: nothing to compare with, never a refusal
    assert "no earlier smoke" in first.line()


def _smi(tmp_path: Path) -> list[str]:
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps({"gpus": [{"index": i, "name": "NVIDIA H200", "memory_used_mib": 0,
                                           "memory_total_mib": 143771} for i in range(2)]}))
    return [sys.executable, "-m", "sim.nvidia_smi", "--state", str(state)]


def test_a_generation_start_prints_the_smoke_beside_the_host_history(standin, tmp_path):
    """Done-when of issue 31 item 9: the start says the burst's rate beside this host's earlier smokes and
    the GPUs' throttle reasons (here a simulated thermal slowdown), as a warning; the run still runs."""
    server = standin()
    write_dataset(tmp_path / "d.jsonl", 4, bad=False)
    work = tmp_path / "w"
    (work / "state").mkdir(parents=True)
    # earlier smokes on this host, far faster than the stand-in can answer: this one is well below them
    (work / "state" / "smoke.jsonl").write_text("".join(
        json.dumps({"model": "kimi-sim", "concurrency": 8, "tokens_per_s": 1e9}) + "\n" for _ in range(3)))
    env = {**os.environ, "EAGLE3_SIM_CLOCK_REASONS": "0x20"}
    result = subprocess.run(gen_argv(server, tmp_path / "d.jsonl", work, "--nvidia-smi",
                                     json.dumps(_smi(tmp_path))),
                            cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if "throughput smoke:" in x and "tokens/s" in x)
    assert "this host's previous 3: median 1000000000.0 tokens/s" in line
    assert "GPU 0: sw_thermal_slowdown; GPU 1: sw_thermal_slowdown" in line
    assert "warning: the throughput smoke ran at" in result.stdout
    evs = events(work / "runs" / "r")
    start = next(e for e in evs if e["kind"] == "start")
    assert start["smoke"]["requests"] == 8 and start["smoke"]["completed"] == 8
    assert start["smoke"]["history"] == [1e9] * 3
    warnings = [e["message"] for e in evs if e["kind"] == "error" and not e["fatal"]]
    assert any("of this host's median" in w for w in warnings)
    assert any("GPU clocks are held down" in w for w in warnings)
    # the smoke is said before the work: the start event (which carries it) finds nothing done yet
    assert start["done"] == 0
    # this smoke joined the history: the next run compares with it too
    hist = smoke.read_history(str(work), "kimi-sim", 8)
    assert len(hist) == 4 and hist[-1] == start["smoke"]["tokens_per_s"]


def test_no_smoke_skips_it(standin, tmp_path):
    server = standin()
    write_dataset(tmp_path / "d.jsonl", 3, bad=False)
    result = run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--no-smoke"))
    assert result.returncode == 0, result.stderr
    assert "throughput smoke" not in result.stdout
    start = next(e for e in events(tmp_path / "w" / "runs" / "r") if e["kind"] == "start")
    assert start["smoke"] is None
    assert not (tmp_path / "w" / "state" / "smoke.jsonl").exists()


def test_the_console_keeps_the_smoke_cleaned_and_bounded():
    from console.telemetry.runs import smoke_facts

    got = smoke_facts({"tokens_per_s": 1e999, "history_median": 12.5, "history": [1, 2], "requests": "8",
                       "completed": 8, "throttle": [{"index": 0, "mask": 1, "reasons": ["gpu_idle"]},
                                                    {"index": 1, "mask": 0x20, "reasons": ["sw\x1b[31m_thermal"]}],
                       "warnings": ["slow\x07"] * 20})
    assert got["tokens_per_s"] is None and got["history_median"] == 12.5 and got["history_runs"] == 2
    assert got["requests"] == 0 and got["completed"] == 8
    assert got["throttled"] == ["GPU 1: sw_thermal"] and got["warnings"] == ["slow"] * 8
    assert smoke_facts(None) is None
