"""Prompts that do not fit the served context (issue 16), end to end: the generate stage against the stand-in
serving a 4,096-token context like the demo's tiny model, with vLLM's real /tokenize and 400 answers.

Every process started here is killed by its pid at the end of its test.
"""
from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from backend.generate.client import ChatClient, ClientSettings, RequestFailed
from backend.generate.fit import parse_overflow
from backend.generate.records import dumps_line
from harness.generate_support import MODEL, StandIn, events, gen_argv, records, run_gen

CONTEXT = 4096
MAX_TOKENS = 1024
FITTING, BORDERLINE, TOO_LONG = 5, 2, 2


def write_mixed(path: Path) -> dict[str, list[int]]:
    """Fitting questions, borderline ones (fit only with a smaller max_tokens) and ones longer than the
    context (the canned tokenizer makes one token of each ` x`), plus one unparsable row."""
    rows, kinds = [], {"fitting": [], "borderline": [], "too_long": []}
    for i in range(FITTING):
        kinds["fitting"].append(len(rows))
        rows.append(f"Question {i}: explain topic {i}.")
    for i in range(BORDERLINE):
        kinds["borderline"].append(len(rows))
        rows.append("x " * 3500 + f"borderline {i}?")  # ~3,510 tokens: 586 left, under MAX_TOKENS
    for i in range(TOO_LONG):
        kinds["too_long"].append(len(rows))
        rows.append("y " * 5000 + f"too long {i}?")  # ~5,010 tokens: over the whole context
    with open(path, "w") as f:
        for text in rows:
            f.write(json.dumps({"conversations": [{"from": "human", "value": text}]}) + "\n")
        f.write("{not json\n")
    return kinds


def requests_seen(server: StandIn) -> Counter:
    """(path, status) of every request the stand-in answered, from its access log."""
    text = "".join(p.read_text(errors="replace") for p in server.tmp.glob(f"sim-{server.port}-*.log"))
    return Counter(re.findall(r'"POST (\S+) HTTP/1\.1" (\d+)', text))


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_mixed_prompts_complete_with_exact_counts_and_too_long_ones_never_sent(standin, tmp_path):
    server = standin("--max-model-len", str(CONTEXT), "--access-log")
    kinds = write_mixed(tmp_path / "d.jsonl")
    result = run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--max-tokens", str(MAX_TOKENS)))
    assert result.returncode == 0, result.stderr
    run = tmp_path / "w" / "runs" / "r"
    summary = summary_of(run)
    assert summary["status"] == "completed" and "error" not in summary
    assert (summary["done"], summary["total"], summary["failed"]) == (FITTING + BORDERLINE, 10, 0)
    assert summary["skipped_by_reason"] == {"prompt_too_long": TOO_LONG, "invalid_json": 1}
    assert summary["reduced"] == BORDERLINE and summary["context"]["tokenize"] is True
    assert "3 skipped (prompt_too_long: 2, invalid_json: 1)" in result.stderr
    assert "2 with a reduced max_tokens" in result.stderr
    by_index = {r["index"]: r for r in records(run)}
    assert sorted(by_index) == kinds["fitting"] + kinds["borderline"]
    for i in kinds["fitting"]:
        assert by_index[i]["max_tokens"] == MAX_TOKENS and by_index[i]["max_tokens_reduced"] is False
    for i in kinds["borderline"]:  # the budget it got is what fits: prompt + budget = the whole context
        rec = by_index[i]
        assert rec["max_tokens_reduced"] is True and rec["max_tokens"] == CONTEXT - rec["prompt_tokens"] < MAX_TOKENS
    skipped = [json.loads(x) for x in (run / "skipped.jsonl").read_text().splitlines()]
    assert sorted(s["index"] for s in skipped) == kinds["too_long"]
    assert all(s["reason"] == "prompt_too_long" and s["prompt_tokens"] > CONTEXT for s in skipped)
    # known before sending: the too-long prompts were measured, never sent; no request was refused
    seen = requests_seen(server)
    # + the preflight's smoke completion and the throughput smoke's burst (one request per --concurrency 8)
    assert seen[("/v1/chat/completions", "200")] == 1 + 8 + FITTING + BORDERLINE
    assert not [k for k in seen if k[1] != "200"]
    assert seen[("/tokenize", "200")] == 1 + BORDERLINE + TOO_LONG  # the probe, then only the long prompts
    finish = events(run)[-1]
    assert finish["kind"] == "finish" and finish["summary"]["skipped_by_reason"] == summary["skipped_by_reason"]


def test_borderline_prompts_skipped_when_the_profile_says_skip(standin, tmp_path):
    server = standin("--max-model-len", str(CONTEXT))
    kinds = write_mixed(tmp_path / "d.jsonl")
    result = run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--max-tokens", str(MAX_TOKENS),
                              "--long-prompt", "skip"))
    assert result.returncode == 0, result.stderr
    run = tmp_path / "w" / "runs" / "r"
    summary = summary_of(run)
    assert summary["status"] == "completed" and summary["done"] == FITTING and summary["reduced"] == 0
    assert summary["skipped_by_reason"] == {"prompt_too_long": TOO_LONG, "prompt_too_long_for_max_tokens": BORDERLINE,
                                            "invalid_json": 1}
    assert sorted(r["index"] for r in records(run)) == kinds["fitting"]


@pytest.mark.parametrize("version", ["0.11.0", "0.20.0", "0.33.0"])
def test_without_tokenize_the_servers_own_400_decides(standin, tmp_path, version):
    """A proxy passing only /v1: each vLLM release's real 400 wording is read (0.20's counts only up to
    what the request could hold, so a one-token request learns the exact length)."""
    server = standin("--max-model-len", str(CONTEXT), "--vllm-version", version, "--fault", "no-tokenize",
                     "--access-log")
    kinds = write_mixed(tmp_path / "d.jsonl")
    result = run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--max-tokens", str(MAX_TOKENS)))
    assert result.returncode == 0, result.stderr
    run = tmp_path / "w" / "runs" / "r"
    summary = summary_of(run)
    assert summary["status"] == "completed" and summary["context"]["tokenize"] is False
    assert summary["skipped_by_reason"] == {"prompt_too_long": TOO_LONG, "invalid_json": 1}
    assert summary["done"] == FITTING + BORDERLINE and summary["reduced"] == BORDERLINE
    for rec in records(run):
        if rec["index"] in kinds["borderline"]:
            assert rec["max_tokens"] == CONTEXT - rec["prompt_tokens"]
    seen = requests_seen(server)
    assert seen[("/tokenize", "404")] == 1  # asked once at start, never again
    refusals = seen[("/v1/chat/completions", "400")]
    assert refusals == (BORDERLINE + 2 * TOO_LONG if version == "0.20.0" else BORDERLINE + TOO_LONG)


def test_transient_failure_still_ends_with_the_rerun_advice(standin, tmp_path):
    server = standin("--max-model-len", str(CONTEXT), "--fault", "5xx:1")
    write_mixed(tmp_path / "d.jsonl")
    argv = gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--max-tokens", str(MAX_TOKENS),
                    "--skip-preflight", "--max-retries", "0", "--concurrency", "1")
    result = run_gen(argv)
    assert result.returncode == 1
    run = tmp_path / "w" / "runs" / "r"
    summary = summary_of(run)
    assert summary["status"] == "failed" and "rerun the same command" in summary["error"]
    assert summary["failed_by_reason"] == {"server_error": 1} and summary["failed_permanent"] == 0
    assert summary["skipped_by_reason"] == {"prompt_too_long": TOO_LONG, "invalid_json": 1}
    failure = json.loads((run / "failures.jsonl").read_text().splitlines()[0])
    assert failure["reason"] == "server_error" and failure["permanent"] is False
    assert run_gen(argv).returncode == 0  # the rerun retries it (and skips the long ones again)
    assert summary_of(run)["done"] == FITTING + BORDERLINE


def test_real_format_400_is_classified_permanent(standin, tmp_path):
    """The client never retries vLLM's context refusal: permanent, with the server's message to read."""
    server = standin("--max-model-len", str(CONTEXT))

    async def ask() -> RequestFailed:
        settings = ClientSettings(base_url=server.url, concurrency=1, max_retries=3, backoff_base=0.01)
        async with ChatClient(settings) as client:
            body = dumps_line({"model": MODEL, "max_tokens": MAX_TOKENS,
                               "messages": [{"role": "user", "content": "y " * 5000}]})
            with pytest.raises(RequestFailed) as info:
                await client.chat(body)
            return info.value

    failed = asyncio.run(ask())
    assert failed.permanent and failed.reason == "rejected" and failed.status == 400 and failed.attempts == 1
    overflow = parse_overflow(failed.server_message)
    assert overflow is not None and overflow.max_model_len == CONTEXT and overflow.prompt_tokens > CONTEXT
