"""A nested, remote-code verifier (Kimi-K2.5 style) trains and reloads with the right tensors.

The verifier is built locally: the tiny verifier's weights under `language_model.`, a config with
`text_config` whose classes are named in `auto_map` (loadable only with trust_remote_code), and a decoy
`vision_model.norm.weight`, which speculators' own suffix lookup takes for the final norm.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import train_support as ts

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return ts.tiny_verifier(tmp_path_factory)


@pytest.fixture(scope="module")
def nested(tmp_path_factory, tiny) -> Path:
    return ts.nested_verifier(tmp_path_factory.mktemp("nested") / "kimi-like", tiny)


def test_the_decoy_is_what_speculators_alone_would_load_and_pinning_avoids_it(nested, tiny):
    import torch
    from safetensors.torch import load_file
    from speculators.utils import loading  # called through the module, as speculators' model.py does

    from backend.drafter.adapters import pinned_verifier_tensors
    from backend.drafter.verifier import NORM, inspect_verifier

    info = inspect_verifier(str(nested))
    assert info.nested and info.remote_code and info.num_layers == 4
    assert info.pinned == {"embed_tokens.weight": "language_model.model.embed_tokens.weight",
                           "lm_head.weight": "language_model.lm_head.weight",
                           "model.norm.weight": "language_model.model.norm.weight"}
    assert info.needs_pinning()
    assert torch.all(loading.load_model_layers([NORM], str(nested))[NORM] == ts.DECOY)  # the trap is real
    with pinned_verifier_tensors(info) as needed:
        assert needed
        got = loading.load_model_layers([NORM], str(nested))[NORM]
    assert torch.equal(got, load_file(str(tiny / "model.safetensors"))["model.norm.weight"])


def test_hidden_states_of_the_nested_model_match_its_language_model(nested, tiny):
    import torch
    from transformers import AutoModelForCausalLM

    from sim import hidden_states

    ids = [5, 9, 17, 3, 42, 8, 11]
    inner = AutoModelForCausalLM.from_pretrained(str(tiny)).eval()
    outer = AutoModelForCausalLM.from_pretrained(str(nested), trust_remote_code=True).eval()
    asked = hidden_states.speculators_ids(ts.LAYERS, hidden_states.num_layers(inner))
    torch.testing.assert_close(hidden_states.compute(outer, ids, asked), hidden_states.compute(inner, ids, asked))


def test_nested_remote_code_verifier_trains_and_reloads_with_its_own_tensors(tmp_path, nested, tiny,
                                                                              tmp_path_factory):
    import torch
    from safetensors.torch import load_file

    from backend.drafter.draft import load_draft
    from backend.drafter.verifier import inspect_verifier

    data = ts.Dataset(tmp_path / "data", tiny, train=12, heldout=4)  # same weights: same hidden states
    work = tmp_path / "work"
    data.extract_run(work)
    done = ts.run_stage("backend.train", "--work-dir", str(work), "--verifier", str(nested), "--epochs", "1",
                        "--max-steps", "4", "--seq-length", "256", "--optimizer", "adamw",
                        "--draft-vocab-size", "512", env=ts.stage_env(tmp_path_factory), timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((work / "runs" / "train" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4
    start = next(e for e in ts.read_events(work / "runs" / "train") if e["kind"] == "start")
    assert start["verifier"]["nested"] and start["verifier"]["remote_code"]
    saved = json.loads(Path(summary["outputs"]["checkpoint"], "config.json").read_text())
    assert saved["speculators_config"]["verifier"]["architectures"] == ["TinyNestedForCausalLM"]
    model = load_draft(summary["outputs"]["checkpoint"], inspect_verifier(str(nested)))
    tiny_weights = load_file(str(tiny / "model.safetensors"))
    assert torch.equal(model.verifier_norm.weight, tiny_weights["model.norm.weight"].float())
    assert not torch.any(model.verifier_norm.weight == ts.DECOY)
    # the embedding is saved with the checkpoint, in bf16 like every draft tensor
    embed = tiny_weights["model.embed_tokens.weight"].to(torch.bfloat16).float()
    assert torch.equal(model.embed_tokens.weight, embed)
