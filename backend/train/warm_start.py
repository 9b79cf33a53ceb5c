"""Warm start: training begins from an existing drafter (`--from-pretrained`), not from random weights.

The checkpoint is named by a run id of this work dir (a train run: its chosen checkpoint; a fetch_drafter
run: the published drafter it fetched and verified) or by a directory path. Before the run directory is
touched it must fit the verifier and the hidden states it will train on, each problem one line:

- speculators' eagle3 format (backend/drafter/checks.py, the checks verify runs);
- the verifier's hidden size and vocabulary (the draft's transformer_layer_config);
- the aux layer ids the hidden states were extracted at (the draft's fc reads exactly those layers);
- its draft vocabulary: a consistent d2t/t2d mapping, and the size the run asks for. A different draft
  vocabulary is refused: the draft's lm_head rows belong to its own token set (speculators 0.9 loads a
  missing d2t/t2d silently as zeros, `_keys_to_ignore_on_load_missing`, so a mapping is never guessed).

speculators loads the draft with `--from-pretrained DIR` and then pulls the verifier's embedding, lm_head
and norm from the verifier path SAVED in the draft's config.json (speculators/model.py
`_load_verifier_weights`); a published drafter names a Hub id there. So the stage stages the checkpoint
as `<run dir>/warm-start/`: its config.json with this host's verifier path, the weights linked, never
copied or changed. speculators refuses the decoder-shaping flags beside --from-pretrained
(speculators/train/config/resolution.py, DECODER_SHAPING_FLAGS): the plan leaves them out.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from backend.contract.lookup import InputError, completed_run
from backend.contract.runs import RUN_ID_PATTERN, read_manifest, run_path, write_json_atomic
from backend.contract.stages import FETCH_DRAFTER as FETCH_STAGE
from backend.drafter.verifier import VerifierInfo

STAGED_DIR = "warm-start"
# the flags speculators refuses beside --from-pretrained (resolution.py: DECODER_SHAPING_FLAGS + --draft-config)
SHAPING_FLAGS = ("--num-layers", "--draft-arch", "--draft-hidden-act", "--sliding-window",
                 "--full-attention-indices", "--draft-config")
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


class WarmStartError(ValueError):
    """The named checkpoint cannot start this run; one line says why and what to do."""


@dataclass(frozen=True)
class WarmStart:
    source: str  # as the operator named it ([train] from_pretrained)
    checkpoint: str  # the checkpoint directory it resolved to
    draft_vocab_size: int
    draft_layers: int
    aux_layer_ids: list[int]
    speculative_tokens: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve(work_dir: str, name: str) -> str:
    """A run id (train or fetch_drafter run) or a directory -> the checkpoint directory."""
    if RUN_ID_PATTERN.fullmatch(name) and os.path.isdir(run_path(work_dir, name)):
        manifest = read_manifest(run_path(work_dir, name))
        stage = manifest.stage if manifest else None
        if stage not in ("train", FETCH_STAGE):
            raise WarmStartError(f"--from-pretrained {name}: run {name!r} is a {stage or 'unknown'} run; name a "
                                 f"train run, a fetch_drafter run or a checkpoint directory")
        try:
            path = completed_run(work_dir, name, stage).output("checkpoint")
        except InputError as exc:
            raise WarmStartError(f"--from-pretrained {name}: {exc}") from None
    elif os.path.isabs(name) or name.startswith("."):
        path = name
    else:
        raise WarmStartError(f"--from-pretrained {name!r}: no such run in {os.path.join(work_dir, 'runs')}, and "
                             f"not a directory path (give an absolute path)")
    if not os.path.isdir(path):
        raise WarmStartError(f"--from-pretrained {name}: checkpoint directory {path} does not exist on this host")
    return os.path.realpath(path)


def check_fit(source: str, ckpt: str, info: VerifierInfo, layer_ids: list[int],
              draft_vocab_size: int | None) -> WarmStart:
    """Refuse (WarmStartError, one line) a checkpoint that does not fit; `draft_vocab_size` None: any."""
    from backend.drafter import checkpoints as ck
    from backend.drafter import checks
    from backend.kit.preflight import PreflightReport

    where = f"warm start {source}"
    try:
        config = ck.read_config(ckpt)
        keys = checks.header(ckpt)
    except ck.CheckpointError as exc:
        raise WarmStartError(f"{where}: {exc}") from None
    report = PreflightReport()
    checks.check_format(report, ckpt, config, keys)
    if not report.ok:
        raise WarmStartError(f"{where}: not a speculators eagle3 checkpoint: {report.failures()}")
    layer = config.get("transformer_layer_config") or {}
    if layer.get("hidden_size") != info.hidden_size:
        raise WarmStartError(f"{where}: its hidden size is {layer.get('hidden_size')}, the verifier's "
                             f"{info.hidden_size}: it was made for another model")
    if layer.get("vocab_size") != info.vocab_size:
        raise WarmStartError(f"{where}: it was made for a vocabulary of {layer.get('vocab_size')} tokens, the "
                             f"verifier has {info.vocab_size}")
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids != list(layer_ids):
        raise WarmStartError(f"{where}: it reads aux layers {ids}, the hidden states were extracted at "
                             f"{list(layer_ids)}: extract (and serve) with its layers ([drafter] aux_layer_ids = "
                             f"{ids}), or start cold")
    checks.check_layer_ids(report, config, info, keys)
    checks.check_vocab(report, ckpt, config, info, keys)
    if not report.ok:
        raise WarmStartError(f"{where}: {report.failures()}")
    own = int(config.get("draft_vocab_size") or info.vocab_size)
    if draft_vocab_size is not None and min(draft_vocab_size, info.vocab_size) != own:
        raise WarmStartError(f"{where}: its draft vocabulary is {own} tokens, the run asks for "
                             f"{draft_vocab_size}: its lm_head and d2t/t2d belong to its own token set; leave "
                             f"[train] draft_vocab_size unset to keep {own}, or start cold")
    n_layers = layer.get("num_hidden_layers")
    return WarmStart(source=source, checkpoint=ckpt, draft_vocab_size=own,
                     draft_layers=int(n_layers) if isinstance(n_layers, int) else 1,
                     aux_layer_ids=list(ids), speculative_tokens=checks.trained_k(config))


def stage(warm: WarmStart, run_dir: str, info: VerifierInfo) -> str:
    """`<run dir>/warm-start/`: the checkpoint's config naming this host's verifier, its weights linked."""
    from backend.drafter import checkpoints as ck

    out = os.path.join(run_dir, STAGED_DIR)
    os.makedirs(out, exist_ok=True)
    config = ck.read_config(warm.checkpoint)
    verifier = config.setdefault("speculators_config", {}).setdefault("verifier", {})
    verifier["name_or_path"] = info.path
    for name in os.listdir(warm.checkpoint):
        if name in _WEIGHT_FILES or (name.endswith(".safetensors") and "index" not in name):
            link = os.path.join(out, name)
            target = os.path.join(warm.checkpoint, name)
            if os.path.islink(link) and os.readlink(link) == target:
                continue
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(target, link)
    write_json_atomic(os.path.join(out, "config.json"), config)
    return out

