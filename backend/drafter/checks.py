"""The checkpoint as vLLM will load it: format, aux layer ids, draft vocabulary mapping, verifier path.

Each check is a backend.kit.preflight.Check (name, ok, detail, fix). They read config.json and the
safetensors header (and the d2t/t2d tensors); `load_draft` then loads the weights the way
speculators does (and vLLM's speculators-format loader keys on the same fields).
"""
from __future__ import annotations

import os
from typing import Any

from backend.drafter import checkpoints as ck
from backend.drafter.verifier import VerifierInfo
from backend.kit.preflight import PreflightReport

WEIGHTS = "model.safetensors"
# the tensors every EAGLE-3 speculators checkpoint carries (vLLM's eagle3 loader maps these names)
REQUIRED = ("fc.weight", "norm.weight", "lm_head.weight", "layers.0.self_attn.q_proj.weight")


def trained_k(config: dict[str, Any]) -> int | None:
    """The K (speculative tokens) a speculators checkpoint's config.json says it was trained for, if it says."""
    spec = config.get("speculators_config")
    methods = spec.get("proposal_methods") if isinstance(spec, dict) else None
    if isinstance(methods, list) and methods and isinstance(methods[0], dict):
        value = methods[0].get("speculative_tokens")
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def check_format(report: PreflightReport, ckpt: str, config: dict[str, Any], keys: dict[str, list[int]]) -> None:
    problems = []
    if config.get("speculators_model_type") != "eagle3":
        problems.append(f"speculators_model_type is {config.get('speculators_model_type')!r}, not 'eagle3'")
    spec = config.get("speculators_config")
    if not isinstance(spec, dict) or spec.get("algorithm") != "eagle3":
        problems.append("speculators_config.algorithm is not 'eagle3'")
    k = trained_k(config)
    if k is None:
        problems.append("no proposal method with speculative_tokens")
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict) or layer.get("model_type") not in ("llama", "qwen3"):
        problems.append("transformer_layer_config is missing or not a llama/qwen3 decoder config")
    missing = [name for name in REQUIRED if name not in keys]
    if missing:
        problems.append(f"{WEIGHTS} lacks {', '.join(missing)}")
    report.add("speculators_format", not problems,
               "; ".join(problems) if problems else
               f"eagle3 speculators checkpoint, {k} speculative tokens, {len(keys)} tensors",
               "train again with this console's train stage (or convert with `speculators convert`)")


def check_layer_ids(report: PreflightReport, config: dict[str, Any], info: VerifierInfo,
                    keys: dict[str, list[int]]) -> None:
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    n = info.num_layers
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        report.add("aux_layer_ids", False, "eagle_aux_hidden_state_layer_ids is missing",
                   "vLLM would fall back to its defaults (2, n//2, n-3): retrain with explicit ids")
        return
    bad = [i for i in ids if not 0 <= i < n]
    fc = keys.get("fc.weight")
    width_ok = fc is None or fc[1] == len(ids) * info.hidden_size
    if bad or not width_ok or len(set(ids)) != len(ids):
        detail = (f"ids {bad} are outside 0..{n - 1} for a {n}-layer verifier" if bad else
                  f"fc reads {fc[1] if fc else '?'} features, not {len(ids)} x {info.hidden_size}" if not width_ok
                  else f"ids {ids} repeat a layer")
        report.add("aux_layer_ids", False, detail,
                   "vLLM takes the ids literally (the state entering layer i): retrain with ids in range "
                   "(SpecForge exports use the output-of-layer convention, one higher)")
        return
    report.add("aux_layer_ids", True, f"{ids}: inside the verifier's {n} layers, vLLM's convention "
                                      f"(the state entering each layer)")


def check_vocab(report: PreflightReport, ckpt: str, config: dict[str, Any], info: VerifierInfo,
                keys: dict[str, list[int]]) -> None:
    draft_vocab = config.get("draft_vocab_size")
    head = keys.get("lm_head.weight")
    if head is not None and draft_vocab is not None and head[0] != draft_vocab:
        report.add("draft_vocab", False, f"lm_head has {head[0]} rows but draft_vocab_size is {draft_vocab}",
                   "the checkpoint is inconsistent: retrain")
        return
    if draft_vocab is None or draft_vocab >= info.vocab_size:
        report.add("draft_vocab", True, f"full vocabulary ({info.vocab_size} tokens): no mapping needed")
        return
    if "d2t" not in keys or "t2d" not in keys:
        report.add("draft_vocab", False, f"draft vocabulary {draft_vocab} < {info.vocab_size} but the d2t/t2d "
                   f"mapping is missing", "retrain with a token frequency file (the prepare run's token_freq)")
        return
    import torch
    from safetensors import safe_open

    with safe_open(os.path.join(ckpt, WEIGHTS), framework="pt", device="cpu") as f:
        d2t, t2d = f.get_tensor("d2t").long(), f.get_tensor("t2d").bool()
    targets = d2t + torch.arange(d2t.shape[0])
    problems = []
    if d2t.shape[0] != draft_vocab:
        problems.append(f"d2t has {d2t.shape[0]} entries, not {draft_vocab}")
    if t2d.shape[0] != info.vocab_size:
        problems.append(f"t2d covers {t2d.shape[0]} tokens, not the verifier's {info.vocab_size}")
    elif int(t2d.sum()) != draft_vocab:
        problems.append(f"t2d marks {int(t2d.sum())} tokens, not {draft_vocab}")
    if not problems:
        if int(targets.min()) < 0 or int(targets.max()) >= info.vocab_size:
            problems.append("d2t maps outside the verifier's vocabulary")
        elif not bool((targets[1:] > targets[:-1]).all()):
            problems.append("d2t targets are not strictly increasing (duplicates)")
        elif not bool(t2d[targets].all()):
            problems.append("d2t and t2d disagree")
    report.add("draft_vocab", not problems, "; ".join(problems) if problems else
               f"{draft_vocab} of {info.vocab_size} tokens; d2t and t2d consistent",
               "retrain: the mapping is corrupt")


def check_verifier(report: PreflightReport, ckpt: str, config: dict[str, Any], info: VerifierInfo) -> None:
    saved = ck.saved_verifier(config).get("name_or_path")
    try:
        ck.check_against(ckpt, config, info)
    except ck.CheckpointError as exc:
        report.add("verifier", False, str(exc), "verify with the verifier it was trained for")
        return
    recorded = ck.recorded_fingerprint(ckpt)
    if recorded is not None and recorded != info.fingerprint:
        report.add("verifier", False, f"{ckpt} was trained against another verifier (fingerprint {recorded}, "
                   f"{info.path} is {info.fingerprint})", "verify with the verifier it was trained for")
        return
    if not saved or not os.path.isdir(str(saved)):
        report.add("verifier", False, f"the verifier path saved in the checkpoint ({saved}) does not exist on "
                   f"this host", f"serve with the long form --speculative-config naming the model, or retrain "
                   f"with the verifier at {info.path}")
        return
    same = os.path.realpath(str(saved)) == os.path.realpath(info.path)
    report.add("verifier", True, f"{saved} exists on this host" + ("" if same else f" (verifying with {info.path})"))


def header(ckpt: str) -> dict[str, list[int]]:
    from backend.drafter.verifier import VerifierError, weight_shapes

    try:
        return weight_shapes(ckpt)
    except VerifierError as exc:
        raise ck.CheckpointError(str(exc)) from None
