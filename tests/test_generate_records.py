"""Response parsing, the <think> wrapping, and the prepare-data forms (no server)."""
from __future__ import annotations

import json

import pytest

from backend.generate.records import (ResponseError, assistant_text, build_record, content_of, dumps_line,
                                      model_turn, parse_completion, prompt_turns, reasoning_of,
                                      token_row)


def _body(message, finish="stop", **extra):
    body = {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}}
    body.update(extra)
    return body


@pytest.mark.parametrize("message", [
    {"content": "4", "reasoning": "two plus two"},  # vLLM >= 0.16
    {"content": "4", "reasoning_content": "two plus two"},  # <= 0.11.0
    {"content": "4", "reasoning": "two plus two", "reasoning_content": "two plus two"},  # 0.11.1 - 0.15
    {"content": "4", "reasoning": None, "reasoning_content": "two plus two"},
])
def test_reasoning_from_every_field_variant(message):
    done = parse_completion(_body(message))
    assert done.reasoning == "two plus two" and done.content == "4"
    assert done.prompt_tokens == 12 and done.completion_tokens == 30


def test_truncated_inside_thinking():
    done = parse_completion(_body({"content": None, "reasoning": "still thinking"}, finish="length"))
    rec = build_record(sample_id="s", index=0, model="m", prompt=[{"role": "user", "content": "q"}],
                       completion=done, source={"k": 1})
    assert rec["truncated"] is True and rec["finish_reason"] == "length"
    assert model_turn(rec) == "<think>still thinking</think>"
    assert rec["conversations"][-1] == {"role": "assistant", "content": "",
                                        "reasoning_content": "still thinking"}
    assert reasoning_of(rec) == "still thinking" and content_of(rec) == ""


def test_think_wrapping_is_exact():
    assert assistant_text("r\n", "\nc") == "<think>r\n</think>\nc"
    assert assistant_text(None, "c") == "<think></think>c"


def test_token_ids_and_token_row():
    body = _body({"content": "4", "reasoning": "r"}, prompt_token_ids=[1, 2, 3])
    body["choices"][0]["token_ids"] = [7, 8]
    body["usage"]["completion_tokens_details"] = {"reasoning_tokens": 1}
    done = parse_completion(body)
    assert done.token_ids == [7, 8] and done.reasoning_tokens == 1
    rec = build_record(sample_id="s", index=0, model="m", prompt=[], completion=done, source={})
    assert token_row(rec) == {"id": "s", "input_ids": [1, 2, 3, 7, 8], "loss_mask": [0, 0, 0, 1, 1]}
    rec["token_ids"] = None
    assert token_row(rec) is None


@pytest.mark.parametrize("body, match", [
    ([], "expected an object"),
    ({"choices": []}, "no choices"),
    ({"choices": [{"message": "x"}]}, "no message"),
    ({"choices": [{"message": {"content": 5}}]}, "message.content"),
])
def test_malformed_bodies(body, match):
    with pytest.raises(ResponseError, match=match):
        parse_completion(body)


def test_record_line_is_one_json_line_and_prepare_data_shaped():
    done = parse_completion(_body({"content": "a\nb", "reasoning": "é"}))
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    line = dumps_line(build_record(sample_id="s", index=4, model="m", prompt=prompt, completion=done,
                                   source={"big": 2**70}))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    rec = json.loads(line)
    assert list(rec)[0] == "id"
    assert rec["conversations"][:2] == prompt == prompt_turns(rec)
    assert rec["conversations"][2] == {"role": "assistant", "content": "a\nb", "reasoning_content": "é"}
    assert model_turn(rec) == "<think>é</think>a\nb"
    assert reasoning_of(rec) == "é" and content_of(rec) == "a\nb"
    assert rec["source"] == {"big": 2**70}  # falls back to the stdlib for ints orjson cannot hold


def test_generated_text_is_stored_once():
    # the text is ~all of a record's bytes (and writing it most of the stage's CPU): one copy
    reasoning, content = "R" * 5000, "C" * 3000
    done = parse_completion(_body({"content": content, "reasoning": reasoning}))
    line = dumps_line(build_record(sample_id="s", index=0, model="m", prompt=[{"role": "user", "content": "q"}],
                                   completion=done, source={"conversations": [{"from": "human", "value": "q"}]}))
    assert line.count(b"R" * 5000) == 1 and line.count(b"C" * 3000) == 1
    assert len(line) < 5000 + 3000 + 600


def test_prepare_data_reads_the_conversation_as_is():
    # what prepare-data's normaliser keeps of a turn: role/from, content/value, thinking/reasoning_content
    done = parse_completion(_body({"content": "4", "reasoning": "two plus two"}))
    rec = json.loads(dumps_line(build_record(sample_id="s", index=0, model="m",
                                             prompt=[{"role": "user", "content": "2+2?"}], completion=done,
                                             source={})))
    turns = [(t.get("from", t.get("role")), t.get("value") or t.get("content") or "",
              t.get("thinking") or t.get("reasoning_content")) for t in rec["conversations"]]
    assert turns == [("user", "2+2?", None), ("assistant", "4", "two plus two")]
    no_reasoning = build_record(sample_id="s", index=0, model="m", prompt=[], source={},
                                completion=parse_completion(_body({"content": "4"})))
    assert no_reasoning["conversations"][-1] == {"role": "assistant", "content": "4", "reasoning_content": None}
    assert "input_ids" not in rec and "loss_mask" not in rec  # else prepare-data takes the pre-tokenized path


def test_lone_surrogate_still_makes_one_valid_json_line():
    line = dumps_line({"id": "s", "source": {"s": "\ud800 é"}})
    assert line.endswith(b"\n") and json.loads(line.decode("utf-8")) == {"id": "s", "source": {"s": "\ud800 é"}}
