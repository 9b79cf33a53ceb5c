"""The text the tiny verifier learns from: chat turns made of the stand-in's canned reasoning and answers.

Everything is generated here, deterministically, from textgen's sentence pools and a small set of demo
questions: nothing is downloaded. Each sample is one rendered conversation in the chat template's exact
token layout, so the model learns the `<think> ... </think> answer <|im_end|>` structure it must produce.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from sim import textgen

# the demo dataset's questions (console/demo.py builds its prompts from the same two lists)
DEMO_TOPICS = ("binary search", "the CAP theorem", "photosynthesis", "TCP slow start", "Rust lifetimes",
               "speculative decoding", "the Fourier transform", "B-trees", "mixture-of-experts models",
               "Raft consensus", "garbage collection", "the birthday paradox")
DEMO_ASKS = ("Explain {t} to a new engineer.", "What are the trade-offs of {t}?",
             "Give a short example that shows {t}.", "What is a common mistake people make with {t}?")
_EXTRA_QUESTIONS = ("Why is the sky blue?", "How do I reverse a linked list?", "What is a hash map?",
                    "Summarise the plot of a heist movie.", "Write a haiku about autumn.", "hello")
_SYSTEM = "You are a helpful assistant."


def questions() -> list[str]:
    return [a.format(t=t) for t in DEMO_TOPICS for a in DEMO_ASKS] + list(_EXTRA_QUESTIONS)


@dataclass(frozen=True)
class Turn:
    """One conversation as the template renders it: the prompt (up to and including the generation
    prompt) and the completion the model must learn to produce after it."""
    prompt: str
    completion: str

    @property
    def text(self) -> str:
        return self.prompt + self.completion


def render_turn(question: str, reasoning: str, answer: str, *, system: bool, thinking: bool) -> Turn:
    """One finished conversation as the chat template renders it (see tinylm.CHAT_TEMPLATE)."""
    head = f"<|im_system|>system<|im_middle|>{_SYSTEM}<|im_end|>" if system else ""
    prompt = f"{head}<|im_user|>user<|im_middle|>{question}<|im_end|><|im_assistant|>assistant<|im_middle|>"
    if thinking:
        return Turn(prompt, f"<think>{reasoning}</think>{answer}<|im_end|>")
    return Turn(prompt + "<think></think>", f"{answer}<|im_end|>")  # the template adds it when thinking is off


def samples(count: int, seed: int) -> list[Turn]:
    """`count` conversations; about one in eight has thinking off (`<think></think>` in the prompt)."""
    rng = random.Random(seed)
    qs = questions()
    out = []
    for i in range(count):
        q = qs[i % len(qs)]
        thinking = rng.random() >= 0.125
        reasoning, answer = textgen.generate(rng.getrandbits(64), q, thinking=thinking, quote_topic=False)
        out.append(render_turn(q, reasoning.text, answer.text, system=rng.random() < 0.25, thinking=thinking))
    return out


def digest(turns: list[Turn]) -> str:
    h = hashlib.sha256()
    for t in turns:
        h.update(t.prompt.encode())
        h.update(b"\0")
        h.update(t.completion.encode())
        h.update(b"\0")
    return h.hexdigest()
