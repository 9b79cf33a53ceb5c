"""What the host-side stages need to know about the verifier checkpoint, read from its config.json alone.

Reading the config (no weights, no torch) is enough for prepare and extract, and to refuse bad input before
anything expensive starts: a verifier path that is not on this host, aux layer ids outside its decoder,
token ids outside its vocabulary. Nested configs (Kimi-K2.5 style: the language model's settings under
`text_config`) are unwrapped the way speculators does. The one reader of the config: the train and verify
stages extend what it reads with the weights' exact names (backend/drafter/verifier.py).

Aux layer ids follow vLLM's convention for `eagle_aux_hidden_state_layer_ids`: id L is the state
ENTERING decoder layer L (Hugging Face `output_hidden_states[L]`, 0 being the embeddings), so the valid
ids are 0 .. num_layers-1; vLLM's default is (2, n//2, n-3).

The extraction server is asked for one state more: vLLM's `extract_hidden_states` writes exactly one state
per listed id, and speculators' trainer reads the last one as the verifier's final state (before the final
norm), which vLLM gives for id n = num_layers. So the server gets the aux ids plus n (speculators' own
launcher does the same, `--include-last-layer`), training and verify get the aux ids alone:
`extraction_layer_ids` is that rule, stated once.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

CONFIG_FILE = "config.json"
# bytes per value of the checkpoint's dtype: the server computes, and the hidden-states connector writes,
# in that dtype; unknown or unset: bf16, what a large verifier is served in
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


class VerifierError(ValueError):
    """The verifier cannot be used (whichever stage finds it); the message says why in one line."""


@dataclass(frozen=True)
class VerifierInfo:
    path: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    nested: bool  # the language model's settings sit under text_config
    model_type: str
    dtype: str = "bfloat16"
    architectures: tuple[str, ...] = ()
    remote_code: bool = False  # config.json names classes in `auto_map`: load with trust_remote_code
    tied: bool = False  # tie_word_embeddings: lm_head is the embedding
    text_model_type: str = ""  # text_config's model_type (a nested checkpoint's language model), else ""
    # from the weights' headers (backend/drafter/verifier.py inspect_verifier; empty from config.json alone)
    pinned: dict[str, str] = field(default_factory=dict)  # speculators' name -> exact checkpoint key
    shapes: dict[str, list[int]] = field(default_factory=dict)  # exact key -> shape (pinned keys)
    keys: tuple[str, ...] = field(default=(), repr=False, compare=False)  # every tensor name

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 2)

    @property
    def fingerprint(self) -> str:
        """Identifies this verifier's shape and tensors without reading weights (for refusing checkpoints
        trained against another verifier)."""
        blob = json.dumps({"arch": self.architectures, "layers": self.num_layers, "hidden": self.hidden_size,
                           "vocab": self.vocab_size, "pinned": self.pinned, "shapes": self.shapes},
                          sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def needs_pinning(self) -> bool:
        """True when speculators' own suffix lookup would not pick exactly the pinned tensors."""
        keys = list(self.keys)
        return any(speculators_pick(name, keys) != key for name, key in self.pinned.items())

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["keys"]
        return {**out, "fingerprint": self.fingerprint}

    def default_aux_layers(self) -> list[int]:
        return default_aux_layers(self.num_layers)

    def vllm_floor(self):
        """The oldest vLLM its extraction server runs on, and why (backend/kit/vllm_floor.py)."""
        from backend.kit.vllm_floor import extraction_floor
        return extraction_floor((self.model_type, self.text_model_type), self.architectures)


def speculators_pick(name: str, keys: list[str]) -> str | None:
    """The key speculators 0.9.0 would take for `name`: exact, else the shortest key ending with it
    (aliases aside). Used only to detect when pinning changes the outcome."""
    if name in keys:
        return name
    matches = [k for k in keys if k.endswith(name)]
    return min(matches, key=len) if matches else None


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
                        # the checkpoint's own type (what AutoConfig keys on), not its text model's
                        model_type=str(config.get("model_type") or settings.get("model_type") or ""),
                        dtype=_dtype(settings) or _dtype(config) or "bfloat16",
                        architectures=tuple(str(a) for a in config.get("architectures") or ()),
                        remote_code=isinstance(config.get("auto_map"), dict),
                        tied=bool(settings.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
                        text_model_type=str(text.get("model_type") or "") if nested else "")


def _dtype(config: dict[str, Any]) -> str | None:
    value = config.get("dtype") or config.get("torch_dtype")  # transformers 5 writes `dtype`, 4.x `torch_dtype`
    return str(value).removeprefix("torch.") if isinstance(value, str) else None


def check_layer_ids(info: VerifierInfo, layer_ids: list[int]) -> None:
    """Aux layer ids in vLLM's convention: the state entering decoder layer L, so 0 <= L < num_layers."""
    if not layer_ids:
        raise VerifierError("no aux layer ids: set [drafter] aux_layer_ids in the profile (e.g. [2, n//2, n-3])")
    bad = [i for i in layer_ids if not 0 <= i < info.num_layers]
    if bad:
        raise VerifierError(f"aux layer ids {bad} are out of range for {info.path} ({info.num_layers} decoder "
                            f"layers: valid ids are 0..{info.num_layers - 1}, the state entering that layer)")
    if len(set(layer_ids)) != len(layer_ids):
        raise VerifierError(f"aux layer ids {layer_ids} repeat a layer")


def extraction_layer_ids(aux_layer_ids: Sequence[int], num_layers: int) -> list[int]:
    """What the extraction server is asked for: the aux ids, then the final layer n (the last decoder
    layer's output before the final norm, which speculators' trainer reads as `hidden_states[:, -1]`)."""
    return [*(int(i) for i in aux_layer_ids), int(num_layers)]


def check_extraction_layer_ids(info: VerifierInfo, layer_ids: Sequence[int]) -> list[int]:
    """The ids an extraction server is started with, or VerifierError: the aux ids (the rule of
    check_layer_ids) followed by the final layer, id n, which is valid here and only here."""
    ids = [int(i) for i in layer_ids]
    n = info.num_layers
    if not ids or ids[-1] != n:
        raise VerifierError(f"the extraction server's layer ids {ids} do not end with {n}, the final layer of "
                            f"{info.path}: speculators' trainer reads the last state as the verifier's final "
                            f"one, so ask for the aux ids plus {n}")
    check_layer_ids(info, ids[:-1])
    return ids


def default_aux_layers(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


def check_aux_layers(layer_ids: Sequence[int], info: VerifierInfo) -> list[int]:
    """The ids as a list, or VerifierError: distinct, each the input of one decoder layer (0..n-1); the
    rule is check_layer_ids, stated once."""
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
