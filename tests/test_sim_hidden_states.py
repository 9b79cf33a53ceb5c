"""sim/hidden_states.py: the layout speculators reads, checked with speculators' own loader and check.

A 4-layer random Llama (built in-process in well under a second) stands in for the verifier: the layout
does not depend on trained weights.
"""
from __future__ import annotations

import pytest

LAYERS = [1, 2, 3]
ASKED = [1, 2, 3, 4]  # what speculators asks vLLM for: the aux ids, then the final layer of the 4


@pytest.fixture(scope="module")
def hs(torch):
    from sim import hidden_states

    return hidden_states


@pytest.fixture(scope="module")
def llama(torch):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def test_exactly_the_states_asked_for_and_nothing_appended(llama, hs, torch):
    ids = [5, 9, 17, 3, 42, 8]
    assert hs.speculators_ids(LAYERS, hs.num_layers(llama)) == ASKED
    assert hs.compute(llama, ids, LAYERS).shape == (len(ids), len(LAYERS), 32)  # vLLM adds no final state
    out = hs.compute(llama, ids, ASKED)
    assert out.shape == (len(ids), len(ASKED), 32)
    torch.testing.assert_close(hs.compute(llama, ids, [3, 1]), out[:, [2, 0]])  # in the order given
    # the state entering decoder layer L, taken independently with a pre-hook on that layer
    seen: dict[int, torch.Tensor] = {}

    def grab(i):
        def hook(_module, args, kwargs):
            seen[i] = (args[0] if args else kwargs["hidden_states"])[0]
        return hook

    hooks = [layer.register_forward_pre_hook(grab(i), with_kwargs=True)
             for i, layer in enumerate(llama.model.layers)]
    try:
        with torch.no_grad():
            full = llama(input_ids=torch.tensor([ids]), output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    for k, layer in enumerate(LAYERS):
        torch.testing.assert_close(out[:, k], seen[layer])
    # last slot: before the final norm, and normalising it gives what the lm_head reads
    last = out[:, -1]
    assert not torch.allclose(last, full.hidden_states[-1][0])
    with torch.no_grad():
        torch.testing.assert_close(llama.lm_head(llama.model.norm(last)), full.logits[0])


def test_saved_file_passes_speculators_loader_and_check(llama, hs, torch, tmp_path):
    from hs_connectors.transfer import FileTransfer
    from speculators.data_generation.offline import (check_hidden_states, find_corrupt_hidden_state_indices,
                                                     get_existing_hidden_state_indices)

    rows = [[5, 9, 17, 3], [1, 2, 3, 4, 5, 6, 7]]
    for i, ids in enumerate(rows):
        hs.save(tmp_path / hs.file_name(i), ids, hs.compute(llama, ids, ASKED))
    assert get_existing_hidden_state_indices(tmp_path) == [0, 1]
    assert find_corrupt_hidden_state_indices(tmp_path, [0, 1]) == {}
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    transfer = FileTransfer(tmp_path)
    for i, ids in enumerate(rows):
        data = transfer.get_cached(i)
        check_hidden_states(data, ids)  # raises on a wrong key, dtype mismatch of ids, length, non-finite
        assert data["token_ids"].dtype == torch.int64
        assert data["hidden_states"].shape == (len(ids), len(LAYERS) + 1, 32)
    assert transfer.get_cached(2) is None


def test_bad_layer_ids_and_shapes_are_clear_errors(llama, hs, torch, tmp_path):
    with pytest.raises(ValueError, match=r"out of range .* 4 decoder layers \(valid: 0\.\.3, .* or 4, the final"):
        hs.compute(llama, [1, 2], [1, 5])
    with pytest.raises(ValueError, match="no layer ids"):
        hs.compute(llama, [1, 2], [])
    with pytest.raises(ValueError, match=r"\[seq=3, layers, hidden\]"):
        hs.save(tmp_path / "hs_0.safetensors", [1, 2, 3], torch.zeros(2, 4, 32))
    assert not list(tmp_path.iterdir())
