"""The stand-in's `tinylm` text backend: real generation with the tiny verifier (tinylm.py) on CPU.

Prompts are rendered with the checkpoint's own chat template and encoded with its tokenizer, as vLLM does
(template to text, then encode without adding special tokens). Output tokens are split into reasoning
and content at `</think>` the way vLLM's reasoning parsers do: with thinking on, everything up to and
including `</think>` is reasoning (all of it when `</think>` never comes); with thinking off, all is
content. Special tokens decode to "" (vLLM's skip_special_tokens), and they still count in usage.

Generation runs in a worker thread, one request at a time, so the event loop keeps serving /health,
/metrics and streams while the model computes.
"""
from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim import tinylm
from sim.chat import CONTENT, REASONING, Output


@dataclass
class Sampling:
    """A request's sampling parameters; None means the checkpoint's generation_config default."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None


class SamplingError(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def sampling_from(body: dict[str, Any]) -> Sampling:
    """Read temperature/top_p/top_k/seed from an OpenAI request body, with vLLM's range checks."""
    def num(key: str, kind: type) -> Any:
        value = body.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise SamplingError(key, f"{key} must be a {'integer' if kind is int else 'number'}, got {value!r}")
        return kind(value)
    s = Sampling(num("temperature", float), num("top_p", float), num("top_k", int), num("seed", int))
    if s.temperature is not None and s.temperature < 0:
        raise SamplingError("temperature", f"temperature must be non-negative, got {s.temperature}.")
    if s.top_p is not None and not 0 < s.top_p <= 1:
        raise SamplingError("top_p", f"top_p must be in (0, 1], got {s.top_p}.")
    if s.top_k is not None and s.top_k != -1 and s.top_k < 1:
        raise SamplingError("top_k", f"top_k must be -1 (disable), or at least 1, got {s.top_k}.")
    return s


class TinyText:
    name = "tinylm"

    def __init__(self, directory: Path):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # its bars would land in the server log between vLLM's lines
        self.model_dir = str(directory)
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self._fast = self.tokenizer.backend_tokenizer  # the `tokenizers` object: encode/decode without overhead
        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        gen = json.loads((directory / "generation_config.json").read_text())
        self.default_temperature = float(gen.get("temperature", 1.0)) if gen.get("do_sample", True) else 0.0
        self.default_top_p = float(gen.get("top_p", 1.0))
        self.vocab_size = self._fast.get_vocab_size()
        self.max_positions = int(self.model.config.max_position_embeddings)
        self.eos_id = self._fast.token_to_id(tinylm.EOS)
        self.think_id = self._fast.token_to_id(tinylm.THINK)
        self.end_think_id = self._fast.token_to_id(tinylm.END_THINK)
        self.special_ids = {self._fast.token_to_id(t) for t in tinylm.SPECIAL_TOKENS}
        self.layers = int(self.model.config.num_hidden_layers)
        self.max_model_len: int | None = self.max_positions
        self._lock = threading.Lock()

    def describe(self) -> str:
        return f"{self.model_dir}, {self.layers} layers, vocab {self.vocab_size}"

    # ---- prompts ---------------------------------------------------------------------------------
    def chat_prompt(self, messages: list[dict[str, Any]], *, thinking: bool, add_generation_prompt: bool = True) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, thinking=thinking,
                                                      add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # jinja errors on odd message shapes: the caller answers 400
            raise ValueError(f"cannot render the chat template: {exc}") from None
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        return self._fast.encode(text, add_special_tokens=False).ids

    # ---- generation ------------------------------------------------------------------------------
    async def chat(self, messages: list[dict[str, Any]], prompt_ids: list[int], *, thinking: bool, max_tokens: int,
                   sampling: Sampling) -> Output:
        ids = await asyncio.to_thread(self._generate, prompt_ids, max_tokens, sampling)
        return self.to_output(ids, thinking=thinking)

    async def complete(self, prompt_ids: list[int], *, max_tokens: int, sampling: Sampling) -> Output:
        ids = await asyncio.to_thread(self._generate, prompt_ids, max_tokens, sampling)
        return self.to_output(ids, thinking=False)

    def _generate(self, prompt_ids: list[int], max_tokens: int, sampling: Sampling) -> list[int]:
        torch = self._torch
        # RoPE would run past the trained length, but nothing is learned there: stop as vLLM would at
        # its max_model_len
        budget = min(max_tokens, self.max_positions - len(prompt_ids))
        temperature = sampling.temperature if sampling.temperature is not None else self.default_temperature
        top_p = sampling.top_p if sampling.top_p is not None else self.default_top_p
        gen = torch.Generator()
        if sampling.seed is not None:
            gen.manual_seed(sampling.seed)
        else:
            gen.seed()
        out: list[int] = []
        with self._lock, torch.inference_mode():
            torch.set_num_threads(1)
            step = self.model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
            while len(out) < budget:
                token = self._pick(step.logits[0, -1], temperature, top_p, sampling.top_k, gen)
                out.append(token)
                if token == self.eos_id:
                    break
                step = self.model(input_ids=torch.tensor([[token]]), past_key_values=step.past_key_values,
                                  use_cache=True)
        return out

    def hidden_states(self, prompt_ids: list[int], layer_ids: Any) -> Any:
        """The prompt's hidden states in speculators' layout (sim/hidden_states.py), computed under the
        same lock as generation: one forward pass at a time on this model."""
        from sim import hidden_states

        with self._lock:
            self._torch.set_num_threads(1)
            return hidden_states.compute(self.model, prompt_ids, layer_ids)

    def _pick(self, logits: Any, temperature: float, top_p: float, top_k: int | None, gen: Any) -> int:
        torch = self._torch
        if temperature == 0:
            return int(torch.argmax(logits))
        logits = logits / temperature
        if top_k is not None and top_k > 0:
            kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if top_p < 1:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=0) - sorted_p < top_p  # always keeps the most likely
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        return int(torch.multinomial(probs, 1, generator=gen))

    # ---- output ----------------------------------------------------------------------------------
    def pieces(self, ids: list[int]) -> list[str]:
        """Text per token: concatenated, the decoded text. A token that ends inside a multi-byte
        character gets "" and the character goes out with the token that completes it."""
        out: list[str] = []
        pending: list[int] = []
        for tid in ids:
            if tid in self.special_ids:
                out.append("")
                continue
            pending.append(tid)
            text = self._fast.decode(pending, skip_special_tokens=False)
            if text.endswith("\ufffd") and len(pending) < 4:
                out.append("")
                continue
            out.append(text)
            pending = []
        return out

    def to_output(self, ids: list[int], *, thinking: bool) -> Output:
        if thinking:
            end = ids.index(self.end_think_id) + 1 if self.end_think_id in ids else len(ids)
        else:
            end = 0
        kinds = [REASONING] * end + [CONTENT] * (len(ids) - end)
        finished = bool(ids) and ids[-1] == self.eos_id
        return Output(kinds, self.pieces(ids), list(ids), "stop" if finished else "length")
