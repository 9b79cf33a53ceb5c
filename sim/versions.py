"""What differs between vLLM releases, as far as the stand-in imitates them.

Cut-overs come from /work/shared/notes/vllm-surface.md; where the notes leave a boundary open we pick
one and say so here, so the console's parsers are tested against a stated choice:
- error body: nested `{"error": {...}}` from 0.12.0, flat `{"object": "error", ...}` before (our pick).
- `usage.completion_tokens_details.reasoning_tokens`: from 0.16.0 (our pick, with the reasoning rename).
- the model runner (read in each release's vllm/config/vllm.py `use_v2_model_runner`): the V2 runner is the
  default for every model from 0.29.0 (eagle3 and extract_hidden_states included); 0.22-0.28 default only some
  architectures to it (dense models from 0.25, a listed few MoE ones), and the stand-in emulates the seed
  host's MoE verifier (Kimi-K2.5, never on that list), so V1 before 0.29. `VLLM_USE_V2_MODEL_RUNNER=0|1` in
  the environment forces either, as in vLLM (the V2 runner exists from 0.12, says `Using V2 Model Runner`
  from 0.16).
- `Model loading took` wording (checked in 0.10 .. 0.33): V1 runner `%.4f GiB and` up to 0.11, `%.4f GiB
  memory and` in 0.12 (and 0.13, our pick), `%s GiB memory and` (two decimals at most) from 0.14; V2 runner
  `%.4f GiB and` in 0.12 (and 0.13), `%s GiB and` 0.14 .. 0.27, `%s GiB memory and` from 0.28.
- one-line KV cache message and `Starting vLLM server on`: from 0.18.0 (notes: <= 0.17 is the old form).
- `torch.compile took`: from 0.17.0 (notes: <= 0.16 says `takes`).
- `(PROC pid=N) ` prefix: from 0.11.0.
- a request longer than the context (`context_errors`): up to 0.11 `This model's maximum context length is
  L tokens. However, your request has N input tokens...` and `'max_tokens' or 'max_completion_tokens' is
  too large: M...`; from 0.14.0 (our pick) the renderer's `You passed N input tokens and requested M
  output tokens...`, a chat prompt counted only up to the input room + 1, with a
  `(parameter=input_tokens, value=N)` tail, and `max_tokens=M cannot be greater than
  max_model_len=max_total_tokens=L` for a budget over the context; from 0.25.0 (0.25.1 has it) `This
  model's maximum context length is L tokens. However, you requested M output tokens and your prompt
  contains [at least] N input tokens, for a total of [at least] T tokens...` (a chat prompt counted in
  full, a text prompt up to the room + 1). /tokenize counts any length in every version (our pick).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, int, int]

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-].*)?$")
REASONING_FIELDS = ("reasoning", "reasoning_content", "both")


def parse_version(text: str) -> Version:
    match = _VERSION_RE.match(text.strip())
    if not match:
        raise ValueError(f"not a vLLM version: {text!r} (expected MAJOR.MINOR[.PATCH], e.g. 0.33.0)")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


@dataclass(frozen=True)
class Traits:
    version: str
    proc_prefix: bool
    new_server_line: bool
    kv_one_line: bool
    compile_took: bool
    model_runner: str  # "v1" | "v2": whose load lines the stand-in prints
    version_tuple: Version
    nested_errors: bool
    reasoning_tokens_detail: bool
    old_cache_gauge: bool  # vllm:gpu_cache_usage_perc still exported
    context_errors: str  # wording of a too-long request's 400: "0.11" | "renderer" | "total"
    reasoning_keys: tuple[str, ...]  # keys that carry the reasoning text in message/delta


def reasoning_keys_for(version: Version, override: str | None = None) -> tuple[str, ...]:
    if override is not None:
        if override not in REASONING_FIELDS:
            raise ValueError(f"--reasoning-field must be one of {', '.join(REASONING_FIELDS)}, not {override!r}")
        return ("reasoning", "reasoning_content") if override == "both" else (override,)
    if version <= (0, 11, 0):
        return ("reasoning_content",)
    if version < (0, 16, 0):
        return ("reasoning", "reasoning_content")
    return ("reasoning",)


def model_runner_for(version: Version, forced: str | None = None) -> str:
    """"v2" or "v1": the runner this version picks for the stand-in's (MoE) model; `forced` is
    VLLM_USE_V2_MODEL_RUNNER as vLLM reads it ("1"/"true" or "0"/"false"; unset or empty: the default)."""
    if forced is not None and forced.strip():
        value = forced.strip().lower()
        if value not in ("0", "1", "true", "false"):
            raise ValueError(f"VLLM_USE_V2_MODEL_RUNNER={forced!r}: expected 0 or 1")
        return "v2" if value in ("1", "true") and version >= (0, 12, 0) else "v1"
    return "v2" if version >= (0, 29, 0) else "v1"


def traits_for(version_text: str, reasoning_field: str | None = None, use_v2_runner: str | None = None) -> Traits:
    v = parse_version(version_text)
    return Traits(
        version=version_text,
        proc_prefix=v >= (0, 11, 0),
        new_server_line=v >= (0, 18, 0),
        kv_one_line=v >= (0, 18, 0),
        compile_took=v >= (0, 17, 0),
        model_runner=model_runner_for(v, use_v2_runner),
        version_tuple=v,
        nested_errors=v >= (0, 12, 0),
        reasoning_tokens_detail=v >= (0, 16, 0),
        old_cache_gauge=v < (0, 12, 0),
        context_errors="0.11" if v < (0, 14, 0) else ("renderer" if v < (0, 25, 0) else "total"),
        reasoning_keys=reasoning_keys_for(v, reasoning_field),
    )
