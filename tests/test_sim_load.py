"""The stand-in's start-up: log lines in vLLM's order per version, refused while loading, GPUs filling
and emptying, SIGTERM at any time, and the load-time faults."""
from __future__ import annotations

import json
import re
import socket
import time

import httpx
import pytest

from sim.gpu_state import read_state
from harness.sim_support import SimServer, free_port

pytestmark = pytest.mark.timeout(60)

COMMON = [
    "vLLM server version {v}, serving model /shared/kimi-k2.5-int4",
    "non-default args: {{",
    "Initializing a V1 LLM engine (v{v}) with config: ",
    "{weights_start}",
    "Loading safetensors checkpoint shards: 100% Completed | 4/4 [",
    "Loading weights took ",
    "Model loading took ",
    "Dynamo bytecode transform time: ",
    "torch.compile ",
    "Available KV cache memory: ",
    "GPU KV cache size: ",
    "Maximum concurrency for 262,144 tokens per request: ",
    "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|",
    "Graph capturing finished in ",
    "init engine (profile, create kv cache, warmup model) took ",
    "Starting vLLM ",
    "Available routes are:",
    "Route: /health, Methods: GET",
    "INFO:     Started server process [",
    "INFO:     Waiting for application startup.",
    "INFO:     Application startup complete.",
]


def _in_order(text: str, markers: list[str]) -> None:
    pos = 0
    for m in markers:
        found = text.find(m, pos)
        assert found >= 0, f"{m!r} missing after offset {pos}:\n{text[pos:pos + 2000]}"
        pos = found + len(m)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


# the model runner's own lines, per version (vLLM's sources: /work/shared/notes/vllm-surface.md)
V1_START = "[gpu_model_runner.py:4978] Starting to load model /shared/kimi-k2.5-int4..."
V2_START = "[gpu_worker.py:513] Using V2 Model Runner"
RUNNER_LINES = {
    # the V1 runner up to 0.11 says both, then `X GiB and`; no aux layers line
    ("0.10.2", ""): (["Starting to load model /shared/kimi-k2.5-int4...", "Loading model from scratch..."],
                     "Model loading took 70.0000 GiB and "),
    ("0.13.0", ""): ([V1_START], "Model loading took 70.0000 GiB memory and "),
    # 0.33 picks the V2 runner for every model; VLLM_USE_V2_MODEL_RUNNER=0 forces the V1 one, as in vLLM
    ("0.33.0", ""): ([V2_START, "[model_runner.py:399] Loading model from scratch..."],
                     "[model_runner.py:428] Model loading took 70.0 GiB memory and "),
    ("0.33.0", "0"): ([V1_START], "[gpu_model_runner.py:5088] Model loading took 70.0 GiB memory and "),
}


@pytest.mark.parametrize("version, forced", sorted(RUNNER_LINES))
def test_load_sequence_per_version(tmp_path, version, forced):
    starts, took = RUNNER_LINES[version, forced]
    env = {"VLLM_USE_V2_MODEL_RUNNER": forced} if forced else None
    sim = SimServer(tmp_path, "--vllm-version", version, load_seconds=1.2, env=env).start()
    try:
        sim.wait_for(starts[-1])
        assert _refused(sim.port)  # bound, not listening, while loading
        sim.wait_ready()
        assert sim.get("/health").status_code == 200
        assert sim.terminate() == 0
    finally:
        sim.kill()
    raw = sim.out_path.read_bytes()
    assert sim.log_path.read_bytes() == raw  # the log file gets the same bytes, \r included
    text = raw.decode()
    markers = [m.format(v=version, weights_start="\n".join(starts)) for m in COMMON]
    _in_order(text, [*markers[:3], *starts, *markers[4:], "[shutdown]"])
    assert took in text and text.count("Model loading took") == 1
    v2 = V2_START in starts
    assert ("Starting to load model" in text) == (not v2) and ("Loading drafter model" not in text)
    pid = sim.proc.pid
    lines = text.split("\n")
    if version >= "0.11":
        assert lines[0].startswith(f"(APIServer pid={pid}) INFO ")
        assert re.match(r"\(APIServer pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d \[api_server\.py:\d+\] vLLM", lines[0])
        assert f"(EngineCore_DP0 pid={pid + 1}) INFO " in text and f"(Worker_TP0 pid={pid + 2}) INFO " in text
        assert f"(APIServer pid={pid}) INFO:     Application startup complete." in text
    else:
        assert re.match(r"INFO \d\d-\d\d \d\d:\d\d:\d\d \[api_server\.py:\d+\] vLLM server version", lines[0])
        assert "pid=" not in text.replace("Started server process", "")
        assert "\nINFO:     Application startup complete." in text
    bar_line = next(line for line in lines if "checkpoint shards" in line)
    prefix = f"(Worker_TP0 pid={pid + 2}) " if version >= "0.11" else ""
    assert bar_line.startswith(prefix + "\rLoading safetensors checkpoint shards:   0% Completed | 0/4 [")
    assert bar_line.count("\r") == 5 and bar_line.split("\r")[-1].startswith(
        "Loading safetensors checkpoint shards: 100% Completed | 4/4 [")
    new = version >= "0.18"
    assert ("Starting vLLM server on http://127.0.0.1:" in text) == new
    assert ("Starting vLLM API server 0 on http://127.0.0.1:" in text) == (not new)
    one_line = re.search(r"GPU KV cache size: [\d,]+ tokens, Maximum concurrency for", text)
    assert bool(one_line) == new
    assert ("torch.compile takes " in text) == (version < "0.17")


def test_gpu_memory_rises_then_falls(tmp_path):
    sim = SimServer(tmp_path, "--gpus", "2", load_seconds=1.5, shards=6).start()
    seen = []
    try:
        deadline = time.monotonic() + 15
        while "Application startup complete." not in sim.output() and time.monotonic() < deadline:
            if sim.state_path.exists():
                seen.append(read_state(str(sim.state_path)).gpus[0].memory_used_mib)
            time.sleep(0.05)
        sim.wait_ready()
        ready = read_state(str(sim.state_path))
        raw = json.loads(sim.state_path.read_text())
        assert raw["pid"] == sim.proc.pid and len(ready.gpus) == 2
        assert 0.85 < ready.gpus[0].memory_used_mib / ready.gpus[0].memory_total_mib < 0.93
        weights_mib = 70 * 1024
        assert any(1000 < m < weights_mib for m in seen)  # part-way through the weights
        assert seen == sorted(seen)  # never falls during load
        for _ in range(30):
            sim.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
        assert sim.terminate() == 0
        after = read_state(str(sim.state_path))
        assert [g.memory_used_mib for g in after.gpus] == [4, 4] and json.loads(sim.state_path.read_text())["pid"] is None
    finally:
        sim.kill()


def test_sigkill_leaves_a_dead_pid_that_reads_as_idle(tmp_path):
    sim = SimServer(tmp_path).start()
    try:
        sim.wait_ready()
        assert read_state(str(sim.state_path)).gpus[0].memory_used_mib > 100_000
    finally:
        sim.kill()
    assert json.loads(sim.state_path.read_text())["pid"] == sim.proc.pid  # not reset: it was killed
    assert read_state(str(sim.state_path)).gpus[0].memory_used_mib == 4


def test_sigterm_during_load(tmp_path):
    sim = SimServer(tmp_path, load_seconds=5).start()
    try:
        sim.wait_for("Loading safetensors checkpoint shards:")
        assert sim.terminate() == 0
    finally:
        sim.kill()
    out = sim.output()
    assert "[shutdown]" in out and "Application startup complete." not in out
    assert read_state(str(sim.state_path)).gpus[0].memory_used_mib == 4


def test_crash_during_load(tmp_path):
    sim = SimServer(tmp_path, "--fault", "crash-during-load:0.5", shards=8).start()
    try:
        assert sim.wait_exit() == 1
    finally:
        sim.kill()
    out = sim.output()
    assert "50% Completed | 4/8" in out and "Application startup complete." not in out
    _in_order(out, ["Loading model from scratch...", "EngineCore failed to start.", "Traceback (most recent call last):",
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
                    "RuntimeError: Engine core initialization failed. See root cause above."])
    assert read_state(str(sim.state_path)).gpus[0].memory_used_mib == 4


def test_weights_too_big_run_out_of_memory(tmp_path):
    sim = SimServer(tmp_path, "--weights-gib", "200").start()
    try:
        assert sim.wait_exit() == 1
    finally:
        sim.kill()
    assert "torch.OutOfMemoryError: CUDA out of memory" in sim.output()


def test_nccl_error(tmp_path):
    sim = SimServer(tmp_path, "--fault", "nccl-error").start()
    try:
        assert sim.wait_exit() == 1
    finally:
        sim.kill()
    out = sim.output()
    _in_order(out, ["Initializing a V1 LLM engine", "WorkerProc failed to start.", "NCCL error in:",
                    "EngineCore failed to start.", "RuntimeError: Engine core initialization failed."])
    assert "Loading model from scratch" not in out and "Starting to load model" not in out


def test_address_in_use_real_and_simulated(tmp_path):
    port = free_port()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen(1)
        sim = SimServer(tmp_path, port=port).start()
        try:
            assert sim.wait_exit() == 1
        finally:
            sim.kill()
        assert "OSError: [Errno 98] Address already in use" in sim.output()
    sim = SimServer(tmp_path, "--fault", "address-in-use").start()
    try:
        assert sim.wait_exit() == 1
    finally:
        sim.kill()
    assert "OSError: [Errno 98] Address already in use" in sim.output()
    assert "Loading model from scratch" not in sim.output() and "Starting to load model" not in sim.output()


def test_bad_arguments_exit_2_with_a_reason(tmp_path):
    sim = SimServer(tmp_path, "--fault", "melt").start()
    try:
        assert sim.wait_exit() == 2
    finally:
        sim.kill()
    assert "unknown fault 'melt'" in sim.output()
    with pytest.raises(httpx.TransportError):
        httpx.get(sim.url + "/health", timeout=1)
