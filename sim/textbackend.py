"""Where the stand-in's text comes from: `canned` (textgen: instant, toy tokenizer) or `tinylm` (a real
tiny model, tinylm_text), chosen by `--text-backend canned|tinylm|auto`.

`auto` takes tinylm when it can run (built, or buildable: torch, transformers and tokenizers import), else
canned, and says why. Resolving tinylm may build the model (first use, seconds) and imports numpy or torch,
so `resolve` is blocking: the server runs it in a thread while it prints the load sequence.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sim import chat, textgen, tinylm
from sim.daemon_thread import in_daemon_thread

MODES = ("canned", "tinylm", "auto")


class TextBackend(Protocol):
    name: str
    model_dir: str | None
    vocab_size: int
    max_model_len: int | None  # the model's own context limit, None when it has none

    def describe(self) -> str: ...

    def chat_prompt(self, messages: list[dict[str, Any]], *, thinking: bool,
                    add_generation_prompt: bool = True) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...

    async def chat(self, messages: list[dict[str, Any]], prompt_ids: list[int], *, thinking: bool, max_tokens: int,
                   sampling: Any) -> chat.Output: ...

    async def complete(self, prompt_ids: list[int], *, max_tokens: int, sampling: Any) -> chat.Output: ...


class CannedText:
    """textgen's deterministic sentences: no model, zero latency (the generation benchmark uses it)."""
    name = "canned"
    model_dir = None
    vocab_size = textgen.VOCAB_SIZE
    max_model_len = None

    def __init__(self, response_tokens: int | None = None):
        self.response_tokens = response_tokens

    def describe(self) -> str:
        return "canned reasoning text, toy tokenizer"

    def chat_prompt(self, messages: list[dict[str, Any]], *, thinking: bool,
                    add_generation_prompt: bool = True) -> list[int]:
        return textgen.encode(textgen.render_chat(messages, thinking=thinking,
                                                  add_generation_prompt=add_generation_prompt))

    def encode(self, text: str) -> list[int]:
        return textgen.encode(text)

    async def chat(self, messages: list[dict[str, Any]], prompt_ids: list[int], *, thinking: bool, max_tokens: int,
                   sampling: Any) -> chat.Output:
        # seeded by the conversation, so the same question gets the same answer whatever the sampling
        reasoning, answer = textgen.generate(textgen.seed_of([messages, thinking]), textgen.last_user_text(messages),
                                             thinking=thinking, response_tokens=self.response_tokens)
        return chat.build_output(reasoning, answer, thinking=thinking, max_tokens=max_tokens)

    async def complete(self, prompt_ids: list[int], *, max_tokens: int, sampling: Any) -> chat.Output:
        _, answer = textgen.generate(textgen.seed_of(prompt_ids), "", thinking=False,
                                     response_tokens=self.response_tokens)
        return chat.build_output(textgen.Segment([], []), answer, thinking=False, max_tokens=max_tokens)


@dataclass
class Resolved:
    backend: Any  # CannedText or tinylm_text.TinyText
    requested: str
    note: str  # why auto chose what it chose, or "" when as requested

    def log_line(self) -> str:
        why = f"; {self.note}" if self.note else ""
        return f"SIMULATED text backend: {self.backend.name} ({self.backend.describe()}{why})"

    def info(self) -> dict[str, Any]:
        """The body of GET /_sim/info."""
        return {"simulated": True, "text_backend": self.backend.name, "model_dir": self.backend.model_dir,
                "requested": self.requested, "note": self.note or None}


class TextBackendError(RuntimeError):
    pass


def resolve(mode: str, *, response_tokens: int | None = None, model_dir: Path | None = None,
            torch: bool = False) -> Resolved:
    """The backend for `--text-backend mode`; for tinylm, builds the tiny verifier when not cached (which
    needs torch and transformers). `torch`: the served model must be transformers' (a drafter decodes
    against it, or hidden states are extracted from it); otherwise a built model is served by the numpy
    forward pass where it covers the checkpoint. An explicit `tinylm` that cannot run raises
    TextBackendError; `auto` falls back to canned."""
    if mode not in MODES:
        raise TextBackendError(f"unknown text backend {mode!r} (choose from {', '.join(MODES)})")
    if mode == "canned":
        return Resolved(CannedText(response_tokens), mode, "")
    try:
        tinylm.check_available(torch=torch)
        directory = model_dir or tinylm.ensure_model()
        from sim.tinylm_text import TinyText
        return Resolved(TinyText(directory, engine=_engine(directory, torch)), mode, "")
    except tinylm.TinyLMUnavailable as exc:
        if mode == "tinylm":
            raise TextBackendError(f"--text-backend tinylm needs torch, transformers and tokenizers (the "
                                   f"`train` extra): {exc}") from None
        return Resolved(CannedText(response_tokens), mode, f"auto: tiny model unavailable: {exc}")


def _engine(directory: Path, torch: bool) -> str:
    """numpy unless torch is asked for or the checkpoint is beyond the numpy forward pass (then torch,
    checked importable: TinyLMUnavailable otherwise)."""
    import json

    from sim.tinylm_numpy import supports

    if not torch and supports(json.loads((directory / "config.json").read_text())) is None:
        return "numpy"
    tinylm.check_available(torch=True)
    return "torch"


def start_resolve(mode: str, *, response_tokens: int | None = None,
                  torch: bool = False) -> "asyncio.Future[Resolved]":
    """`resolve` on a daemon thread, as a future of the running loop."""
    if mode == "canned":  # nothing to import or build: no thread
        fut: asyncio.Future[Resolved] = asyncio.get_running_loop().create_future()
        fut.set_result(resolve(mode, response_tokens=response_tokens))
        return fut
    return in_daemon_thread(lambda: resolve(mode, response_tokens=response_tokens, torch=torch), "text-backend")
