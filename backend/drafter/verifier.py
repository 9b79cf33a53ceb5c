"""The verifier as the train and verify stages need it: its config (backend/kit/verifier.py, the one reader)
and the EXACT tensor names of the language model's embedding, lm_head and final norm.

`inspect_verifier(path)` reads config.json through backend.kit.verifier.read_verifier and the weights'
safetensors headers, and returns the same `VerifierInfo` with the pinned names and their shapes filled in.

Why exact names: speculators 0.9.0 (`speculators.utils.loading.load_model_layers`) finds
`embed_tokens.weight`, `lm_head.weight` and `model.norm.weight` by exact key, then by the SHORTEST key with
that suffix, so in a multimodal checkpoint `vision_model.norm.weight` wins over
`language_model.model.norm.weight`: the drafter would silently train against a vision tower's norm. The
names are pinned here from the decoder's own layer keys, shape-checked, and handed to speculators by
backend.drafter.adapters.pinned_verifier_tensors.

Every problem is a VerifierError whose message is one line saying which file and what to do.
"""
from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import Any

from backend.kit import verifier as config_reader
# one error type, one rule, one description of the verifier (backend/kit/verifier.py); this module adds the weights
from backend.contract.runs import read_json_object
from backend.kit.verifier import VerifierError, VerifierInfo, check_layer_ids, speculators_pick  # noqa: F401

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# the three names speculators asks the verifier for (model.py: _load_verifier_weights)
EMBED, LM_HEAD, NORM = "embed_tokens.weight", "lm_head.weight", "model.norm.weight"
_LAYER_KEY = re.compile(r"^(?P<prefix>(?:[A-Za-z0-9_]+\.)*?)layers\.(?P<index>\d+)\.")


def _read_json(path: str, what: str) -> dict[str, Any]:
    return read_json_object(path, VerifierError, f"{path} is missing: {what}")



def weight_shapes(path: str) -> dict[str, list[int]]:
    """Every tensor name of the checkpoint at `path` with its shape, from safetensors headers only."""
    from safetensors import safe_open

    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
        weight_map = _read_json(index, "").get("weight_map")
        if not isinstance(weight_map, dict):
            raise VerifierError(f"{index} has no weight_map object")
        files = sorted(set(weight_map.values()))
    elif os.path.exists(os.path.join(path, SINGLE_FILE)):
        files = [SINGLE_FILE]
    else:
        raise VerifierError(f"{path} has neither {INDEX_FILE} nor {SINGLE_FILE}: not a safetensors checkpoint")
    shapes: dict[str, list[int]] = {}
    for name in files:
        file = os.path.join(path, name)
        try:
            with safe_open(file, framework="pt", device="cpu") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    shapes[key] = list(f.get_slice(key).get_shape())
        except FileNotFoundError:
            raise VerifierError(f"{file} is missing (named in {INDEX_FILE})") from None
        except Exception as exc:  # safetensors raises its own error types for a damaged header
            raise VerifierError(f"{file} is not a readable safetensors file ({exc})") from None
    return shapes


def _decoder_prefixes(keys: list[str], num_layers: int) -> list[str]:
    """Prefixes P under which `P + layers.<i>.` exist for every decoder layer, longest count first."""
    seen: dict[str, set[int]] = {}
    for key in keys:
        m = _LAYER_KEY.match(key)
        if m:
            seen.setdefault(m.group("prefix"), set()).add(int(m.group("index")))
    return [p for p, idx in seen.items() if set(range(num_layers)) <= idx]


def pin_tensors(shapes: dict[str, list[int]], num_layers: int, hidden: int, vocab: int, tied: bool,
                path: str) -> dict[str, str]:
    """The exact keys of the language model's embedding, lm_head and final norm (see module docstring)."""
    keys = list(shapes)
    candidates = []
    for prefix in _decoder_prefixes(keys, num_layers):
        embed, norm = f"{prefix}embed_tokens.weight", f"{prefix}norm.weight"
        if embed in shapes and norm in shapes:
            candidates.append(prefix)
    if len(candidates) != 1:
        found = ", ".join(repr(p) for p in candidates) or "none"
        raise VerifierError(f"{path}: cannot tell which tensors are the language model's ({num_layers} decoder "
                            f"layers with embed_tokens and norm beside them; found prefixes: {found})")
    prefix = candidates[0]
    parent = prefix[: -len("model.")] if prefix.endswith("model.") else prefix
    head = f"{parent}lm_head.weight"
    if head not in shapes:
        if not tied:
            raise VerifierError(f"{path}: no {head!r} tensor and tie_word_embeddings is false")
        head = f"{prefix}embed_tokens.weight"
    pinned = {EMBED: f"{prefix}embed_tokens.weight", LM_HEAD: head, NORM: f"{prefix}norm.weight"}
    want = {EMBED: [vocab, hidden], LM_HEAD: [vocab, hidden], NORM: [hidden]}
    for name, key in pinned.items():
        if shapes[key] != want[name]:
            raise VerifierError(f"{path}: tensor {key!r} has shape {shapes[key]}, expected {want[name]} for the "
                                f"language model's {name.split('.')[0]} (hidden {hidden}, vocab {vocab})")
    return pinned


def inspect_verifier(path: str) -> VerifierInfo:
    """Read the verifier at `path` (a local directory on this host); VerifierError says what is wrong."""
    base = config_reader.read_verifier(path)
    shapes = weight_shapes(path)
    pinned = pin_tensors(shapes, base.num_layers, base.hidden_size, base.vocab_size, base.tied, path)
    return replace(base, pinned=pinned, shapes={k: shapes[k] for k in sorted(set(pinned.values()))},
                   keys=tuple(shapes))
