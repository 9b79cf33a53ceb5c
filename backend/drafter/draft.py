"""Loading a draft checkpoint the way serving will, and an untrained draft of the same shape.

Both go through speculators' own Eagle3DraftModel (from_pretrained / the constructor, then its vocab
mapping and verifier weights) inside the verifier adapters of backend/drafter/adapters.py, so a nested
verifier's tensors are the pinned ones and a remote-code config resolves. The attention implementation
is not saved in a checkpoint; it is set before loading (sdpa: it runs everywhere).
"""
from __future__ import annotations

from typing import Any

import torch

from backend.drafter.acceptance import VerifierHead
from backend.drafter.adapters import verifier_adapters
from backend.drafter.verifier import LM_HEAD, VerifierInfo

ATTN_IMPL = "sdpa"


def _config(ckpt: str, info: VerifierInfo) -> Any:
    from speculators.models.eagle3.core import Eagle3DraftModel

    config = Eagle3DraftModel.config_class.from_pretrained(ckpt)
    config.transformer_layer_config._attn_implementation = ATTN_IMPL  # noqa: SLF001
    config.speculators_config.verifier.name_or_path = info.path  # this host's copy of the verifier
    return config


def load_draft(ckpt: str, info: VerifierInfo) -> Any:
    """The trained draft at `ckpt`, float32, in eval mode."""
    from speculators.models.eagle3.core import Eagle3DraftModel

    with verifier_adapters(info):
        model = Eagle3DraftModel.from_pretrained(ckpt, config=_config(ckpt, info), dtype=torch.float32)
    return model.float().eval()


def untrained_draft(ckpt: str, info: VerifierInfo, seed: int = 0) -> Any:
    """A freshly initialised draft of the same shape (same vocab mapping and verifier weights)."""
    from safetensors import safe_open
    from speculators.models.eagle3.core import Eagle3DraftModel

    config = _config(ckpt, info)
    d2t = t2d = None
    with safe_open(f"{ckpt}/model.safetensors", framework="pt", device="cpu") as f:
        if "d2t" in f.keys() and "t2d" in f.keys():
            d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    torch.manual_seed(seed)
    with verifier_adapters(info):
        model = Eagle3DraftModel(config)
        model.load_vocab_mappings(t2d, d2t)
        model.load_verifier_weights()
    return model.float().eval()


def verifier_head(model: Any, info: VerifierInfo) -> VerifierHead:
    """The verifier's final norm (already in the draft, pinned) and its full lm_head."""
    from safetensors import safe_open

    from backend.drafter.verifier import INDEX_FILE, SINGLE_FILE
    import json
    import os

    key = info.pinned[LM_HEAD]
    index = os.path.join(info.path, INDEX_FILE)
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            shard = json.load(f)["weight_map"][key]
    else:
        shard = SINGLE_FILE
    with safe_open(os.path.join(info.path, shard), framework="pt", device="cpu") as f:
        weight = f.get_tensor(key)
    return VerifierHead(model.verifier_norm.float(), weight)


def saved_tensor_names(model: Any) -> set[str]:
    """The tensors a complete checkpoint of `model` holds (speculators leaves out the verifier's own)."""
    skip = set(getattr(model, "_keys_to_ignore_on_save", None) or [])
    names = set(model.state_dict()) - skip
    if not getattr(model, "use_draft_vocab", False):
        names -= {"d2t", "t2d"}
    return names
