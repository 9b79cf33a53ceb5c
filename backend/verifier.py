"""What the host-side stages need to know about the verifier checkpoint, read from its config.json alone.

Reading the config (no weights, no torch) is enough for prepare and extract, and to refuse bad input before
anything expensive starts (the train stage's backend/train/verifier.py also reads the weights' names): a verifier path that is not on this host, aux layer ids outside its decoder, token ids outside
its vocabulary. Nested configs (Kimi-K2.5 style: the language model's settings under `text_config`) are
unwrapped the way speculators does.

Aux layer ids follow vLLM's convention for `eagle_aux_hidden_state_layer_ids`: id L is the state
ENTERING decoder layer L (Hugging Face `output_hidden_states[L]`, 0 being the embeddings), so the valid
ids are 0 .. num_layers-1; vLLM's default is (2, n//2, n-3).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

# one error type for a verifier that cannot be used, whichever stage finds it
from backend.train.verifier import VerifierError, check_layer_ids

CONFIG_FILE = "config.json"
# bytes per value of the checkpoint's dtype: the server computes, and the hidden-states connector writes,
# in that dtype; unknown or unset: bf16, what a large verifier is served in
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


@dataclass(frozen=True)
class VerifierInfo:
    path: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    nested: bool  # the language model's settings sit under text_config
    model_type: str
    dtype: str = "bfloat16"

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 2)

    def default_aux_layers(self) -> list[int]:
        return default_aux_layers(self.num_layers)


def _int(config: dict[str, Any], key: str, where: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise VerifierError(f"{where}: `{key}` is {value!r}, expected a positive integer")
    return value


def read_verifier(path: str) -> VerifierInfo:
    """The verifier at `path` (a local checkpoint directory), or VerifierError saying what is wrong."""
    if not path:
        raise VerifierError("no verifier path given (the checkpoint directory the server loads)")
    if not os.path.isdir(path):
        what = "is a file, not a directory" if os.path.exists(path) else "does not exist on this host"
        raise VerifierError(f"verifier {path} {what}: give the local checkpoint directory the server loads "
                            f"(config.json, tokenizer files, weights)")
    name = os.path.join(path, CONFIG_FILE)
    try:
        with open(name, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise VerifierError(f"verifier {path} has no {CONFIG_FILE}: is it a Hugging Face checkpoint "
                            f"directory?") from None
    except (OSError, ValueError) as exc:
        raise VerifierError(f"{name}: cannot read it ({exc})") from None
    if not isinstance(config, dict):
        raise VerifierError(f"{name}: expected a JSON object")
    text = config.get("text_config")
    nested = isinstance(text, dict)
    settings = text if nested else config
    where = f"{name}{' (text_config)' if nested else ''}"
    return VerifierInfo(path=os.path.abspath(path), num_layers=_int(settings, "num_hidden_layers", where),
                        hidden_size=_int(settings, "hidden_size", where),
                        vocab_size=_int(settings, "vocab_size", where), nested=nested,
                        model_type=str(settings.get("model_type") or config.get("model_type") or ""),
                        dtype=_dtype(settings) or _dtype(config) or "bfloat16")


def _dtype(config: dict[str, Any]) -> str | None:
    value = config.get("dtype") or config.get("torch_dtype")  # transformers 5 writes `dtype`, 4.x `torch_dtype`
    return str(value).removeprefix("torch.") if isinstance(value, str) else None


def default_aux_layers(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


def check_aux_layers(layer_ids: Sequence[int], info: VerifierInfo) -> list[int]:
    """The ids as a list, or VerifierError: distinct, each the input of one decoder layer (0..n-1); the
    rule is the train stage's (backend.train.verifier.check_layer_ids), stated once."""
    ids = [int(i) for i in layer_ids]
    check_layer_ids(info, ids)  # reads only .path and .num_layers
    return ids


def resolve_aux_layers(layer_ids: Sequence[int] | None, info: VerifierInfo) -> list[int]:
    """The ids given, or vLLM's default for this verifier when none are; checked either way."""
    if layer_ids:
        return check_aux_layers(layer_ids, info)
    default = info.default_aux_layers()
    try:
        return check_aux_layers(default, info)
    except VerifierError:
        raise VerifierError(f"the default aux layer ids {default} (2, n//2, n-3) do not work for a verifier "
                            f"with {info.num_layers} layers: set [drafter].aux_layer_ids, e.g. "
                            f"{list(range(1, min(info.num_layers, 4)))}") from None
