"""One sample through the server: measure its prompt when it might not fit, send it with the completion
budget that fits, and read a context refusal (HTTP 400) to fit it again. See fit.py for the rules.

The result is `Generated` or `Skipped`; failures raise (RequestFailed, ResponseError, ServerGone) and the
runner books all of it. A prompt that surely fits costs nothing here beyond encoding its request.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from backend.generate.client import ChatClient, RequestFailed
from backend.generate.fit import (PROMPT_TOO_LONG, UNAVAILABLE_STATUSES, ContextLimits, count_from_tokenize,
                                  error_message, parse_overflow, plan, surely_fits, tokenize_body)
from backend.generate.records import Completion, dumps_line, loads, parse_completion

MAX_REFITS = 3  # context refusals answered per sample before it counts as rejected
CONTEXT_STATUSES = frozenset({400, 413, 422})


def read_completion(raw: bytes) -> Completion:
    """A 200's body as a completion; ValueError (the client retries it) when it is not one."""
    return parse_completion(loads(raw))


@dataclass(frozen=True)
class Generated:
    completion: Completion
    max_tokens: int  # the budget the request had
    reduced: bool  # below --max-tokens so that the prompt fits


@dataclass(frozen=True)
class Skipped:
    reason: str  # fit.PROMPT_REASONS
    prompt_tokens: int | None  # as measured (a lower bound when the server counted only part of it)
    max_model_len: int | None
    detail: str


@dataclass(frozen=True)
class _Length:
    tokens: int
    at_least: bool


class PromptFitter:
    """Per run: the server's limits, the request template and the policy; `generate(prompt)` per sample."""

    def __init__(self, client: ChatClient, *, model: str, base: dict[str, Any], max_tokens: int, policy: str,
                 chat_template_kwargs: dict[str, Any], limits: ContextLimits,
                 on_note: Callable[[str], None] = lambda _: None):
        self.client = client
        self.model = model
        self.base = base  # the request without messages; holds max_tokens
        self.max_tokens = max_tokens
        self.policy = policy
        self.template_kwargs = chat_template_kwargs
        self.limits = limits
        self.max_model_len = limits.max_model_len
        self.tokenize_ok = limits.tokenize
        self.on_note = on_note
        self.measured = 0  # prompts sent to /tokenize
        self.probed = 0  # one-token requests sent to learn a prompt's exact length

    def encode(self, prompt: list[dict[str, Any]], budget: int, *, probe: bool = False) -> bytes:
        if budget == self.max_tokens and not probe:
            return dumps_line({**self.base, "messages": prompt})
        body = {**self.base, "messages": prompt, "max_tokens": budget}
        if probe:
            body.pop("return_token_ids", None)
        return dumps_line(body)

    async def generate(self, prompt: list[dict[str, Any]]) -> Generated | Skipped:
        budget = self.max_tokens
        if self.tokenize_ok and not surely_fits(prompt, self.limits, self.max_tokens):
            length = await self.measure(prompt)
            if length is not None and self.max_model_len is not None:
                decided = await self._decide(prompt, length, self.max_model_len)
                if isinstance(decided, Skipped):
                    return decided
                budget = decided
        last: RequestFailed | None = None
        for _ in range(MAX_REFITS + 1):
            try:
                completion, _attempts = await self.client.chat(self.encode(prompt, budget), read_completion)
            except RequestFailed as exc:
                overflow = self._overflow(exc)
                if overflow is None:
                    raise
                last = exc
                limit = overflow.max_model_len or self.max_model_len
                if limit is None:  # a context refusal without numbers: nothing to fit it with
                    return Skipped(PROMPT_TOO_LONG, overflow.prompt_tokens, None, exc.server_message[:300])
                self.max_model_len = self.max_model_len or limit
                # the refusal proves prompt + budget > limit even where it gives no count
                floor = max(0, limit - budget + 1)
                tokens = overflow.prompt_tokens if overflow.prompt_tokens is not None else floor
                length = _Length(max(tokens, floor) if overflow.at_least or overflow.prompt_tokens is None
                                 else tokens, overflow.at_least or overflow.prompt_tokens is None)
                decided = await self._decide(prompt, length, limit)
                if isinstance(decided, Skipped):
                    return decided
                if decided >= budget:  # the server and its own count disagree: do not loop on it
                    raise
                budget = decided
                continue
            return Generated(completion, budget, budget < self.max_tokens)
        assert last is not None
        raise last

    async def _decide(self, prompt: list[dict[str, Any]], length: _Length, limit: int) -> int | Skipped:
        """The budget to send with, or why the prompt is skipped."""
        p = plan(length.tokens, at_least=length.at_least, max_model_len=limit, max_tokens=self.max_tokens,
                 policy=self.policy)
        if p.probe:
            exact = await self.probe_length(prompt)
            if exact is None:
                return self._skip(PROMPT_TOO_LONG, length.tokens, limit, at_least=True)
            p = plan(exact, at_least=False, max_model_len=limit, max_tokens=self.max_tokens, policy=self.policy)
            length = _Length(exact, False)
        if p.reason is not None:
            return self._skip(p.reason, length.tokens, limit, at_least=length.at_least)
        assert p.budget is not None
        return p.budget

    def _skip(self, reason: str, tokens: int, limit: int, *, at_least: bool) -> Skipped:
        count = f"at least {tokens}" if at_least else str(tokens)
        if reason == PROMPT_TOO_LONG:
            detail = f"the prompt has {count} tokens; the served context holds {limit}"
        else:
            detail = (f"the prompt has {count} tokens: with --max-tokens {self.max_tokens} it needs more than "
                      f"the served context of {limit} (--long-prompt skip)")
        return Skipped(reason, tokens, limit, detail)

    @staticmethod
    def _overflow(exc: RequestFailed) -> Any:
        if not exc.permanent or exc.status not in CONTEXT_STATUSES:
            return None
        return parse_overflow(exc.server_message)

    async def measure(self, prompt: list[dict[str, Any]]) -> _Length | None:
        """The prompt's token count from /tokenize, or None when it gave none (then the 400 tells)."""
        self.measured += 1
        answer = await self.client.tokenize(tokenize_body(self.model, prompt, self.template_kwargs))
        if answer is None:
            return None
        status, raw = answer
        if status == 200:
            try:
                counted = count_from_tokenize(loads(raw))
            except ValueError:
                counted = None
            if counted is None:
                return None
            self.max_model_len = self.max_model_len or counted[1]
            return _Length(counted[0], False)
        if status in UNAVAILABLE_STATUSES:
            if self.tokenize_ok:
                self.tokenize_ok = False
                self.on_note(f"/tokenize answered HTTP {status}: prompt lengths now come from the server's "
                             f"400 answers")
            return None
        if status in CONTEXT_STATUSES:  # some versions refuse to count a prompt longer than the context
            overflow = parse_overflow(error_message(raw))
            if overflow is not None and overflow.prompt_tokens is not None:
                self.max_model_len = self.max_model_len or overflow.max_model_len
                return _Length(overflow.prompt_tokens, overflow.at_least)
        return None

    async def probe_length(self, prompt: list[dict[str, Any]]) -> int | None:
        """The exact prompt length from a one-token request; None when even that does not fit."""
        self.probed += 1
        try:
            completion, _attempts = await self.client.chat(self.encode(prompt, 1, probe=True), read_completion)
        except RequestFailed as exc:
            if self._overflow(exc) is not None:
                return None
            raise
        tokens = completion.prompt_tokens
        if tokens is None:
            raise RequestFailed("the server refused the prompt's length but its one-token answer has no "
                                "usage.prompt_tokens to fit it with", attempts=1, permanent=True)
        return tokens
