"""A generated record -> one training row, tokenized by the server's own chat template (its render endpoint).

Used when the generation run has no exact token ids. The render calls are speculators' own client
(`render_conversation`: `POST /v1/chat/completions/render`, its retries, right-side truncation to the
training window), and the turns are normalised with speculators' own normaliser, so the tokens are the
ones `speculators prepare-data` would produce.

The loss mask follows speculators 0.9's boundary rule (`_render_boundary_rows`), applied to the LAST
assistant turn only: that is the answer the verifier generated. Earlier assistant turns of a multi-turn
prompt are the source dataset's answers, not the verifier's, so they stay context (mask 0) instead of
becoming rows of their own as prepare-data would make them; and only two renders are spent per record.
The boundary is where the render of the prompt with the generation prompt ends, when the full render
extends it; when a template pre-fills a scaffold (a `<think>` the recorded turn replaces), the common
prefix, valid only if the history renders identically on both sides.
"""
from __future__ import annotations

from typing import Any

from backend.prepare import rows as R

Row = dict[str, Any]


def _normalize(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        from speculators.data_generation.preprocessing import _normalize_conversation
    except ImportError:  # another speculators layout: the records are already role/content turns
        return [dict(t) for t in turns]
    return _normalize_conversation(turns)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def render_row(record: Any, endpoint: str, seq_length: int) -> tuple[Row | None, str | None, str]:
    """(row, None, "") or (None, reason, detail): reason one of rows.REASONS, detail the render error."""
    from speculators.data_generation.render_client import render_conversation

    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        return None, R.MALFORMED, ""
    turns = record.get("conversations")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
        return None, R.MALFORMED, ""
    conv = _normalize(turns)
    if len(conv) < 2 or conv[-1].get("role") != "assistant":
        return None, R.NO_ANSWER, ""

    def render(messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        return render_conversation(endpoint, messages, add_generation_prompt=generation_prompt,
                                   truncate_prompt_tokens=seq_length, truncation_side="right")

    try:
        prompt = render(conv[:-1], True)
        if len(prompt) >= seq_length:
            return None, R.PROMPT_FILLS, ""
        full = render(conv, False)
        if full[:len(prompt)] == prompt:
            boundary = len(prompt)
        else:
            boundary = _common_prefix(prompt, full)
            history = render(conv[:-1], False)
            if full[:len(history)] != history or boundary < len(history):
                return None, R.UNSTABLE_TEMPLATE, ""
    except Exception as exc:  # the endpoint or template can fail in ways that cannot be listed: skip the row
        return None, R.RENDER_FAILED, f"{type(exc).__name__}: {str(exc)[:300]}"
    return {"id": record["id"], "input_ids": full,
            "loss_mask": [0] * boundary + [1] * (len(full) - boundary)}, None, ""
