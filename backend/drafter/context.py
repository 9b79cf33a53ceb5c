"""The drafter's trained context against the context the server serves.

vLLM serves an EAGLE draft at the target's length whatever the draft was trained for: vLLM 0.32 raises the
draft's `max_position_embeddings` to the target's `max_model_len` (vllm/config/speculative.py:1393-1400,
`_maybe_override_draft_max_position_embeddings` at :1677-1710: "EAGLE drafts share the target's
positional space") and sizes the draft at min(draft, target) (:1556-1561, :1633-1675). Past the length
the drafter was trained at its positions are ones it never saw, and acceptance can fall to zero with no
error (vLLM issue 58080). So: the served context (the baseline's `--max-model-len`) longer than the
checkpoint's `max_position_embeddings` is a warning in verify and a refusal to bench without `--yes`.

Pure; the served length is parsed as vLLM's `human_readable_int_or_auto` does (vllm/utils/argparse_utils.py:
29-93): `32768`, `32k` (x1000), `32K` (x1024), `25.6k`; `-1`/`auto` mean the model's own length (unknown here).
"""
from __future__ import annotations

import re
from typing import Any, Sequence

ISSUE = "vLLM issue 58080"
FLAGS = ("--max-model-len", "--max_model_len")
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_length(text: str) -> int | None:
    """A --max-model-len value as vLLM reads it; None for -1/auto (the model's own) or what vLLM refuses."""
    value = text.strip()
    if value == "-1" or value.lower() == "auto":
        return None
    m = _HUMAN.fullmatch(value)
    if m:
        number, suffix = m.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        return int(number) * _BINARY[suffix] if number.isdigit() else None
    return int(value) if re.fullmatch(r"\d{1,12}", value) else None


def served_context(argv: Sequence[str]) -> int | None:
    """The --max-model-len a server command line gives (the last one wins, as argparse takes it)."""
    found: int | None = None
    args = list(argv)
    for i, arg in enumerate(args):
        for flag in FLAGS:
            if arg == flag and i + 1 < len(args):
                found = parse_length(args[i + 1])
            elif arg.startswith(flag + "="):
                found = parse_length(arg[len(flag) + 1:])
    return found


def drafter_context(config: Any) -> int | None:
    """The length a speculators checkpoint was built for: its transformer layer's max_position_embeddings
    (where speculators writes it), else a top-level one."""
    if not isinstance(config, dict):
        return None
    layer = config.get("transformer_layer_config")
    for where in (layer if isinstance(layer, dict) else {}, config):
        value = where.get("max_position_embeddings")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def context_warning(served: int | None, drafter: int | None, checkpoint: str) -> str | None:
    """The warning when the server serves a longer context than the drafter was built for; else None."""
    if served is None or drafter is None or served <= drafter:
        return None
    return (f"the served context ({served} tokens, the baseline's --max-model-len) is longer than the drafter's "
            f"({drafter}, max_position_embeddings in {checkpoint}/config.json): vLLM serves the draft at the "
            f"server's length anyway, and past {drafter} tokens its acceptance can fall to zero without an error "
            f"({ISSUE})")
