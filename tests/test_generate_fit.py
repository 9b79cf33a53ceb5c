"""Fitting prompts into the served context (backend/generate/fit.py) and how a run ends (runner.settle): pure."""
from __future__ import annotations

import pytest

from backend.generate.fit import (PROMPT_OVER_BUDGET, PROMPT_TOO_LONG, ContextLimits, Overflow, Plan,
                                  count_from_tokenize, error_message, parse_overflow, plan, surely_fits,
                                  template_allowance, transient_400)
from backend.generate.config import parse_config
from backend.generate.preflight import check_context, check_disk, human_bytes
from backend.generate.runner import settle
from backend.kit.preflight import PreflightReport

# Every wording vLLM has used for a request that does not fit, verbatim from the release named (the
# 0.11 one is the issue's own answer from the demo host).
WORDINGS = [
    ("This model's maximum context length is 8192 tokens. However, you requested 9000 tokens in the messages, "
     "Please reduce the length of the messages.", Overflow(8192, 9000, False)),  # 0.9
    ("This model's maximum context length is 8192 tokens. However, you requested 9064 tokens (9000 in the "
     "messages, 64 in the completion). Please reduce the length of the messages or completion.",
     Overflow(8192, 9000, False)),  # 0.9
    ("This model's maximum context length is 4096 tokens. However, your request has 6413 input tokens. "
     "Please reduce the length of the input messages.", Overflow(4096, 6413, False)),  # 0.11
    ("'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096 "
     "tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None", Overflow(4096, 2778, False)),
    ("You passed 98305 input tokens and requested 32768 output tokens. However, the model's context length is "
     "only 131072 tokens, resulting in a maximum input length of 98304 tokens. Please reduce the length of the "
     "input prompt. (parameter=input_tokens, value=98305)", Overflow(131072, 98305, True)),  # renderer
    ("You passed 100000 input characters and requested 64 output tokens. However, the model's context length "
     "is only 8192 tokens, resulting in a maximum input length of 8128 tokens (at most 81280 characters). "
     "Please reduce the length of the input prompt. (parameter=input_text, value=100000)",
     Overflow(8192, None, False)),
    ("This model's maximum context length is 8192 tokens. However, you requested 64 output tokens and your "
     "prompt contains 10000 input tokens, for a total of 10064 tokens. Please reduce the length of the input "
     "prompt or the number of requested output tokens.", Overflow(8192, 10000, False)),  # 0.25
    ("This model's maximum context length is 8192 tokens. However, you requested 64 output tokens and your "
     "prompt contains at least 8129 input tokens, for a total of at least 8193 tokens. Please reduce the "
     "length of the input prompt or the number of requested output tokens. (parameter=input_tokens, "
     "value=8129)", Overflow(8192, 8129, True)),
    ("max_tokens=140000 cannot be greater than max_model_len=max_total_tokens=131072. Please request fewer "
     "output tokens.", Overflow(131072, None, False)),
]


@pytest.mark.parametrize("message, expected", WORDINGS)
def test_every_vllm_context_refusal_is_read(message, expected):
    assert parse_overflow(message) == expected
    assert not transient_400(message)  # a context refusal never gets better by waiting


@pytest.mark.parametrize("message", ["temperature must be non-negative, got -1.",
                                     "The model `x` does not exist.", "messages must be a non-empty list",
                                     "cannot render the chat template: unknown role"])
def test_other_refusals_are_not_context_ones(message):
    assert parse_overflow(message) is None


def test_transient_400_speaks_of_the_server_not_the_request():
    assert transient_400("The engine is sleeping; try again later")
    assert transient_400("Server overloaded, please retry")
    assert not transient_400("top_p must be in (0, 1], got 2.0.")


def test_error_message_of_every_body_shape():
    assert error_message(b'{"error": {"message": "m1", "type": "BadRequestError", "code": 400}}') == "m1"
    assert error_message(b'{"object": "error", "message": "m2", "type": "BadRequestError"}') == "m2"
    assert error_message(b'{"detail": "Not Found"}') == "Not Found"
    assert error_message(b"<html>bad gateway</html>\n") == "<html>bad gateway</html>"


@pytest.mark.parametrize("tokens, at_least, policy, expected", [
    (100, False, "reduce", Plan(budget=1000)),  # fits with the whole budget
    (3096, False, "reduce", Plan(budget=1000)),  # exactly fits: 3096 + 1000 = 4096
    (3097, False, "reduce", Plan(budget=999)),  # borderline: reduced
    (3097, False, "skip", Plan(reason=PROMPT_OVER_BUDGET)),
    (4095, False, "reduce", Plan(budget=1)),  # room for one token still
    (4096, False, "reduce", Plan(reason=PROMPT_TOO_LONG)),  # none: never fits
    (9000, True, "skip", Plan(reason=PROMPT_TOO_LONG)),
    (3500, True, "reduce", Plan(probe=True)),  # only a lower bound: learn the exact length first
    (3500, True, "skip", Plan(reason=PROMPT_OVER_BUDGET)),
])
def test_plan(tokens, at_least, policy, expected):
    assert plan(tokens, at_least=at_least, max_model_len=4096, max_tokens=1000, policy=policy) == expected


def test_only_prompts_that_might_not_fit_are_measured():
    limits = ContextLimits(max_model_len=4096, tokenize=True, probe_tokens=8)
    one = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    room = 4096 - 1000 - template_allowance(1, 8)
    assert surely_fits(one("q" * room), limits, 1000)
    assert not surely_fits(one("q" * (room + 1)), limits, 1000)
    # a 3-byte character counts as 3 bytes: a token covers at least one byte, not one character
    assert surely_fits(one("€" * (room // 3)), limits, 1000)
    assert not surely_fits(one("€" * (room // 3 + 1)), limits, 1000)
    assert not surely_fits(one("q"), ContextLimits(max_model_len=None, tokenize=True, probe_tokens=8), 1000)
    assert not surely_fits(one("q"), limits, 4096)  # no room at all for the prompt


def test_tokenize_answer_read():
    assert count_from_tokenize({"count": 12, "max_model_len": 4096, "tokens": [1] * 12}) == (12, 4096)
    assert count_from_tokenize({"count": 3}) == (3, None)
    assert count_from_tokenize({"tokens": []}) is None and count_from_tokenize([1]) is None


def test_run_end_messages():
    # a transient failure: failed, and a rerun is suggested
    status, error, _ = settle(fatal=None, stopped=False, rows=10, done=8, failed={"server_error": 1},
                              skipped={"prompt_too_long": 1}, reduced=0)
    assert status == "failed" and "rerun the same command" in error and "server_error: 1" in error
    # rejected by the server: failed, and no rerun advice (it would fail the same way)
    status, error, _ = settle(fatal=None, stopped=False, rows=10, done=9, failed={"rejected": 1}, skipped={},
                              reduced=0, first_rejection="HTTP 400: bad")
    assert status == "failed" and "rerun" not in error and "retrying cannot help" in error and "HTTP 400" in error
    # only counted skips: completed, and the note says how many, by reason
    status, error, note = settle(fatal=None, stopped=False, rows=10, done=7, failed={},
                                 skipped={"prompt_too_long": 2, "invalid_json": 1}, reduced=2)
    assert (status, error) == ("completed", "")
    assert "3 skipped (prompt_too_long: 2, invalid_json: 1)" in note and "2 sent with max_tokens reduced" in note
    # nothing usable at all: failed, with the counts by reason
    status, error, _ = settle(fatal=None, stopped=False, rows=2, done=0, failed={},
                              skipped={"invalid_json": 1, "no_user_turn": 1}, reduced=0)
    assert status == "failed" and "no usable rows" in error and "invalid_json: 1, no_user_turn: 1" in error
    assert settle(fatal=None, stopped=True, rows=2, done=0, failed={}, skipped={}, reduced=0)[0] == "stopped"


def test_preflight_says_how_prompts_fit():
    config = parse_config(["--dataset", "d", "--model", "m", "--max-tokens", "8192"])
    report = PreflightReport()
    check_context(report, ContextLimits(4096, tokenize=True, probe_tokens=8), config)
    assert report.ok and "every prompt gets a reduced budget" in report.checks[0].detail
    skip = parse_config(["--dataset", "d", "--model", "m", "--max-tokens", "8192", "--long-prompt", "skip"])
    report = PreflightReport()
    check_context(report, ContextLimits(4096, note="/tokenize answered HTTP 404"), skip)
    assert not report.ok and "--long-prompt reduce" in report.checks[0].fix
    with pytest.raises(ValueError, match="--long-prompt must be reduce or skip, got 'shrink'"):
        parse_config(["--dataset", "d", "--model", "m", "--long-prompt", "shrink"])


def test_preflight_sizes_in_sensible_units(tmp_path):
    assert [human_bytes(n) for n in (0, 1023, 1536, 300 * 2**20, 5 * 2**40)] == [
        "0 B", "1023 B", "1.5 KiB", "300.0 MiB", "5.0 TiB"]
    report = PreflightReport()
    check_disk(report, str(tmp_path), need=384 * 1024)
    detail = report.checks[0].detail
    assert "may need up to 384.0 KiB" in detail and "0.00 GB" not in detail
