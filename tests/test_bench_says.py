"""What the bench says beyond speed (issue 30): acceptance split between reasoning and answer, the served
context against the drafter's, the bench's self-test against a set acceptance, and a reference line.

The pure pieces are checked on vLLM-shaped inputs (the synthetic sampler's settings as
vllm/config/speculative.py resolves them, chat stream chunks as vLLM sends them, --max-model-len as
vllm/utils/argparse_utils.py parses it); the bench itself runs against the stand-in with a set
acceptance (the demo host's server), where a set value must read back."""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import pytest

from harness.sim_support import REPO, SimServer

pytestmark = pytest.mark.timeout(300)
MODEL = "kimi"


# ---- the synthetic sampler, as vLLM resolves it --------------------------------------------------------------
def test_synthetic_length_resolves_to_vllms_minimum_variance_rates():
    from sim.specdec import conditional_rates, synthetic_rates

    assert synthetic_rates(3, None, 2.5) == (1.0, 0.5, 0.0)
    assert synthetic_rates(3, None, 2.0) == (1.0, 0.0, 0.0)
    assert synthetic_rates(3, None, 4.0) == (1.0, 1.0, 1.0)
    assert synthetic_rates(3, None, 1.0) == (0.0, 0.0, 0.0)
    assert synthetic_rates(3, [0.8, 0.6, 0.3], None) == (0.8, 0.6, 0.3)
    # vLLM's early-terminating loop takes conditional rates: c_i = p_i / p_(i-1)
    assert conditional_rates((0.8, 0.4, 0.0)) == pytest.approx((0.8, 0.5, 0.0))
    for args, says in [((3, None, 4.5), "must be in [1, 4], got 4.5"),
                       ((3, [0.5, 0.6, 0.1], None), "must be non-increasing"),
                       ((3, [0.5, 0.4], None), "must have length 3"),
                       ((3, [0.5, 0.4, 0.1], 2.0), "exactly one of"),
                       ((3, None, None), "exactly one of")]:
        with pytest.raises(ValueError, match=re.escape(says)):
            synthetic_rates(*args)


def test_synthetic_acceptance_ignores_what_the_draft_proposed():
    import torch

    from sim.specdec import accept_synthetic, conditional_rates

    gen = torch.Generator().manual_seed(0)
    assert {accept_synthetic(conditional_rates((1.0, 0.0, 0.0)), [5, 6, 7], gen) for _ in range(50)} == {1}
    assert {accept_synthetic(conditional_rates((1.0, 1.0, 1.0)), [5, 6, 7], gen) for _ in range(50)} == {3}
    drawn = [accept_synthetic(conditional_rates((1.0, 0.5, 0.0)), [5, 6, 7], gen) for _ in range(4000)]
    assert set(drawn) == {1, 2} and 1 + sum(drawn) / len(drawn) == pytest.approx(2.5, abs=0.05)


def test_the_stand_in_reads_the_synthetic_keys_as_vllm_does():
    from sim.config import parse_args

    def spec(**keys):
        return ["--model", "m", "--speculative-config",
                json.dumps({"method": "eagle3", "model": "/nothing/there", "num_speculative_tokens": 3, **keys})]

    cfg = parse_args(spec(rejection_sample_method="synthetic", synthetic_acceptance_length=2.5))
    assert cfg.synthetic_rates == (1.0, 0.5, 0.0) and cfg.drafter_mode == "simulated"
    assert parse_args(spec()).synthetic_rates is None
    for keys in ({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 4.5},
                 {"synthetic_acceptance_length": 2.0},  # vLLM: only valid with the synthetic method
                 {"rejection_sample_method": "synthetic"}):
        with pytest.raises(SystemExit) as exc:
            parse_args(spec(**keys))
        assert exc.value.code == 2


# ---- the self-test's verdict ---------------------------------------------------------------------------
def _level(drafts: float, accepted: float, k: int = 3):
    from backend.bench.results import LevelResult
    from backend.bench.scrape import Acceptance

    acc = Acceptance(drafts=drafts, draft_tokens=drafts * k, accepted=accepted, rate=accepted / (drafts * k),
                     length=1 + accepted / drafts, per_position=tuple([accepted / drafts / k] * k))
    return LevelResult(concurrency=1, completed=1, failed=0, duration_s=1.0, total_input_tokens=1,
                       total_output_tokens=1, request_throughput=1.0, output_throughput=1.0,
                       total_token_throughput=1.0, latency_ms={}, acceptance=acc)


def test_the_self_test_reads_back_or_says_it_does_not():
    from backend.bench.selftest import UNAVAILABLE_CPU, check_length, judge, refused_on_cpu

    ok = judge(2.0, [_level(500, 490), _level(500, 500)])
    assert ok.ok and ok.line() == "self-test: set 2.00, read 1.99: ok (within 0.05, 1000 drafts)"
    off = judge(2.5, [_level(100, 100)])
    assert not off.ok and off.line().startswith("self-test: set 2.50, read 2.00: FAILED (off by 0.50, more than "
                                                "the tolerance 0.05, 100 drafts)")
    none = judge(2.0, [])
    assert not none.ok and "read nothing: FAILED" in none.line() and "synthetic" in none.line()
    assert check_length(0.5) and check_length(float("nan")) and check_length(4.5, 3) and check_length(2.0, 3) is None
    assert refused_on_cpu("AssertionError: Synthetic acceptance not supported with CPU sampling")
    assert "not available on vLLM's CPU build" in UNAVAILABLE_CPU


# ---- the reference line --------------------------------------------------------------------------------
def test_the_reference_line_says_how_far_and_at_which_k():
    from backend.bench.compare import Reference, check_reference

    ref = Reference(2.88, 3)
    assert ref.line("drafter", 1.84, 3) == "reference 2.88 (K=3); drafter 1.84 (K=3): -1.04, 64% of the reference"
    assert "another K than the reference's" in ref.line("drafter-k2", 1.7, 2)
    assert ref.line("drafter", None, None) == "reference 2.88 (K=3); drafter: no acceptance measured"
    assert check_reference(2.88, 3) is None
    assert check_reference(4.5, 3) == ("reference_acceptance: expected an acceptance length from 1 to "
                                       "reference_k + 1 = 4 (1 + accepted tokens per draft at K=3), got 4.5")
    assert check_reference(float("inf"), 3).startswith("reference_acceptance: expected a finite number")
    assert check_reference(2.0, 0).startswith("reference_k: expected")


PROFILE = {"host": {"name": "h"}, "server": {"unit": "vllm-kimi", "model_path": "/m"}, "paths": {"work_dir": "/w"}}


@pytest.mark.parametrize("bench, key, says", [
    ({"reference_acceptance": 4.5, "reference_k": 3}, "bench.reference_acceptance",
     "expected an acceptance length from 1 to reference_k + 1 = 4"),
    ({"reference_acceptance": 2.88}, "bench.reference_k", "expected reference_acceptance and reference_k together"),
    ({"reference_k": 3}, "bench.reference_acceptance", "expected reference_acceptance and reference_k together"),
    ({"reference_acceptance": float("nan"), "reference_k": 3}, "bench.reference_acceptance", "finite number"),
    ({"reference_acceptance": 0.5, "reference_k": 3}, "bench.reference_acceptance", "expected a number from 1"),
    ({"reference_acceptance": "2.88", "reference_k": 3}, "bench.reference_acceptance", "expected a number"),
])
def test_the_profile_reference_is_validated_with_file_key_and_expectation(bench, key, says):
    from console.profile import ProfileError, profile_from_dict

    data = copy.deepcopy(PROFILE)
    data["bench"] = bench
    with pytest.raises(ProfileError) as exc:
        profile_from_dict(data, file="p.toml")
    assert any(k == key and says in msg for k, msg in exc.value.problems), exc.value.problems
    assert str(exc.value).startswith(f"p.toml: {key}: ")


def test_a_valid_reference_reads_and_round_trips():
    from console.profile import profile_from_dict

    data = copy.deepcopy(PROFILE)
    data["bench"] = {"reference_acceptance": 2.88, "reference_k": 3}
    p = profile_from_dict(data, file="p.toml")
    assert (p.bench.reference_acceptance, p.bench.reference_k, p.bench.split_prompts) == (2.88, 3, 4)
    assert "reference_acceptance = 2.88" in p.to_toml()


@pytest.mark.parametrize("extra, says", [
    (["--self-test", "0.5"], "--self-test 0.5: expected a finite acceptance length >= 1"),
    (["--self-test", "2", "--self-test-tolerance", "0"], "--self-test-tolerance 0.0: expected (0, 1]"),
    (["--reference-acceptance", "2.88"], "go together"),
    (["--reference-acceptance", "4.5", "--reference-k", "3"], "--reference-acceptance 4.5: expected an acceptance"),
    (["--split-prompts", "-1"], "--split-prompts -1: expected 0..1000"),
])
def test_the_bench_refuses_bad_new_flags(extra, says):
    from backend.bench.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_config(["--work-dir", "/w", "--run-id", "r", "--endpoint", "http://127.0.0.1:8000", "--model", "m",
                      "--prompts", "p.jsonl", *extra])


# ---- reasoning and answer ------------------------------------------------------------------------------
def test_stream_events_are_told_apart_as_vllm_sends_them():
    from backend.bench.phases import event_phase

    def chunk(**delta):
        return {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}

    assert event_phase(chunk(role="assistant", content="")) is None
    assert event_phase(chunk(reasoning="Let me think")) == "reasoning"  # vLLM >= 0.13
    assert event_phase(chunk(reasoning_content="Let me think")) == "reasoning"  # before
    assert event_phase(chunk(content="The answer")) == "answer"
    assert event_phase({"choices": [], "usage": {"completion_tokens": 9}}) is None
    assert event_phase([1, 2]) is None and event_phase({"choices": [{"delta": "odd"}]}) is None


def test_phase_windows_pool_as_vllm_defines_the_length():
    from backend.bench.phases import pool
    from backend.bench.scrape import SpecCounters, acceptance_between

    a = acceptance_between(SpecCounters(10, 30, 20, {0: 8, 1: 7, 2: 5}), SpecCounters(20, 60, 45, {0: 17, 1: 15, 2: 13}))
    b = acceptance_between(SpecCounters(), SpecCounters(30, 90, 30, {0: 20, 1: 8, 2: 2}))
    pooled = pool([a, None, b])
    assert pooled.drafts == 40 and pooled.length == pytest.approx(1 + 55 / 40)
    assert pooled.per_position == pytest.approx((29 / 40, 16 / 40, 10 / 40))
    assert pool([None]) is None


# ---- the served context against the drafter's ------------------------------------------------------------
def test_max_model_len_is_read_as_vllm_reads_it():
    from backend.drafter.context import parse_length, served_context

    assert [parse_length(v) for v in ("32768", "32k", "32K", "25.6k", "1M", "auto", "-1", "1.5K", "x")] == [
        32768, 32000, 32768, 25600, 1048576, None, None, None, None]
    assert served_context(["vllm", "serve", "/m", "--max-model-len", "4096", "-tp", "8"]) == 4096
    assert served_context(["vllm", "serve", "/m", "--max_model_len=8k", "--max-model-len", "16K"]) == 16384
    assert served_context(["vllm", "serve", "/m"]) is None


def test_a_served_context_past_the_drafters_is_named_with_both_numbers_and_the_issue():
    from backend.drafter.context import context_warning, drafter_context

    assert drafter_context({"transformer_layer_config": {"max_position_embeddings": 2048}}) == 2048
    assert drafter_context({"max_position_embeddings": 4096}) == 4096
    assert drafter_context({"transformer_layer_config": {"max_position_embeddings": True}}) is None
    said = context_warning(262144, 2048, "/ck")
    assert "262144" in said and "2048" in said and "/ck/config.json" in said and "vLLM issue 58080" in said
    assert context_warning(2048, 2048, "/ck") is None and context_warning(None, 2048, "/ck") is None


# ---- the pane ---------------------------------------------------------------------------------------------
def test_the_pane_rebuilds_the_notes_from_numbers_only():
    from console.telemetry.bench_view import summary_notes

    summary = {"reference": {"length": 2.88, "k": 3, "label": "drafter", "measured": 1.84, "measured_k": 3},
               "phases": {"label": "drafter", "requests": 4, "spill": 1,
                          "reasoning": {"length": 2.1, "drafts": 400.0}, "answer": {"length": 1.6, "drafts": 90.0}},
               "self_test": {"set": 2.0, "read": 1.98, "ok": True}}
    assert summary_notes(summary) == (
        "reference 2.88 (K=3); drafter 1.84 (K=3): -1.04, 64% of the reference",
        "acceptance by phase (drafter, 4 requests one at a time): reasoning 2.10 (400 drafts), answer 1.60 "
        "(90 drafts); up to 1 answer steps counted as reasoning",
        "self-test: set 2.00, read 1.98: ok")
    hostile = {"reference": {"length": 9e99, "k": 3}, "phases": {"reasoning": {"length": "2"}, "answer": None},
               "self_test": {"set": "2", "ok": True}}
    assert summary_notes(hostile) == ("acceptance by phase (drafter, 0 requests one at a time): reasoning -, "
                                      "answer -; up to 0 answer steps counted as reasoning",)
    assert summary_notes(None) == ()


# ---- the bench against the stand-in with a set acceptance --------------------------------------------------
@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("says") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}"}]}) + "\n"
                            for i in range(4)))
    return path


def stand_in(tmp_path, *args: str) -> SimServer:
    # a step at a time (a small per-token latency): /metrics grows step by step, as vLLM's does
    return SimServer(tmp_path, "--served-model-name", MODEL, "--latency-per-token", "0.001",
                     "--response-tokens", "240", *args).start().wait_ready()


def bench(tmp_path, sim: SimServer, prompts, run_id: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "backend.bench", "--work-dir", str(tmp_path / "w"), "--run-id", run_id,
           "--endpoint", sim.url, "--model", MODEL, "--prompts", str(prompts), "--num-prompts", "4",
           "--max-tokens", "240", "--concurrency", "1,2", "--client", "ours", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=240)


def synthetic(length: float) -> list[str]:
    return ["--speculative-config", json.dumps({"method": "eagle3", "model": "/nothing/there",
                                                "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
                                                "synthetic_acceptance_length": length})]


def test_a_set_acceptance_reads_back_and_a_wrong_expectation_fails(tmp_path, prompts):
    sim = stand_in(tmp_path, *synthetic(2.5))
    try:
        good = bench(tmp_path, sim, prompts, "st-ok", "--self-test", "2.5", "--reference-acceptance", "2.88",
                     "--reference-k", "3")
        wrong = bench(tmp_path, sim, prompts, "st-wrong", "--self-test", "2.0")
    finally:
        sim.kill()
    assert good.returncode == 0, good.stderr
    assert "self-test: set 2.50, read 2.50: ok" in good.stdout
    assert "reference 2.88 (K=3); baseline 2.50 (K=3): -0.38, 87% of the reference" in good.stdout
    summary = json.loads((tmp_path / "w" / "runs" / "st-ok" / "summary.json").read_text())
    assert summary["self_test"]["ok"] is True and summary["self_test"]["read"] == pytest.approx(2.5, abs=0.05)
    assert summary["reference"] == {"length": 2.88, "k": 3, "label": "baseline",
                                    "measured": pytest.approx(2.5, abs=0.05), "measured_k": 3}
    assert wrong.returncode == 1
    assert "self-test: set 2.00, read 2.50: FAILED (off by 0.50" in wrong.stderr + wrong.stdout
    assert "do not trust a drafter's figures from it" in wrong.stderr + wrong.stdout


def test_a_server_without_a_drafter_fails_the_self_test_saying_so(tmp_path, prompts):
    sim = stand_in(tmp_path)
    try:
        out = bench(tmp_path, sim, prompts, "st-none", "--self-test", "2.0")
    finally:
        sim.kill()
    assert out.returncode == 1
    assert "self-test: set 2.00, read nothing: FAILED (the server counted no drafts" in out.stderr + out.stdout


def test_reasoning_and_answer_are_measured_apart(tmp_path, prompts):
    # the SIMULATED drafter drafts the thinking at 1 + 0.9 + 0.8 + 0.7 = 3.4 and the answer at 1.8
    sim = stand_in(tmp_path, "--drafter", "/nothing/there", "--acceptance", "0.9,0.8,0.7",
                   "--answer-acceptance", "0.5,0.2,0.1")
    try:
        out = bench(tmp_path, sim, prompts, "split", "--split-prompts", "4")
    finally:
        sim.kill()
    assert out.returncode == 0, out.stderr
    phases = json.loads((tmp_path / "w" / "runs" / "split" / "summary.json").read_text())["phases"]
    assert phases["requests"] == 4 and phases["with_reasoning"] == 4
    # the step that carries the first answer tokens counts as reasoning (a stated limit): a few tenths on
    # answers this short, nothing on thousands of thinking tokens
    assert phases["reasoning"]["length"] == pytest.approx(3.4, abs=0.25)
    assert phases["answer"]["length"] == pytest.approx(1.8, abs=0.15)
    assert "acceptance by phase (4 requests one at a time, 4 with reasoning" in out.stdout


def test_run_bench_refuses_a_longer_served_context_unless_told_yes():
    from console.control.launch import Launcher, StageError
    from console.control.units import ServerProgram
    from console.profile import profile_from_dict

    shown: list[str] = []
    launcher = Launcher(None, profile_from_dict(copy.deepcopy(PROFILE), file="p.toml"), {}, shown)  # no host asked
    program = ServerProgram(("vllm", "serve", "/m", "--max-model-len", "32K"))
    found = {"checkpoint": "/runs/t/checkpoint_best", "max_position_embeddings": 4096}
    with pytest.raises(StageError) as exc:
        launcher.context_check(program, found, refuse=True)
    said = str(exc.value)
    assert "32768" in said and "4096" in said and "vLLM issue 58080" in said and "run bench --yes" in said
    assert "nothing was stopped" in said and not shown
    launcher.context_check(program, found, refuse=False)  # --yes: shown with the plan, not refused
    assert len(shown) == 1 and shown[0].startswith("(bench) warning: the served context (32768 tokens")
    # within the drafter's length, or a length it cannot tell: nothing to say
    launcher.context_check(ServerProgram(("vllm", "serve", "/m", "--max-model-len", "4096")), found, refuse=True)
    launcher.context_check(ServerProgram(("vllm", "serve", "/m")), found, refuse=True)
    launcher.context_check(program, {"checkpoint": "/ck", "max_position_embeddings": None}, refuse=True)
    assert len(shown) == 1


def test_verify_is_told_the_served_context_by_the_console():
    from console.control.stage_argv import verify_argv
    from console.profile import profile_from_dict

    p = profile_from_dict(copy.deepcopy(PROFILE), file="p.toml")
    assert verify_argv(p, "v1", "t1", served_context=262144)[-2:] == ["--served-context", "262144"]
    assert "--served-context" not in verify_argv(p, "v1", "t1")
