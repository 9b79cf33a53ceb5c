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
import contextlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

from sim import tinylm
from sim.chat import CONTENT, REASONING, Output
from sim.daemon_thread import in_daemon_thread


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


ENGINES = ("numpy", "torch")


def chat_template_renderer(template: str) -> Callable[..., str]:
    """The checkpoint's chat template compiled as transformers' apply_chat_template compiles it (a sandboxed
    jinja2 environment, trim_blocks and lstrip_blocks, loop controls, its tojson and raise_exception),
    which is also what vLLM renders with; tests/test_sim_tinylm.py checks the two agree."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render


class TinyText:
    """The tiny verifier serving text. `engine`: "numpy" (sim/tinylm_numpy.py: no torch or transformers, what
    a stand-in that only generates uses) or "torch" (transformers' model: what a drafter decodes against and
    hidden states are extracted from). The tokenizer and chat template are the same either way."""
    name = "tinylm"

    def __init__(self, directory: Path, *, engine: str = "torch"):
        from tokenizers import Tokenizer

        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r} (choose from {', '.join(ENGINES)})")
        self.model_dir = str(directory)
        self.engine = engine
        self._fast = Tokenizer.from_file(str(directory / "tokenizer.json"))
        tok_config = json.loads((directory / "tokenizer_config.json").read_text())
        self._render = chat_template_renderer(tok_config["chat_template"])
        # transformers hands the template the special tokens too (bos_token, eos_token, ...)
        self._template_vars = {k: v for k, v in tok_config.items() if k.endswith("_token") and isinstance(v, str)}
        config = json.loads((directory / "config.json").read_text())
        if engine == "numpy":
            from sim.tinylm_numpy import NumpyLlama

            self._torch: Any = None
            self.model: Any = NumpyLlama(directory)
        else:
            import torch
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # its bars would land in the server log between vLLM's lines
            self._torch = torch
            self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        gen = json.loads((directory / "generation_config.json").read_text())
        self.default_temperature = float(gen.get("temperature", 1.0)) if gen.get("do_sample", True) else 0.0
        self.default_top_p = float(gen.get("top_p", 1.0))
        self.vocab_size = self._fast.get_vocab_size()
        self.max_positions = int(config["max_position_embeddings"])
        self.eos_id = self._fast.token_to_id(tinylm.EOS)
        self.think_id = self._fast.token_to_id(tinylm.THINK)
        self.end_think_id = self._fast.token_to_id(tinylm.END_THINK)
        self.special_ids = {self._fast.token_to_id(t) for t in tinylm.SPECIAL_TOKENS}
        self.layers = int(config["num_hidden_layers"])
        self.max_model_len: int | None = self.max_positions
        self._lock = threading.Lock()
        self.drafter: Any = None  # sim/specdec.Eagle3Drafter when served with --speculative-config
        self.spec_k = 0
        self.synthetic: Any = None

    def describe(self) -> str:
        return f"{self.model_dir}, {self.layers} layers, vocab {self.vocab_size}, {self.engine} forward pass"

    # ---- prompts ---------------------------------------------------------------------------------
    def chat_prompt(self, messages: list[dict[str, Any]], *, thinking: bool, add_generation_prompt: bool = True) -> list[int]:
        try:
            text = self._render(**self._template_vars, messages=messages, thinking=thinking,
                                add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # jinja errors on odd message shapes: the caller answers 400
            raise ValueError(f"cannot render the chat template: {exc}") from None
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        return self._fast.encode(text, add_special_tokens=False).ids

    # ---- generation ------------------------------------------------------------------------------
    # The stand-in serves this backend live: api.py streams each verifier step's tokens as they come
    # (one token per step, or 1 + accepted with a drafter), so TTFT and inter-token latency are measured.
    live = True

    def use_drafter(self, drafter: Any, k: int, synthetic: Any = None) -> None:
        """Decode speculatively with `drafter` (sim/specdec.py), proposing `k` tokens per step; `synthetic`:
        the conditional rates of vLLM's synthetic sampler (the acceptance is set, not the draft's)."""
        if self._torch is None:
            raise ValueError("a drafter decodes against the torch model: load the tiny verifier with engine='torch'")
        self.drafter, self.spec_k, self.synthetic = drafter, k, synthetic

    def budget(self, prompt_len: int, max_tokens: int) -> int:
        """Tokens a request may get: max_tokens, cut where RoPE would run past the trained length (nothing
        is learned there: vLLM stops at its max_model_len the same way)."""
        return max(0, min(max_tokens, self.max_positions - prompt_len))

    def output_builder(self, *, thinking: bool) -> "OutputBuilder":
        return OutputBuilder(self, thinking=thinking)

    def new_counts(self) -> Any:
        """Spec-decode counters for one request, or None without a drafter."""
        if self.drafter is None:
            return None
        from sim.specdec import SpecCounts

        return SpecCounts(self.spec_k)

    async def chat(self, messages: list[dict[str, Any]], prompt_ids: list[int], *, thinking: bool, max_tokens: int,
                   sampling: Sampling) -> Output:
        ids = await self._generated(prompt_ids, max_tokens, sampling)
        return self.to_output(ids, thinking=thinking)

    async def complete(self, prompt_ids: list[int], *, max_tokens: int, sampling: Sampling) -> Output:
        ids = await self._generated(prompt_ids, max_tokens, sampling)
        return self.to_output(ids, thinking=False)

    def _generated(self, prompt_ids: list[int], max_tokens: int, sampling: Sampling) -> "asyncio.Future[list[int]]":
        # as a streamed request's: a drafter's long answer under load held the stand-in past SIGTERM for
        # more than 10 s on the default executor
        return in_daemon_thread(lambda: self._generate(prompt_ids, max_tokens, sampling), "tinylm-request")

    def _generate(self, prompt_ids: list[int], max_tokens: int, sampling: Sampling, counts: Any = None) -> list[int]:
        out: list[int] = []
        self.drive(prompt_ids, max_tokens, sampling, out.extend, counts=counts)
        return out

    async def rounds(self, prompt_ids: list[int], *, max_tokens: int, sampling: Sampling, counts: Any = None,
                     step_latency: float = 0.0) -> AsyncIterator[list[int]]:
        """The tokens of each verifier step as they are computed (in a worker thread). `step_latency`
        seconds are spent after each step outside the model lock: the simulated GPU's forward pass, which
        costs the same for one token or for 1 + K (a memory-bound decode step), and which concurrent
        requests share as a batch would."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()
        done = object()

        def put(item: Any) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            try:
                self.drive(prompt_ids, max_tokens, sampling, put, counts=counts, step_latency=step_latency,
                           stop=stop)
                put(done)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                put(exc)

        threading.Thread(target=work, name="tinylm-request", daemon=True).start()
        try:
            while True:
                item = await queue.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()  # a client that went away stops the computation at the next step

    def drive(self, prompt_ids: list[int], max_tokens: int, sampling: Sampling, emit: Callable[[list[int]], None],
              *, counts: Any = None, step_latency: float = 0.0, stop: threading.Event | None = None) -> None:
        """Generate, handing each step's tokens to `emit`. The model lock is held for one step at a time,
        so concurrent requests take turns step by step (as a batch advances together), not request by
        request."""
        torch = self._torch
        steps = (self._steps(prompt_ids, max_tokens, sampling, counts) if torch is not None else
                 self._numpy_steps(prompt_ids, max_tokens, sampling))
        while stop is None or not stop.is_set():
            with self._lock, (torch.inference_mode() if torch is not None else contextlib.nullcontext()):
                if torch is not None:
                    torch.set_num_threads(1)
                tokens = next(steps, None)
            if tokens is None:
                return
            emit(tokens)
            if step_latency:
                time.sleep(step_latency)

    def _steps(self, prompt_ids: list[int], max_tokens: int, sampling: Sampling, counts: Any) -> Iterator[list[int]]:
        torch = self._torch
        budget = self.budget(len(prompt_ids), max_tokens)
        temperature = sampling.temperature if sampling.temperature is not None else self.default_temperature
        top_p = sampling.top_p if sampling.top_p is not None else self.default_top_p
        gen = torch.Generator()
        if sampling.seed is not None:
            gen.manual_seed(sampling.seed)
        else:
            gen.seed()
        if budget <= 0:
            return

        def probs(logits: Any) -> Any:
            return self._probs(logits, temperature, top_p, sampling.top_k)

        if self.drafter is not None:
            from sim import specdec

            verifier = specdec.Verifier(self.model, self.eos_id, self.max_positions)
            yield from specdec.speculative_rounds(verifier, self.drafter, prompt_ids, budget=budget, k=self.spec_k,
                                                  probs=None if temperature == 0 else probs, generator=gen,
                                                  counts=counts if counts is not None else self.new_counts(),
                                                  synthetic=self.synthetic)
            return
        step = self.model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
        made = 0
        while made < budget:
            logits = step.logits[0, -1]
            token = int(torch.argmax(logits)) if temperature == 0 else int(torch.multinomial(probs(logits), 1,
                                                                                            generator=gen))
            made += 1
            yield [token]
            if token == self.eos_id:
                return
            step = self.model(input_ids=torch.tensor([[token]]), past_key_values=step.past_key_values,
                              use_cache=True)

    def _numpy_steps(self, prompt_ids: list[int], max_tokens: int, sampling: Sampling) -> Iterator[list[int]]:
        """What `_steps` does without a drafter, on the numpy forward pass: one token per step."""
        import numpy as np

        from sim.tinylm_numpy import draw, sampling_probs

        budget = self.budget(len(prompt_ids), max_tokens)
        temperature = sampling.temperature if sampling.temperature is not None else self.default_temperature
        top_p = sampling.top_p if sampling.top_p is not None else self.default_top_p
        rng = np.random.default_rng(sampling.seed)  # no seed: fresh entropy, as torch's gen.seed()
        if budget <= 0:
            return
        cache = self.model.new_cache(len(prompt_ids) + budget)
        logits = self.model.forward(prompt_ids, cache)[-1]
        for made in range(1, budget + 1):
            token = (int(np.argmax(logits)) if temperature == 0 else
                     draw(sampling_probs(logits, temperature, top_p, sampling.top_k), rng))
            yield [token]
            if token == self.eos_id or made == budget:
                return
            logits = self.model.forward([token], cache)[-1]

    def hidden_states(self, prompt_ids: list[int], layer_ids: Any) -> Any:
        """The prompt's hidden states, one per layer id given (sim/hidden_states.py), computed under the
        same lock as generation: one forward pass at a time on this model."""
        from sim import hidden_states

        if self._torch is None:
            raise ValueError("hidden states are extracted from the torch model: load the tiny verifier with "
                             "engine='torch'")
        with self._lock:
            self._torch.set_num_threads(1)
            return hidden_states.compute(self.model, prompt_ids, layer_ids)

    def _probs(self, logits: Any, temperature: float, top_p: float, top_k: int | None) -> Any:
        """The sampling distribution at temperature > 0 after top-k and top-p (what a sample is drawn from,
        and what the rejection sampler accepts a draft token against)."""
        torch = self._torch
        logits = logits.float() / temperature
        if top_k is not None and top_k > 0:
            kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if top_p < 1:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=0) - sorted_p < top_p  # always keeps the most likely
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        return probs

    # ---- output ----------------------------------------------------------------------------------
    def pieces(self, ids: list[int]) -> list[str]:
        """Text per token: concatenated, the decoded text. A token that ends inside a multi-byte
        character gets "" and the character goes out with the token that completes it."""
        return OutputBuilder(self, thinking=False).feed(ids).pieces

    def to_output(self, ids: list[int], *, thinking: bool) -> Output:
        return OutputBuilder(self, thinking=thinking).feed(ids).finish()


class OutputBuilder:
    """An Output grown token by token, as a live stream produces it. Kinds: with thinking on, everything
    up to and including `</think>` is reasoning (all of it while `</think>` has not come); pieces as
    TinyText.pieces. Feeding the ids in any number of slices gives the same Output."""

    def __init__(self, text: TinyText, *, thinking: bool):
        self._text = text
        self._in_reasoning = thinking
        self._pending: list[int] = []
        self.out = Output([], [], [], "length")

    @property
    def pieces(self) -> list[str]:
        return self.out.pieces

    def feed(self, ids: list[int]) -> "OutputBuilder":
        t, out = self._text, self.out
        for tid in ids:
            out.ids.append(tid)
            out.kinds.append(REASONING if self._in_reasoning else CONTENT)
            if tid == t.end_think_id:
                self._in_reasoning = False
            if tid in t.special_ids:
                out.pieces.append("")
                continue
            self._pending.append(tid)
            piece = t._fast.decode(self._pending, skip_special_tokens=False)
            if piece.endswith("\ufffd") and len(self._pending) < 4:
                out.pieces.append("")
                continue
            out.pieces.append(piece)
            self._pending = []
        return self

    def finish(self) -> Output:
        out = self.out
        out.finish_reason = "stop" if out.ids and out.ids[-1] == self._text.eos_id else "length"
        return out
