"""Fitting prompts into the served context: what the server's limits are, and what to do per prompt.

vLLM refuses (HTTP 400) a request whose prompt tokens plus `max_tokens` exceed `max_model_len`, and no
retry ever changes that. So a prompt is judged before it is sent: one that cannot fit at all is skipped
(`prompt_too_long`); one that fits only with a smaller completion budget is sent with `max_tokens` cut to
what fits, or skipped (`prompt_too_long_for_max_tokens`), as `--long-prompt` says.

Prompt length comes from vLLM's `/tokenize` with the request's own messages and chat_template_kwargs,
asked only for prompts that might not fit: a token is at least one byte of the rendered prompt, so a
prompt whose content bytes plus a generous allowance for the template's markers (measured once at start)
leave room for `max_tokens` fits whatever it tokenizes to, and costs no extra request. Where `/tokenize`
is unavailable (a proxy that passes only /v1), the server's own 400 answer says the prompt's length; every
wording vLLM has used (0.9 to 0.33) is parsed here. Some versions count only up to what the request could
have held ("at least N"); then a one-token request learns the exact count.

Everything here is pure except `discover`, which asks the server once at start.
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import aiohttp

from backend.generate.records import loads

POLICIES = ("reduce", "skip")
PROMPT_TOO_LONG = "prompt_too_long"  # prompt tokens alone fill the context: never fits
PROMPT_OVER_BUDGET = "prompt_too_long_for_max_tokens"  # fits only with a smaller max_tokens (policy skip)
PROMPT_REASONS = (PROMPT_TOO_LONG, PROMPT_OVER_BUDGET)

# The probe conversation whose token count sizes the template's per-message markers.
PROBE_MESSAGES = [{"role": "user", "content": "x"}]
UNAVAILABLE_STATUSES = frozenset({404, 405, 501})  # no /tokenize route behind this endpoint


@dataclass(frozen=True)
class ContextLimits:
    """What the server told us at start; `None` where it did not say."""
    max_model_len: int | None = None
    tokenize: bool = False  # /tokenize answers with this model's counts
    probe_tokens: int | None = None  # tokens of PROBE_MESSAGES rendered with the run's template kwargs
    note: str = ""  # why /tokenize is not used, when it is not

    def to_dict(self) -> dict[str, Any]:
        return {"max_model_len": self.max_model_len, "tokenize": self.tokenize,
                "probe_tokens": self.probe_tokens, "note": self.note or None}


@dataclass(frozen=True)
class Overflow:
    """A context-length refusal, read from the server's message."""
    max_model_len: int | None
    prompt_tokens: int | None  # a lower bound when `at_least`; None when the message gives no count
    at_least: bool


@dataclass(frozen=True)
class Plan:
    """What to do with one prompt: send it with `budget`, skip it for `reason`, or `probe` its length."""
    budget: int | None = None
    reason: str | None = None
    probe: bool = False


# ---- reading the server's answers ----------------------------------------------------------------

def error_message(body: bytes | str) -> str:
    """The message of an error body: vLLM's nested or flat error object, FastAPI's detail, or the text."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    try:
        data = loads(text)
    except ValueError:
        return text.strip()
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        for key in ("message", "detail", "error"):
            if isinstance(data.get(key), str):
                return data[key]
    return text.strip()


_LIMIT = re.compile(r"maximum context length is (\d+)|context length is only (\d+)|max_total_tokens=(\d+)", re.I)
_INPUT = re.compile(r"(?:your request has|You passed|your prompt contains(?: at least)?) (\d+) input tokens"
                    r"|\((\d+) in the messages|requested (\d+) tokens in the messages", re.I)
_MAX_INPUT = re.compile(r"maximum input length of (\d+) tokens", re.I)
_CONTEXT_WORDS = re.compile(r"maximum context length|context length is only|max_total_tokens=|"
                            r"maximum input length|reduce the length of the input", re.I)


def parse_overflow(message: str) -> Overflow | None:
    """A context-length refusal in any vLLM wording, or None when the message is about something else.

    0.9: `This model's maximum context length is L tokens. However, you requested N tokens in the
    messages` / `... you requested T tokens (N in the messages, M in the completion)`. 0.11: `... However,
    your request has N input tokens` / `'max_tokens' or 'max_completion_tokens' is too large: M. This
    model's maximum context length is L tokens and your request has N input tokens (M > L - N)`. Later:
    `You passed N input tokens and requested M output tokens. However, the model's context length is only
    L tokens, resulting in a maximum input length of K tokens` (the prompt was tokenized only up to K + 1,
    so N is a lower bound), `... your prompt contains [at least] N input tokens, for a total of ...`, the
    same with `input characters`/`characters` (no token count), and `max_tokens=M cannot be greater than
    max_model_len=max_total_tokens=L`. A `(parameter=..., value=...)` tail changes nothing.
    """
    if not _CONTEXT_WORDS.search(message):
        return None
    limit_m = _LIMIT.search(message)
    limit = int(next(g for g in limit_m.groups() if g)) if limit_m else None
    input_m = _INPUT.search(message)
    tokens = int(next(g for g in input_m.groups() if g)) if input_m else None
    at_least = "at least" in message.lower()
    if tokens is not None and input_m.group(0).lower().startswith("you passed"):
        cap = _MAX_INPUT.search(message)
        at_least = at_least or (cap is not None and tokens > int(cap.group(1)))
    return Overflow(max_model_len=limit, prompt_tokens=tokens, at_least=at_least)


_TRANSIENT_400 = re.compile(r"try again|temporar|overloaded|too many requests|is sleeping|not ready|"
                            r"timed out|timeout|busy|shutting down|paused", re.I)


def transient_400(message: str) -> bool:
    """A 400 that speaks of the server's state rather than of the request: retried like a 5xx."""
    return bool(_TRANSIENT_400.search(message)) and parse_overflow(message) is None


def count_from_tokenize(body: Any) -> tuple[int, int | None] | None:
    """(count, max_model_len) from a /tokenize answer, or None when it is not one."""
    if not isinstance(body, dict):
        return None
    count, limit = body.get("count"), body.get("max_model_len")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return None
    return count, (limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None)


# ---- deciding ----------------------------------------------------------------------------------

def plan(prompt_tokens: int, *, at_least: bool, max_model_len: int, max_tokens: int, policy: str) -> Plan:
    """Send, reduce, probe or skip a prompt of `prompt_tokens` (a lower bound when `at_least`).

    vLLM accepts a request when prompt + max_tokens <= max_model_len, and never one whose prompt alone
    reaches max_model_len (no room for a single token).
    """
    if prompt_tokens >= max_model_len:
        return Plan(reason=PROMPT_TOO_LONG)
    room = max_model_len - prompt_tokens
    if room >= max_tokens:
        return Plan(budget=max_tokens)
    if policy == "skip":
        return Plan(reason=PROMPT_OVER_BUDGET)
    if at_least:  # the real prompt may be longer still: learn its exact length before cutting the budget
        return Plan(probe=True)
    return Plan(budget=room)


def template_allowance(messages: int, probe_tokens: int) -> int:
    """Tokens the chat template may add around `messages` turns, generously: the probe's whole count
    (markers of one turn, the generation prompt, any default system text) twice per turn, plus a few
    for tokenizers that add a word-start marker per segment."""
    return (messages + 1) * (2 * probe_tokens + 8)


def surely_fits(prompt: list[dict[str, Any]], limits: ContextLimits, max_tokens: int) -> bool:
    """True when the prompt fits with `max_tokens` whatever it tokenizes to (no /tokenize needed).

    Every token covers at least one byte of the rendered text, so tokens <= content bytes + the
    template's allowance. Cheap: a character is at most 4 UTF-8 bytes, so most prompts are decided on
    their character count without encoding them.
    """
    if limits.max_model_len is None or limits.probe_tokens is None:
        return False
    room = limits.max_model_len - max_tokens - template_allowance(len(prompt), limits.probe_tokens)
    if room <= 0:
        return False
    chars = 0
    for turn in prompt:
        chars += len(turn["content"])
    if 4 * chars <= room:
        return True
    return sum(len(turn["content"].encode("utf-8", "surrogatepass")) for turn in prompt) <= room


def tokenize_body(model: str, messages: list[dict[str, Any]], chat_template_kwargs: dict[str, Any]) -> dict[str, Any]:
    """vLLM's TokenizeChatRequest for the same prompt the chat request will render."""
    body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": True}
    if chat_template_kwargs:
        body["chat_template_kwargs"] = chat_template_kwargs
    return body


async def discover(client: Any, model: str, chat_template_kwargs: dict[str, Any], *,
                   max_model_len: int | None = None) -> ContextLimits:
    """The served max_model_len (GET /v1/models, unless the preflight read it already) and whether
    /tokenize answers (one probe)."""
    limit = max_model_len
    try:
        code, body = await client.get_json("/v1/models") if limit is None else (0, None)
        if code == 200 and isinstance(body, dict):
            for card in body.get("data") or []:
                if isinstance(card, dict) and card.get("id") == model:
                    value = card.get("max_model_len")
                    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                        limit = value
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        pass
    try:
        status, raw = await client.post_path("/tokenize", tokenize_body(model, PROBE_MESSAGES, chat_template_kwargs),
                                             timeout=30)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return ContextLimits(limit, note=f"/tokenize did not answer ({type(exc).__name__})")
    if status == 200:
        try:
            counted = count_from_tokenize(loads(raw))
        except ValueError:
            counted = None
        if counted is not None:
            return ContextLimits(limit or counted[1], tokenize=True, probe_tokens=counted[0])
        return ContextLimits(limit, note="/tokenize answered without a token count")
    return ContextLimits(limit, note=f"/tokenize answered HTTP {status}: {error_message(raw)[:160]}")
