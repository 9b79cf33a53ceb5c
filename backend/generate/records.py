"""One completed sample: the chat-completion response parsed into the output record.

The generated text is ~all of a record's bytes, and writing it is most of the stage's own CPU, so it is
stored once: in `conversations`, the prompt turns followed by the assistant turn with the answer as
`content` and the thinking as `reasoning_content`. That is the column `speculators prepare-data` reads
(its normaliser keeps role/content/reasoning_content and drops every other column), so the output file
is its `--data` as is, and chat templates that know reasoning (Kimi, Qwen3, the stand-in's tiny model)
render the turn back into exactly the tokens the model produced (checked with prepare-data against the
stand-in's tiny model, whose template has Kimi's layout). The `<think>` markers are not put in `content`:
a template that renders `reasoning_content` itself would put a second, empty think block before them.

The turn as the model produced it, `<think>` + reasoning + `</think>` + content, is `model_turn(record)`:
a pure function of the stored fields (it was only ever built from them, the server having split the
output). Storing it as well would double the bytes written per record (~0.1 ms CPU per completion).
`reasoning_of`, `content_of` and `prompt_turns` read the other pieces. With token ids returned,
`token_row` gives the pre-tokenized form (`input_ids` + `loss_mask`) that prepare-data passes through
without a render endpoint.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backend.contract.jsonl import dumps_line, loads  # noqa: F401 - the shared JSONL helpers, used here

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class ResponseError(ValueError):
    """The server answered 200 but the body is not a usable chat completion (the client retries it)."""


@dataclass(frozen=True)
class Completion:
    reasoning: str | None
    content: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    prompt_token_ids: list[int] | None
    token_ids: list[int] | None


def _opt_str(value: Any, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ResponseError(f"{what} is {type(value).__name__}, expected a string or null")


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_ids(value: Any) -> list[int] | None:
    return value if isinstance(value, list) else None


def parse_completion(body: Any) -> Completion:
    """Read a /v1/chat/completions response. Pure; raises ResponseError on a malformed body.

    Reasoning comes from `reasoning` (vLLM >= 0.11.1) and falls back to `reasoning_content`
    (<= 0.15) so every server version is captured.
    """
    if not isinstance(body, dict):
        raise ResponseError(f"response is {type(body).__name__}, expected an object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ResponseError("response has no choices[0]")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ResponseError("choices[0] has no message object")
    reasoning = _opt_str(message.get("reasoning"), "message.reasoning")
    if not reasoning:
        reasoning = _opt_str(message.get("reasoning_content"), "message.reasoning_content") or reasoning
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    details = usage.get("completion_tokens_details")
    return Completion(
        reasoning=reasoning,
        content=_opt_str(message.get("content"), "message.content"),
        finish_reason=_opt_str(choice.get("finish_reason"), "finish_reason"),
        prompt_tokens=_opt_int(usage.get("prompt_tokens")),
        completion_tokens=_opt_int(usage.get("completion_tokens")),
        reasoning_tokens=_opt_int(details.get("reasoning_tokens")) if isinstance(details, dict) else None,
        prompt_token_ids=_opt_ids(body.get("prompt_token_ids")),
        token_ids=_opt_ids(choice.get("token_ids")),
    )


def assistant_text(reasoning: str | None, content: str | None) -> str:
    """The assistant turn as the model produced it: `<think>` + reasoning + `</think>` + content.

    Always the full wrapping, also when reasoning is empty or the sample was truncated inside the
    thinking (then content is empty), so a consumer can split on the markers without cases.
    """
    return f"{THINK_OPEN}{reasoning or ''}{THINK_CLOSE}{content or ''}"


def build_record(*, sample_id: str, index: int, model: str, prompt: list[dict[str, str]],
                 completion: Completion, source: Any, max_tokens: int | None = None,
                 max_tokens_reduced: bool = False) -> dict[str, Any]:
    """`max_tokens` is the completion budget the request had; `max_tokens_reduced` says it was cut below
    the run's --max-tokens so that a long prompt fits the context (fit.py)."""
    reasoning, content = completion.reasoning, completion.content
    # reasoning_content is always present (null without reasoning) so every row has one schema
    assistant = {"role": "assistant", "content": content or "", "reasoning_content": reasoning}
    # Key order matters: id first keeps records greppable and cheap to index on resume.
    return {
        "id": sample_id,
        "index": index,
        "model": model,
        "finish_reason": completion.finish_reason,
        "truncated": completion.finish_reason == "length",
        "reasoning_captured": bool(reasoning),
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "reasoning_tokens": completion.reasoning_tokens,
        "max_tokens": max_tokens,
        "max_tokens_reduced": max_tokens_reduced,
        "conversations": [*prompt, assistant],
        "prompt_token_ids": completion.prompt_token_ids,
        "token_ids": completion.token_ids,
        "source": source,
    }


def prompt_turns(record: dict[str, Any]) -> list[dict[str, Any]]:
    return record["conversations"][:-1]


def reasoning_of(record: dict[str, Any]) -> str | None:
    return record["conversations"][-1].get("reasoning_content")


def content_of(record: dict[str, Any]) -> str:
    return record["conversations"][-1]["content"]


def model_turn(record: dict[str, Any]) -> str:
    """The assistant turn as the model produced it: `<think>` + reasoning + `</think>` + content."""
    return assistant_text(reasoning_of(record), content_of(record))


def token_row(record: dict[str, Any]) -> dict[str, Any] | None:
    """prepare-data's pre-tokenized form (prompt masked out), or None without token ids."""
    prompt_ids, ids = record.get("prompt_token_ids"), record.get("token_ids")
    if not prompt_ids or not ids:
        return None
    return {"id": record["id"], "input_ids": [*prompt_ids, *ids],
            "loss_mask": [0] * len(prompt_ids) + [1] * len(ids)}
