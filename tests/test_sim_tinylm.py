"""The tiny verifier (sim/tinylm.py) and the stand-in's `--text-backend tinylm|auto`.

The model is the session's (tokenizer, 4-layer Llama: the install step's build copied into a temp cache, or
built there); the stand-in subprocess is pointed at that cache with XDG_CACHE_HOME, so it finds the build
there instead of making its own. Tests that need torch/transformers skip without them;
the fallback to canned text runs everywhere.
"""
from __future__ import annotations

import builtins
import dataclasses
import json
import math
from pathlib import Path

import pytest

from sim import textbackend, tinycorpus, tinylm
from sim.chat import CONTENT, REASONING
from sim.tinylm_text import Sampling
from harness.drafter_support import tiny_verifier, xdg_home
from harness.sim_support import SimServer

pytestmark = pytest.mark.timeout(180)

ASK = [{"role": "user", "content": "Explain B-trees to a new engineer."}]


def _needs_train_extra() -> None:
    for mod in ("torch", "transformers", "tokenizers"):
        pytest.importorskip(mod)


@pytest.fixture(scope="session")
def cache_home(tmp_path_factory) -> Path:
    return xdg_home(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """The session's tiny verifier (harness/drafter_support.py: the install step's build, copied into the
    session's cache, or built there when the install made none). A build of the default recipe from nothing
    is what the install step does on every fresh machine; `test_first_build_reports_progress_to_the_end`
    builds a small recipe here."""
    _needs_train_extra()
    return tiny_verifier(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_text(tiny_dir):
    from sim.tinylm_text import TinyText
    return TinyText(tiny_dir)


# ---- the checkpoint -------------------------------------------------------------------------------
def test_first_build_reports_progress_to_the_end(tmp_path):
    _needs_train_extra()
    recipe = dataclasses.replace(tinylm.DEFAULT_RECIPE, steps=100, canned=10, batch=2, block=32)  # seconds
    reports: list[tuple[int, int, float]] = []
    tinylm.ensure_model(recipe, root=tmp_path, progress=lambda *report: reports.append(report))
    done = [step for step, _, _ in reports]
    assert done == [0, 25, 50, 75, 100]
    assert all(total == 100 for _, total, _ in reports) and not math.isnan(reports[-1][2])  # the last loss
    tinylm.ensure_model(recipe, root=tmp_path, progress=lambda *report: reports.append(report))
    assert len(reports) == 5  # cached: no build, no progress


def test_terminal_progress_line():
    import io
    out = io.StringIO()
    show = tinylm.TerminalProgress(out)
    show.started -= 10.0  # 10 s for the first quarter: 30 s left
    show(300, 1200, 2.5)
    show(1200, 1200, 1.0)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("demo: building the tiny verifier: step 300/1200 (25 %, about 30 s left")
    assert lines[1] == "demo: building the tiny verifier: step 1200/1200 (100 %)"


def test_build_is_a_complete_hf_directory_and_cached(tiny_dir, cache_home, monkeypatch):
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "recipe.json"} <= names
    assert not [p for p in tiny_dir.parent.iterdir() if p.name.startswith(".tiny-llama") and p.is_dir()]
    tok_cfg = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == tinylm.CHAT_TEMPLATE and tok_cfg["eos_token"] == "<|im_end|>"
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] >= 4
    assert not config["tie_word_embeddings"]  # speculators looks up lm_head.weight by name
    recipe = json.loads((tiny_dir / "recipe.json").read_text())
    # it learned the corpus, not just noise. English prose keeps a per-token loss well above the canned
    # sentences' (the previous corpus went under 1.0): ask for a large drop from the random start instead
    assert recipe["final_loss"] < recipe["first_loss"] / 3
    # the second call finds it (and the same id comes from the cache root the stand-in computes)
    stamp = (tiny_dir / "model.safetensors").stat().st_mtime_ns
    again = tinylm.ensure_model(root=tiny_dir.parent, on_build=lambda _: pytest.fail("rebuilt"))
    assert again == tiny_dir and (tiny_dir / "model.safetensors").stat().st_mtime_ns == stamp
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    assert tinylm.model_dir() == tiny_dir


def test_transformers_loads_it_back(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and model.config.eos_token_id == tok.eos_token_id
    text = tok.apply_chat_template(ASK, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_user|>user<|im_middle|>Explain B-trees to a new engineer.<|im_end|><|im_assistant|>assistant<|im_middle|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    # what the hidden-states stage reads: one state per layer boundary, hidden 64
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert out.hidden_states[0].shape == (1, len(ids), model.config.hidden_size)
    # greedy decoding follows the trained structure
    gen = model.generate(torch.tensor([ids]), max_new_tokens=400, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    new = tok.decode(gen[0, len(ids):], skip_special_tokens=False)
    assert new.startswith("<think>") and "</think>" in new and new.endswith("<|im_end|>")
    # vLLM decodes with skip_special_tokens and its deepseek_r1 reasoning parser splits the text at
    # "</think>": the thinking markers must survive that decode (the end-of-turn token must not)
    shown = tok.decode(gen[0, len(ids):], skip_special_tokens=True)
    assert shown.startswith("<think>") and "</think>" in shown and "<|im_end|>" not in shown
    assert [len(tok(m, add_special_tokens=False)["input_ids"]) for m in ("<think>", "</think>")] == [1, 1]


def test_reshaped_for_vllms_cpu_attention(tiny_dir):
    """vLLM's CPU build serves head sizes 32, 64, 80, ... (cpu_attn.py get_supported_head_sizes): 16 is
    refused at the first request, so the demo's verifier could not be served by the real engine."""
    config = json.loads((tiny_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    assert head_dim in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0


def test_template_render_is_prefix_stable(tiny_text):
    """speculators derives loss masks from gen-prompt render being a prefix of the full render."""
    for thinking in (True, False):
        prompt = tiny_text.chat_prompt(ASK, thinking=thinking)
        full = tiny_text.chat_prompt(ASK + [{"role": "assistant", "content": "Short answer."}],
                                     thinking=thinking, add_generation_prompt=False)
        assert full[:len(prompt)] == prompt, thinking
    # the training corpus is laid out exactly as the template renders (prompt and whole turn)
    for thinking in (True, False):
        turn = tinycorpus.render_turn("Q?", "R." if thinking else "", "A.", system=True, thinking=thinking)
        conv = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Q?"}]
        assert tiny_text.chat_prompt(conv, thinking=thinking) == tiny_text.encode(turn.prompt)
        done = conv + [{"role": "assistant", "content": "A.", "reasoning": "R." if thinking else None}]
        assert tiny_text.chat_prompt(done, thinking=thinking, add_generation_prompt=False) == tiny_text.encode(turn.text)


# ---- the numpy forward pass against transformers' model -----------------------------------------------
@pytest.fixture(scope="module")
def numpy_text(tiny_dir):
    from sim.tinylm_text import TinyText
    return TinyText(tiny_dir, engine="numpy")


def test_the_numpy_forward_pass_computes_transformers_logits(tiny_dir, tiny_text, numpy_text):
    import numpy as np
    import torch

    ids = tiny_text.chat_prompt(ASK, thinking=True) + list(range(9, 300))
    with torch.no_grad():
        want = tiny_text.model(input_ids=torch.tensor([ids])).logits[0].numpy()
    model = numpy_text.model
    whole = model.forward(ids, model.new_cache(len(ids)))
    # and in pieces through the cache, as generation feeds it: a prompt, then one token at a time
    cache = model.new_cache(len(ids))
    pieces = np.concatenate([model.forward(ids[:40], cache), *(model.forward([t], cache) for t in ids[40:60]),
                             model.forward(ids[60:], cache)])
    scale = float(np.abs(want).max())
    assert np.abs(whole - want).max() < 1e-5 * scale and np.abs(pieces - want).max() < 1e-5 * scale


def test_the_numpy_forward_pass_decodes_what_the_torch_model_decodes(tiny_text, numpy_text):
    for messages, thinking in ((ASK, True), (ASK, False),
                               ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a heap?"}],
                                True)):
        prompt = tiny_text.chat_prompt(messages, thinking=thinking)
        assert numpy_text.chat_prompt(messages, thinking=thinking) == prompt
        assert numpy_text._generate(prompt, 300, Sampling(temperature=0)) == \
            tiny_text._generate(prompt, 300, Sampling(temperature=0))
    # seeded sampling repeats, unseeded varies; the budget and EOS end it as the torch loop does
    prompt = numpy_text.chat_prompt(ASK, thinking=True)
    seeded = Sampling(temperature=0.9, top_p=0.95, top_k=50, seed=5)
    assert numpy_text._generate(prompt, 60, seeded) == numpy_text._generate(prompt, 60, seeded)
    assert len({tuple(numpy_text._generate(prompt, 60, Sampling(temperature=1.0))) for _ in range(4)}) > 1
    assert len(numpy_text._generate(prompt, 7, Sampling(temperature=0))) == 7
    assert numpy_text._generate(prompt, 0, Sampling(temperature=0)) == []


def test_the_numpy_sampling_distribution_is_the_torch_one(tiny_text):
    import numpy as np
    import torch

    from sim.tinylm_numpy import draw, sampling_probs

    rng = np.random.default_rng(1)
    for temperature, top_p, top_k in ((0.6, 0.95, None), (1.0, 1.0, None), (1.3, 0.5, 20), (0.7, 1.0, 1), (1.0, 0.9, -1)):
        logits = rng.normal(0, 3, 512).astype(np.float32)
        want = tiny_text._probs(torch.from_numpy(logits), temperature, top_p, top_k).numpy()
        got = sampling_probs(logits, temperature, top_p, top_k)
        assert np.allclose(got, want, atol=1e-6) and ((got > 0) == (want > 0)).all(), (temperature, top_p, top_k)
    probs = np.array([0.0, 0.25, 0.0, 0.75, 0.0], np.float32)
    counts = np.bincount([draw(probs, rng) for _ in range(4000)], minlength=5)
    assert counts[[0, 2, 4]].sum() == 0 and 0.2 < counts[1] / 4000 < 0.3


def test_the_chat_template_and_tokenizer_are_transformers_own(tiny_dir, numpy_text):
    """TinyText renders the template and encodes without transformers; vLLM uses transformers' for both."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    conversations = [ASK, [{"role": "system", "content": "S."}, *ASK, {"role": "assistant", "content": "A.",
                                                                      "reasoning": "R."}],
                     [{"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "two"}]}],
                     [{"role": "user", "content": ""}, {"role": "assistant", "content": "x", "reasoning_content": "y"}],
                     [{"role": "tool", "content": "é ✓ 漢字 {\"k\": 1}"}]]
    for messages in conversations:
        for thinking in (True, False):
            for gen in (True, False):
                want = tok.apply_chat_template(messages, tokenize=False, thinking=thinking, add_generation_prompt=gen)
                assert numpy_text.chat_prompt(messages, thinking=thinking, add_generation_prompt=gen) == \
                    tok(want, add_special_tokens=False)["input_ids"], (messages, thinking, gen)
    odd = [{"role": "user", "content": 5}]  # a shape the template cannot render: both refuse it
    with pytest.raises(Exception):
        tok.apply_chat_template(odd, tokenize=False)
    with pytest.raises(ValueError, match="cannot render the chat template"):
        numpy_text.chat_prompt(odd, thinking=True)


def test_checkpoints_beyond_the_numpy_pass_are_served_by_torch(tiny_dir, tmp_path):
    from sim.textbackend import _engine
    from sim.tinylm_numpy import NumpyLlama, supports

    config = json.loads((tiny_dir / "config.json").read_text())
    assert supports(config) is None
    assert "scaled rotary" in supports({**config, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}})
    assert "biased" in supports({**config, "attention_bias": True})
    assert "not LlamaForCausalLM" in supports({**config, "architectures": ["Qwen3ForCausalLM"]})
    other = tmp_path / "m"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**config, "mlp_bias": True}))
    assert _engine(other, torch=False) == "torch" and _engine(tiny_dir, torch=False) == "numpy"
    assert _engine(tiny_dir, torch=True) == "torch"
    with pytest.raises(ValueError, match="does not cover it .biased projections."):
        NumpyLlama(other)


# ---- the corpus and the demo's questions -----------------------------------------------------------
def test_corpus_is_documentation_prose_in_the_chat_layout():
    sections = tinycorpus.doc_sections()
    assert len(sections) > 200 and sum(len(s.paragraphs) for s in sections) > 1000
    prose = [p for s in sections for p in s.paragraphs]
    assert not [p for p in prose if ">>>" in p or "::=" in p or "\n" in p]  # no code, grammar or raw lines
    assert any("AssertionError" in p for s in sections if "assert" in s.subject for p in s.paragraphs)
    recipe = tinylm.DEFAULT_RECIPE
    turns = tinycorpus.training_turns(recipe.canned, recipe.seed)
    assert tinycorpus.digest(turns) == tinycorpus.digest(tinycorpus.training_turns(recipe.canned, recipe.seed))
    gen_prompt = "<|im_assistant|>assistant<|im_middle|>"
    for t in turns:
        assert t.prompt.startswith(("<|im_system|>system<|im_middle|>", "<|im_user|>user<|im_middle|>")), t.prompt
        assert t.prompt.endswith((gen_prompt, gen_prompt + "<think></think>")) and t.completion.endswith("<|im_end|>")
        if t.prompt.endswith(gen_prompt):  # thinking on: the reasoning parser splits at </think>
            assert t.completion.startswith("<think>") and t.completion.count("</think>") == 1
        else:
            assert "<think>" not in t.completion and "</think>" not in t.completion
    canned = set(tinycorpus.canned_questions())
    asked = [t.prompt.split("<|im_user|>user<|im_middle|>")[1].split("<|im_end|>")[0] for t in turns]
    assert sum(q in canned for q in asked) == recipe.canned
    doc_answers = [t.completion for t, q in zip(turns, asked) if q not in canned]
    assert len(doc_answers) > 1000 and len(set(doc_answers)) > 0.95 * len(doc_answers)


def test_demo_dataset_questions_are_distinct(tmp_path):
    from console.demo import write_demo_dataset

    path = tmp_path / "demo-prompts.jsonl"
    write_demo_dataset(path, rows=400)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    questions = [r["conversations"][0]["value"] for r in rows]
    assert len(rows) == 400 and len(set(questions)) == 400
    assert all(r["conversations"][0]["from"] == "human" and r["source"] == "demo" for r in rows)
    # asked as the model was trained to be asked, so its answers stay on topic
    assert set(questions) <= set(tinycorpus.doc_questions()) | set(tinycorpus.canned_questions())
    assert questions == tinycorpus.demo_questions(400)  # the same file on every machine


def test_without_the_documentation_corpus_auto_serves_canned(monkeypatch):
    real_import = builtins.__import__

    def no_pydoc_data(name, *args, **kwargs):
        if name.startswith("pydoc_data"):
            raise ImportError("No module named 'pydoc_data'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delenv(tinylm.DISABLE_ENV, raising=False)
    monkeypatch.setattr(builtins, "__import__", no_pydoc_data)
    tinycorpus.doc_sections.cache_clear()
    try:
        with pytest.raises(tinylm.TinyLMUnavailable, match="pydoc_data.topics cannot be imported"):
            tinylm.check_available()
        with pytest.raises(tinylm.TinyLMUnavailable, match="pydoc_data.topics"):
            tinylm.model_dir()
        resolved = textbackend.resolve("auto")
        assert resolved.backend.name == "canned" and "pydoc_data.topics" in resolved.note
    finally:
        tinycorpus.doc_sections.cache_clear()


def test_demo_answers_vary_and_finish(tiny_text):
    """At the demo's sampling settings the answers differ from question to question and end on their own."""
    import asyncio

    from console.profile import load_profile
    from sim.tinylm_text import Sampling

    g = load_profile(Path(__file__).resolve().parents[1] / "console" / "demo.toml").generate
    texts = []
    for i, q in enumerate(tinycorpus.demo_questions(12)):
        messages = [{"role": "user", "content": q}]
        out = asyncio.run(tiny_text.chat(messages, tiny_text.chat_prompt(messages, thinking=True), thinking=True,
                                         max_tokens=g.max_tokens, sampling=Sampling(g.temperature, g.top_p, None, i)))
        assert out.finish_reason == "stop" and out.reasoning_text and out.content_text, (q, out)
        texts.append(out.content_text)
    assert len(set(texts)) == len(texts)


# ---- output splitting -----------------------------------------------------------------------------
def test_split_at_end_of_thinking(tiny_text):
    t = tiny_text
    words = t.encode(" one two")
    ids = [t.think_id, *words, t.end_think_id, *t.encode("Answer."), t.eos_id]
    out = t.to_output(ids, thinking=True)
    assert out.kinds == [REASONING] * (len(words) + 2) + [CONTENT] * (len(ids) - len(words) - 2)
    assert out.reasoning_text == " one two" and out.content_text == "Answer." and out.finish_reason == "stop"
    cut = t.to_output(ids[:3], thinking=True)  # budget spent inside the thinking
    assert cut.content_text is None and cut.reasoning_text and cut.finish_reason == "length"
    off = t.to_output(t.encode("Answer.") + [t.eos_id], thinking=False)
    assert off.reasoning_text is None and off.content_text == "Answer."


def test_pieces_rebuild_text_including_multibyte(tiny_text):
    text = "héllo wörld ✓ 数据 done"
    ids = tiny_text.encode(text)
    pieces = tiny_text.pieces(ids)
    assert len(pieces) == len(ids) and "".join(pieces) == text
    assert "\ufffd" not in "".join(pieces)


def test_sampling_parameters_checked():
    from sim.tinylm_text import SamplingError, sampling_from

    s = sampling_from({"temperature": 0, "top_p": 0.5, "top_k": 5, "seed": 7})
    assert (s.temperature, s.top_p, s.top_k, s.seed) == (0.0, 0.5, 5, 7)
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_k": 0}, {"seed": 1.5}, {"temperature": "hot"},
                {"top_p": True}):
        with pytest.raises(SamplingError):
            sampling_from(bad)


# ---- auto and its fallback ------------------------------------------------------------------------
def test_auto_falls_back_when_transformers_does_not_import(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("No module named 'transformers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delenv(tinylm.DISABLE_ENV, raising=False)
    monkeypatch.setattr(builtins, "__import__", no_transformers)
    # nothing built yet: building needs transformers
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    resolved = textbackend.resolve("auto")
    assert resolved.backend.name == "canned" and "transformers" in resolved.note
    assert resolved.info() == {"simulated": True, "text_backend": "canned", "model_dir": None,
                               "requested": "auto", "note": resolved.note}
    assert resolved.log_line().startswith("SIMULATED text backend: canned (")
    with pytest.raises(textbackend.TextBackendError, match="--text-backend tinylm needs torch"):
        textbackend.resolve("tinylm")
    with pytest.raises(textbackend.TextBackendError, match="unknown text backend"):
        textbackend.resolve("gpt")


def test_a_built_model_serves_without_torch_or_transformers(tiny_dir, monkeypatch):
    """The numpy forward pass serves a built model with neither importable; a drafter or hidden states
    need the torch model, which then cannot be had."""
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.delenv(tinylm.DISABLE_ENV, raising=False)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    resolved = textbackend.resolve("tinylm", model_dir=tiny_dir)
    assert resolved.backend.engine == "numpy" and resolved.log_line().endswith(", numpy forward pass)")
    out = resolved.backend.to_output(resolved.backend._generate(resolved.backend.chat_prompt(ASK, thinking=True), 40,
                                                                Sampling(temperature=0)), thinking=True)
    assert out.ids[0] == resolved.backend.think_id
    with pytest.raises(textbackend.TextBackendError, match="--text-backend tinylm needs torch"):
        textbackend.resolve("tinylm", model_dir=tiny_dir, torch=True)


def test_stand_in_auto_without_train_extra_serves_canned(tmp_path):
    sim = SimServer(tmp_path, "--text-backend", "auto", env={tinylm.DISABLE_ENV: "1"}).start()
    try:
        sim.wait_ready(timeout=30)
        info = sim.get("/_sim/info").json()
        assert info["simulated"] is True and info["text_backend"] == "canned" and info["model_dir"] is None
        assert info["requested"] == "auto" and tinylm.DISABLE_ENV in info["note"]
        assert "SIMULATED text backend: canned (canned reasoning text, toy tokenizer; auto: " in sim.output()
        msg = sim.post("/v1/chat/completions", {"messages": ASK}).json()["choices"][0]["message"]
        assert msg["reasoning"].startswith('The user asks: "Explain B-trees')
    finally:
        sim.kill()


def test_stand_in_explicit_tinylm_unavailable_fails_the_load(tmp_path):
    sim = SimServer(tmp_path, "--text-backend", "tinylm", env={tinylm.DISABLE_ENV: "1"}).start()
    try:
        assert sim.wait_exit(30) == 1
        out = sim.output()
        assert "ERROR" in out and "SIMULATED text backend failed: --text-backend tinylm needs torch" in out
        assert "EngineCore failed to start." in out and "Application startup complete." not in out
    finally:
        sim.kill()


def test_default_backend_is_canned_and_says_so(tmp_path):
    sim = SimServer(tmp_path).start()
    try:
        sim.wait_ready()
        assert sim.get("/_sim/info").json() == {"simulated": True, "text_backend": "canned", "model_dir": None,
                                                "requested": "canned", "note": None}
        assert "SIMULATED text backend: canned (canned reasoning text, toy tokenizer)" in sim.output()
    finally:
        sim.kill()


# ---- the stand-in generating with it ----------------------------------------------------------------
def _sse(text: str) -> list[dict]:
    events = [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.fixture(scope="module")
def tiny_server(tiny_dir, cache_home, tmp_path_factory):
    sim = SimServer(tmp_path_factory.mktemp("simtiny"), "--text-backend", "tinylm", "--served-model-name", "kimi",
                    "--vllm-version", "0.13.0", env={"XDG_CACHE_HOME": str(cache_home)}).start()
    try:
        yield sim.wait_ready(timeout=90)
    finally:
        sim.kill()


def test_info_and_log_line_name_the_model(tiny_server, tiny_dir):
    assert tiny_server.get("/_sim/info").json() == {"simulated": True, "text_backend": "tinylm",
                                                    "model_dir": str(tiny_dir), "requested": "tinylm", "note": None}
    out = tiny_server.output()
    assert f"SIMULATED text backend: tinylm ({tiny_dir}, 4 layers, vocab " in out
    assert "first use: building" not in out  # found in the cache
    assert "Writing model shards" not in out and "Loading weights:" not in out  # no foreign progress bars


def test_chat_completion_generates_reasoning_and_content(tiny_server, tiny_text):
    body = {"model": "kimi", "messages": ASK, "return_token_ids": True, "temperature": 0, "max_tokens": 600}
    resp = tiny_server.post("/v1/chat/completions", body, timeout=60)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    choice = data["choices"][0]
    msg, ids = choice["message"], choice["token_ids"]
    assert choice["finish_reason"] == "stop"
    assert msg["reasoning"] and msg["reasoning"] == msg["reasoning_content"] and msg["content"]
    # ids are the real tokenizer's: thinking markers included, text decodes back, EOS last
    t = tiny_text
    assert ids[0] == t.think_id and t.end_think_id in ids and ids[-1] == t.eos_id
    end = ids.index(t.end_think_id)
    assert t._fast.decode(ids[1:end]) == msg["reasoning"]
    assert t._fast.decode(ids[end + 1:-1]) == msg["content"]
    assert data["prompt_token_ids"] == t.chat_prompt(ASK, thinking=True)
    assert data["prompt_token_ids"] == tiny_server.post("/v1/chat/completions/render", body).json()["token_ids"]
    usage = data["usage"]
    assert usage["prompt_tokens"] == len(data["prompt_token_ids"]) and usage["completion_tokens"] == len(ids)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert tiny_server.post("/tokenize", {"messages": ASK}).json()["tokens"] == data["prompt_token_ids"]


def test_streaming_matches_the_plain_answer(tiny_server):
    body = {"messages": ASK, "temperature": 0, "max_tokens": 600, "return_token_ids": True}
    plain = tiny_server.post("/v1/chat/completions", body, timeout=60).json()["choices"][0]
    stream = tiny_server.post("/v1/chat/completions", {**body, "stream": True,
                                                       "stream_options": {"include_usage": True}}, timeout=60)
    events = _sse(stream.text)
    deltas = [e["choices"][0] for e in events if e["choices"]]
    reasoning = "".join(d["delta"].get("reasoning", "") for d in deltas)
    content = "".join(d["delta"].get("content", "") or "" for d in deltas)
    assert reasoning == plain["message"]["reasoning"] and content == plain["message"]["content"]
    assert [i for d in deltas for i in d.get("token_ids", [])] == plain["token_ids"]
    assert deltas[-1]["finish_reason"] == "stop"
    assert events[-1]["usage"]["completion_tokens"] == len(plain["token_ids"])


def test_max_tokens_cuts_the_thinking(tiny_server):
    body = {"messages": ASK, "max_tokens": 5, "seed": 11, "return_token_ids": True}
    choice = tiny_server.post("/v1/chat/completions", body, timeout=60).json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 5
    assert choice["message"]["content"] is None and choice["message"]["reasoning"]
    # seeded sampling repeats
    again = tiny_server.post("/v1/chat/completions", body, timeout=60).json()["choices"][0]
    assert again["token_ids"] == choice["token_ids"]


def test_thinking_off_gives_content_only(tiny_server):
    body = {"messages": ASK, "temperature": 0, "max_tokens": 300, "chat_template_kwargs": {"thinking": False}}
    msg = tiny_server.post("/v1/chat/completions", body, timeout=60).json()["choices"][0]["message"]
    assert msg["reasoning"] is None and msg["content"]


def test_completions_with_token_id_prompt(tiny_server, tiny_text):
    prompt = tiny_text.chat_prompt(ASK, thinking=True)
    data = tiny_server.post("/v1/completions", {"model": "kimi", "prompt": prompt, "max_tokens": 1,
                                                "temperature": 0, "return_token_ids": True}).json()
    choice = data["choices"][0]
    assert choice["prompt_token_ids"] == prompt and choice["token_ids"] == [tiny_text.think_id]
    assert choice["finish_reason"] == "length" and data["usage"]["prompt_tokens"] == len(prompt)
    bad = tiny_server.post("/v1/completions", {"prompt": [1, tiny_text.vocab_size]})
    assert bad.status_code == 400 and "out of vocabulary" in bad.json()["error"]["message"]
    assert tiny_server.get("/v1/models").json()["data"][0]["max_model_len"] == tiny_text.max_positions == 4096
    too_long = tiny_server.post("/v1/completions", {"prompt": [5] * tiny_text.max_positions})
    assert too_long.status_code == 400 and "maximum context length is 4096" in too_long.json()["error"]["message"]
    hot = tiny_server.post("/v1/chat/completions", {"messages": ASK, "temperature": -1})
    assert hot.status_code == 400 and hot.json()["error"]["param"] == "temperature"


def test_generate_fits_prompts_to_the_tiny_models_context(tiny_server, tiny_text, tmp_path):
    """Issue 16 on the demo's own model: its 4,096-token context, its chat template and tokenizer behind
    /tokenize. A borderline prompt gets the budget that fits, a too-long one is skipped unsent."""
    import subprocess
    import sys

    def tokens(text: str) -> int:
        return len(tiny_text.chat_prompt([{"role": "user", "content": text}], thinking=True))

    def text_of(lo: int, hi: int) -> str:  # a question whose prompt has between lo and hi tokens
        words = 10
        while tokens("cat " * words) < lo:
            words = max(words + 1, int(words * lo / tokens("cat " * words)))
        while tokens("cat " * words) > hi:
            words -= 1
        assert lo <= tokens("cat " * words) <= hi
        return "cat " * words

    limit, budget = tiny_text.max_positions, 64
    rows = ["Explain B-trees to a new engineer.", text_of(limit - budget + 8, limit - 16),
            text_of(limit + 50, limit + 400)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"messages": [{"role": "user", "content": r}]}) + "\n"
                                              for r in rows))
    argv = [sys.executable, "-m", "backend.generate", "--dataset", str(tmp_path / "d.jsonl"), "--work-dir",
            str(tmp_path / "w"), "--run-id", "r", "--endpoint", tiny_server.url, "--model", "kimi",
            "--max-tokens", str(budget), "--concurrency", "2", "--no-expect-reasoning", "--min-free-bytes", "0",
            "--temperature", "0"]
    result = subprocess.run(argv, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                            timeout=150)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "w" / "runs" / "r"
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"], summary["done"], summary["reduced"]) == ("completed", 2, 1)
    assert summary["skipped_by_reason"] == {"prompt_too_long": 1}
    recs = {r["index"]: r for r in map(json.loads, (run / "output.jsonl").read_text().splitlines())}
    assert recs[0]["max_tokens"] == budget and not recs[0]["max_tokens_reduced"]
    assert recs[1]["max_tokens_reduced"] and recs[1]["max_tokens"] == limit - recs[1]["prompt_tokens"] < budget
    assert recs[1]["prompt_tokens"] == tokens(rows[1])  # /tokenize counted exactly what generation saw
    skipped = json.loads((run / "skipped.jsonl").read_text())
    assert skipped["index"] == 2 and skipped["prompt_tokens"] == tokens(rows[2])


def test_an_answer_is_computed_on_a_daemon_thread(tiny_text, monkeypatch):
    """vLLM ends at SIGTERM with requests in flight; the default executor's threads are joined at exit, so a
    long answer (a drafter's, under load) held the stand-in past its stop (a CI-like run: over 10 s)."""
    import asyncio
    import threading

    threads: list[threading.Thread] = []

    def generate(prompt_ids, max_tokens, sampling, counts=None):
        threads.append(threading.current_thread())
        return [tiny_text.eos_id]

    monkeypatch.setattr(tiny_text, "_generate", generate)
    prompt = tiny_text.chat_prompt(ASK, thinking=False)
    sampling = Sampling(0.0, None, None, None)
    asyncio.run(tiny_text.chat(ASK, prompt, thinking=False, max_tokens=8, sampling=sampling))
    asyncio.run(tiny_text.complete(prompt, max_tokens=8, sampling=sampling))
    assert len(threads) == 2 and all(t.daemon and t is not threading.main_thread() for t in threads)
