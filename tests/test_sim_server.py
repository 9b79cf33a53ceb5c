"""The stand-in's HTTP surface against vllm-surface.md, for the three reasoning-field variants."""
from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.sim_support import MODEL, SimServer

pytestmark = pytest.mark.timeout(60)

VARIANTS = {  # version -> (reasoning keys, nested error body, reasoning_tokens detail)
    "0.11.0": (("reasoning_content",), False, False),
    "0.13.0": (("reasoning", "reasoning_content"), True, False),
    "0.33.0": (("reasoning",), True, True),
}
ASK = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def server(request, tmp_path_factory):
    sim = SimServer(tmp_path_factory.mktemp("sim"), "--vllm-version", request.param, "--served-model-name",
                    "kimi", "--max-model-len", "4096").start()
    try:
        yield sim.wait_ready()
    finally:
        sim.kill()


@pytest.fixture(scope="module")
def drafter_server(tmp_path_factory):
    sim = SimServer(tmp_path_factory.mktemp("simd"), "--drafter", "/shared/drafter", "--stats-interval",
                    "0.3").start()
    try:
        yield sim.wait_ready()
    finally:
        sim.kill()


def _version(sim: SimServer) -> str:
    return sim.argv[sim.argv.index("--vllm-version") + 1]


def _sse(text: str) -> list[dict]:
    events = [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_small_endpoints(server):
    assert server.get("/health").status_code == 200 and server.get("/health").content == b""
    assert server.get("/ping").status_code == 200
    assert server.get("/version").json() == {"version": _version(server)}
    assert server.get("/load").json() == {"server_load": 0}
    models = server.get("/v1/models").json()
    assert models["object"] == "list" and len(models["data"]) == 1
    card = models["data"][0]
    assert {k: card[k] for k in ("id", "object", "owned_by", "root", "parent", "max_model_len")} == {
        "id": "kimi", "object": "model", "owned_by": "vllm", "root": MODEL, "parent": None, "max_model_len": 4096}
    assert isinstance(card["created"], int) and isinstance(card["permission"], list)


def test_chat_completion_fields(server):
    keys, _, detail = VARIANTS[_version(server)]
    resp = server.post("/v1/chat/completions", {"model": "kimi", "messages": ASK, "return_token_ids": True})
    assert resp.status_code == 200
    body = resp.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion" and body["model"] == "kimi"
    assert isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop" and choice["logprobs"] is None
    msg = choice["message"]
    assert msg["role"] == "assistant" and msg["content"] and msg["tool_calls"] == []
    for key in ("reasoning", "reasoning_content"):
        assert (key in msg) == (key in keys)
    assert msg[keys[0]].startswith('The user asks: "Why is the sky blue?"')
    usage = body["usage"]
    assert usage["completion_tokens"] == len(choice["token_ids"])
    assert usage["prompt_tokens"] == len(body["prompt_token_ids"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert ("completion_tokens_details" in usage) == detail
    if detail:
        assert 0 < usage["completion_tokens_details"]["reasoning_tokens"] < usage["completion_tokens"]
    ids = choice["token_ids"]
    assert ids[0] == 2 and 3 in ids and ids[-1] == 1  # <think> ... </think> ... <|im_end|>
    again = server.post("/v1/chat/completions", {"messages": ASK}).json()["choices"][0]["message"]
    assert again["content"] == msg["content"]  # deterministic per prompt; model may be omitted
    render = server.post("/v1/chat/completions/render", {"messages": ASK}).json()
    # vLLM answers the render with the GenerateRequest it would run (vllm/entrypoints/serve/disagg/protocol.py)
    assert render["token_ids"] == body["prompt_token_ids"]
    assert set(render) == {"request_id", "token_ids", "features", "sampling_params", "model", "stream",
                           "stream_options", "cache_salt", "priority", "kv_transfer_params"}


def test_streaming_matches_non_streaming(server):
    keys, _, _ = VARIANTS[_version(server)]
    full = server.post("/v1/chat/completions", {"messages": ASK}).json()
    resp = server.post("/v1/chat/completions", {"messages": ASK, "stream": True, "return_token_ids": True,
                                                 "stream_options": {"include_usage": True}})
    assert resp.headers["content-type"].startswith("text/event-stream")
    chunks = _sse(resp.text)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "prompt_token_ids" in chunks[0]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == full["usage"]["completion_tokens"]
    deltas = [c["choices"][0] for c in chunks[1:-1]]
    reasoning = "".join(d["delta"].get(keys[0], "") for d in deltas)
    content = "".join(d["delta"].get("content", "") for d in deltas)
    for d in deltas:
        has_r = any(k in d["delta"] for k in keys)
        assert has_r != ("content" in d["delta"])  # one kind per delta
        assert all(k in keys or k == "content" for k in d["delta"])
    assert reasoning == full["choices"][0]["message"][keys[0]]
    assert content == full["choices"][0]["message"]["content"]
    assert [d["finish_reason"] for d in deltas][-1] == "stop"
    assert all(d["finish_reason"] is None for d in deltas[:-1])
    assert sum(len(d["token_ids"]) for d in deltas) == full["usage"]["completion_tokens"]


def test_finish_reason_length(server):
    keys, _, _ = VARIANTS[_version(server)]
    cut = server.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 6}).json()
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    assert choice["message"][keys[0]] and cut["usage"]["completion_tokens"] == 6
    full = server.post("/v1/chat/completions", {"messages": ASK, "return_token_ids": True}).json()
    think_len = full["choices"][0]["token_ids"].index(3) + 1
    part = server.post("/v1/chat/completions", {"messages": ASK, "max_tokens": think_len + 3}).json()["choices"][0]
    assert part["finish_reason"] == "length"
    assert full["choices"][0]["message"]["content"].startswith(part["message"]["content"])
    assert 0 < len(part["message"]["content"]) < len(full["choices"][0]["message"]["content"])


def test_thinking_off(server):
    keys, _, _ = VARIANTS[_version(server)]
    body = server.post("/v1/chat/completions", {"messages": ASK, "chat_template_kwargs": {"thinking": False},
                                                 "return_token_ids": True}).json()
    msg = body["choices"][0]["message"]
    assert msg["content"] and msg[keys[0]] is None
    assert 2 not in body["choices"][0]["token_ids"] and 3 not in body["choices"][0]["token_ids"]


def test_error_bodies(server):
    _, nested, _ = VARIANTS[_version(server)]
    resp = server.post("/v1/chat/completions", {"model": "gpt-4", "messages": ASK})
    assert resp.status_code == 404
    err = resp.json()["error"] if nested else resp.json()
    if not nested:
        assert err["object"] == "error"
    assert err["message"] == "The model `gpt-4` does not exist." and err["type"] == "NotFoundError"
    assert err["code"] == 404
    long = [{"role": "user", "content": "word " * 5000}]
    resp = server.post("/v1/chat/completions", {"messages": long})
    assert resp.status_code == 400
    err = resp.json()["error"] if nested else resp.json()
    assert "maximum context length is 4096 tokens" in err["message"] and err["code"] == 400
    resp = server.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 5000})
    # vLLM's own wording per release: the 0.11 check, or the renderer's budget check (versions.py)
    assert resp.status_code == 400 and ("too large: 5000" in resp.text if _version(server) < "0.14" else
                                        "max_tokens=5000 cannot be greater than max_model_len=max_total_tokens"
                                        "=4096" in resp.text)
    resp = server.post("/v1/chat/completions", {"messages": "hi"})
    assert resp.status_code == 400 and "messages must be" in resp.text
    resp = server.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 0})
    assert resp.status_code == 400 and "max_tokens" in resp.text
    import httpx
    raw = httpx.post(server.url + "/v1/chat/completions", content=b"{oops", timeout=5)
    assert raw.status_code == 400 and "not valid JSON" in raw.text


def test_completions_endpoint(server):
    body = server.post("/v1/completions", {"model": "kimi", "prompt": "The capital of France is",
                                           "return_token_ids": True}).json()
    choice = body["choices"][0]
    assert body["object"] == "text_completion" and choice["finish_reason"] == "length"  # default max_tokens 16
    assert body["usage"]["completion_tokens"] == 16 == len(choice["token_ids"]) and choice["text"]
    ids = choice["prompt_token_ids"]
    again = server.post("/v1/completions", {"prompt": ids, "max_tokens": 1}).json()
    assert again["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids) + 1, "completion_tokens": 1,
                              "prompt_tokens_details": None}
    assert server.post("/v1/completions", {"prompt": [99999999]}).status_code == 400
    assert server.post("/v1/completions", {"prompt": {"x": 1}}).status_code == 400
    stream = server.post("/v1/completions", {"prompt": "abc", "max_tokens": 5, "stream": True})
    chunks = _sse(stream.text)
    assert all(c["object"] == "text_completion" for c in chunks) and chunks[-1]["choices"][0]["finish_reason"]


def _samples(sim: SimServer) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(sim.get("/metrics").text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples: dict, name: str, **labels) -> float:
    for (n, labs), v in samples.items():
        if n == name and all((k, val) in labs for k, val in labels.items()):
            return v
    raise KeyError(name)


def test_metrics_move_and_no_spec_without_drafter(server):
    before = _samples(server)
    names = {n for n, _ in before}
    for fam in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
                "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count"):
        assert fam in names, fam
    assert not any(n.startswith("vllm:spec_decode") for n in names)
    assert ("vllm:gpu_cache_usage_perc" in names) == (_version(server) == "0.11.0")
    assert all(dict(labs).get("model_name") == "kimi" and dict(labs).get("engine") == "0"
               for n, labs in before if n.startswith("vllm:"))
    body = server.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 7}).json()
    after = _samples(server)
    assert _get(after, "vllm:generation_tokens_total") - _get(before, "vllm:generation_tokens_total") == 7
    assert (_get(after, "vllm:prompt_tokens_total") - _get(before, "vllm:prompt_tokens_total")
            == body["usage"]["prompt_tokens"])
    assert (_get(after, "vllm:request_success_total", finished_reason="length")
            - _get(before, "vllm:request_success_total", finished_reason="length")) == 1


def test_spec_decode_metrics_and_log_with_drafter(drafter_server):
    sim = drafter_server
    for _ in range(3):
        assert sim.post("/v1/chat/completions", {"messages": ASK}).status_code == 200
    samples = _samples(sim)
    drafts = _get(samples, "vllm:spec_decode_num_drafts_total")
    accepted = _get(samples, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and _get(samples, "vllm:spec_decode_num_draft_tokens_total") == 3 * drafts
    per_pos = [_get(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
               for i in range(3)]
    assert sum(per_pos) == accepted and per_pos[0] >= per_pos[1] >= per_pos[2] > 0
    assert 2.0 < 1 + accepted / drafts < 3.0
    sim.wait_for("SpecDecoding metrics: Mean acceptance length: ")
    out = sim.output()
    assert "Using Eagle3 auxiliary layers from config: (2, 30, 58)" in out  # vLLM 0.33's V2 runner
    assert "Engine 000: Avg prompt throughput: " in out and "Per-position acceptance rate: 0.7" in out
