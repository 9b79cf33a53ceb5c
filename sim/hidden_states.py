"""The verifier's hidden states in speculators' layout, computed with a Hugging Face causal LM on CPU.

The one definition shared by the stand-in's extraction mode, the training tests and offline acceptance:

- `compute(model, input_ids, layer_ids)` -> float tensor [seq, len(layer_ids), hidden]: exactly one state per
  id, in the given order, as vLLM's `extract_hidden_states` writes them (it never adds one): id L < n is the
  state ENTERING decoder layer L, i.e. HF `output_hidden_states[L]` (index 0 is the embeddings), which is
  vLLM's convention for `eagle_aux_hidden_state_layer_ids`; id n (the layer count) is the last decoder
  layer's output BEFORE the final norm, which speculators' trainer reads as the final state (`[:, -1]`) and
  its launcher asks for after the aux ids. transformers 5.x puts the post-norm state in
  `output_hidden_states[-1]`, so that one is captured with a forward pre-hook on the final norm.
  `speculators_ids(aux, n)` is what speculators asks for: the aux ids, then n.
- `save(path, token_ids, hidden_states)` writes one `hs_{i}.safetensors` the way vLLM's hidden-states
  connector leaves it for `speculators generate-offline-data` and speculators' trainer read it
  (hs_connectors.transfer.FileTransfer -> safetensors.torch.load_file, checked by
  speculators.data_generation.offline.check_hidden_states): `token_ids` int64 [seq] equal to the prepared
  row's input ids, `hidden_states` [seq, layers, hidden] in the dtype computed (the model's serving dtype, as
  vLLM writes it; the trainer casts to its own). Written to a temp file and renamed, so a reader never
  sees half a file.

Works for nested configs too (the language model under `text_config`): the decoder and its final norm
are found through `get_decoder()`, never by guessing a suffix.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import torch

TOKEN_IDS_KEY = "token_ids"
HIDDEN_STATES_KEY = "hidden_states"


def file_name(index: int) -> str:
    """The file name speculators looks up for dataset row `index`."""
    return f"hs_{index}.safetensors"


def decoder_of(model: Any) -> Any:
    """The decoder stack (embeddings, layers, final norm) of a causal LM."""
    getter = getattr(model, "get_decoder", None)
    decoder = getter() if callable(getter) else None
    if decoder is None or not hasattr(decoder, "layers"):
        decoder = getattr(model, "model", None)
    if decoder is None or not hasattr(decoder, "layers") or not hasattr(decoder, "norm"):
        raise ValueError(f"{type(model).__name__}: cannot find its decoder (layers and final norm); "
                         f"expected a causal LM whose get_decoder() has .layers and .norm")
    return decoder


def num_layers(model: Any) -> int:
    return len(decoder_of(model).layers)


def speculators_ids(aux_layer_ids: Sequence[int], n_layers: int) -> list[int]:
    """The ids speculators' launcher asks the extraction server for: the aux ids, then the final layer."""
    return [*(int(i) for i in aux_layer_ids), int(n_layers)]


def check_layer_ids(layer_ids: Sequence[int], n_layers: int) -> list[int]:
    """The ids as ints, or ValueError: each must name a decoder layer's input (0 .. n_layers-1) or the final
    layer's output (n_layers), the only states vLLM's models hand over."""
    ids = [int(i) for i in layer_ids]
    if not ids:
        raise ValueError("no layer ids given")
    bad = [i for i in ids if not 0 <= i <= n_layers]
    if bad:
        raise ValueError(f"layer ids {bad} are out of range for a verifier with {n_layers} decoder layers "
                         f"(valid: 0..{n_layers - 1}, the state entering that layer, or {n_layers}, the final "
                         f"layer's output)")
    return ids


@torch.inference_mode()
def compute(model: Any, input_ids: Sequence[int] | torch.Tensor, layer_ids: Sequence[int]) -> torch.Tensor:
    """Hidden states [seq, len(layer_ids), hidden] of one sequence (see the module docstring)."""
    decoder = decoder_of(model)
    n = len(decoder.layers)
    ids = check_layer_ids(layer_ids, n)
    tokens = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1)
    captured: list[torch.Tensor] = []

    def pre_norm(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured.append(args[0] if args else kwargs["hidden_states"])

    handle = decoder.norm.register_forward_pre_hook(pre_norm, with_kwargs=True)
    try:
        out = decoder(input_ids=tokens, output_hidden_states=True, use_cache=False)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"the final norm ran {len(captured)} times in one forward pass (expected once)")
    states = [captured[0][0] if i == n else out.hidden_states[i][0] for i in ids]
    return torch.stack(states, dim=1).contiguous()


def save(path: str | os.PathLike[str], token_ids: Sequence[int] | torch.Tensor,
         hidden_states: torch.Tensor) -> None:
    """Write one hs_{i}.safetensors file (atomically: temp file, fsync, rename)."""
    from safetensors.torch import save_file

    tokens = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1).contiguous()
    if hidden_states.dim() != 3 or hidden_states.shape[0] != tokens.shape[0]:
        raise ValueError(f"hidden states must be [seq={tokens.shape[0]}, layers, hidden], got "
                         f"{list(hidden_states.shape)}")
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    save_file({TOKEN_IDS_KEY: tokens, HIDDEN_STATES_KEY: hidden_states.detach().cpu().contiguous()}, tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read one file back (what speculators' FileTransfer does)."""
    from safetensors.torch import load_file

    return load_file(os.fspath(path))
