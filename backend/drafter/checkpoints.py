"""Checkpoints as the train stage leaves them, and which verifier they belong to.

speculators saves `<save>/<epoch>/` (config.json, model.safetensors, optimizer and scheduler state,
training_state.json) and a `checkpoint_best` symlink to the epoch with the lowest validation loss. The
stage adds `<save>/verifier.json`, the verifier's fingerprint (backend/drafter/verifier.py), so a save
root, or a checkpoint, trained against another verifier is refused instead of resumed or verified.

speculators writes each save in place over `<save>/<epoch>/` (a mid-epoch save and the epoch's end
save share that directory), so a kill -9 during a save would leave the only copy of that epoch torn
(config.json half written) and the run could not resume. The stage's trainer writes every save into
`<save>/.saving/<epoch>/` and commits it with two renames (`commit_staged`); `recover_interrupted_save`,
run before each start, finishes or undoes a commit a kill interrupted, so a restart always finds either
the previous checkpoint or the new one whole.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any

from backend.contract.runs import read_json_object, write_json_atomic
from backend.drafter.verifier import VerifierInfo

VERIFIER_FILE = "verifier.json"
BEST_LINK = "checkpoint_best"
STAGING_DIR = ".saving"  # a save being written: <save>/.saving/<epoch>/ (speculators skips non-numeric names)
REPLACED_PREFIX = ".replaced-"  # the checkpoint a commit replaces, for the instant between its two renames


class CheckpointError(ValueError):
    """A checkpoint directory cannot be used as asked; one line says why."""


def epoch_dirs(save_path: str) -> list[int]:
    try:
        names = os.listdir(save_path)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(save_path, n))
                  and not os.path.islink(os.path.join(save_path, n)))


def staged_dir(save_path: str, epoch: int) -> str:
    return os.path.join(save_path, STAGING_DIR, str(epoch))


def commit_staged(save_path: str, epoch: int) -> str:
    """Put the staged save of `epoch` in place of `<save>/<epoch>/`. A kill at any instant leaves the old
    checkpoint whole (under its own name or `.replaced-<epoch>`) or the new one in place."""
    staged, final = staged_dir(save_path, epoch), os.path.join(save_path, str(epoch))
    replaced = os.path.join(save_path, f"{REPLACED_PREFIX}{epoch}")
    if os.path.isdir(final):
        if os.path.isdir(replaced):
            shutil.rmtree(replaced)
        os.rename(final, replaced)
    os.rename(staged, final)
    shutil.rmtree(replaced, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(staged))  # tidy when empty; another rank's leftovers stay for recovery
    except OSError:
        pass
    return final


def recover_interrupted_save(save_path: str) -> list[str]:
    """Finish or undo a save a kill interrupted; returns one line per repair (empty: nothing to do)."""
    try:
        names = sorted(os.listdir(save_path))
    except OSError:
        return []
    done = []
    for name in names:
        epoch = name[len(REPLACED_PREFIX):]
        if not (name.startswith(REPLACED_PREFIX) and epoch.isdigit()):
            continue
        old, final = os.path.join(save_path, name), os.path.join(save_path, epoch)
        if os.path.isdir(final):  # the new checkpoint landed; the old one was about to go
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(old, final)
            done.append(f"checkpoint {epoch}: the save that was replacing it was cut off; the previous one is back")
    staging = os.path.join(save_path, STAGING_DIR)
    if os.path.isdir(staging):
        partial = sorted(os.listdir(staging))
        shutil.rmtree(staging)
        if partial:
            done.append(f"dropped a save cut off while it was written ({', '.join(partial)} in {STAGING_DIR}/)")
    return done


def best_checkpoint(save_path: str) -> str | None:
    """speculators' best by validation loss, else the newest epoch's (the stage prefers the best held-out
    acceptance when it was measured: backend/train/selection.py)."""
    link = os.path.join(save_path, BEST_LINK)
    if os.path.isdir(link):
        return os.path.realpath(link)
    epochs = epoch_dirs(save_path)
    return os.path.join(os.path.abspath(save_path), str(epochs[-1])) if epochs else None


def loss_best_epoch(save_path: str) -> int | None:
    """The epoch speculators' `checkpoint_best` link names (lowest validation loss), if any."""
    link = os.path.join(save_path, BEST_LINK)
    name = os.path.basename(os.path.realpath(link)) if os.path.islink(link) else ""
    return int(name) if name.isdigit() else None


def read_config(ckpt: str) -> dict[str, Any]:
    return read_json_object(os.path.join(ckpt, "config.json"), CheckpointError,
                            f"{ckpt} has no config.json: not a speculators checkpoint")



def saved_verifier(config: dict[str, Any]) -> dict[str, Any]:
    spec = config.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    return verifier if isinstance(verifier, dict) else {}


def check_against(ckpt: str, config: dict[str, Any], info: VerifierInfo) -> None:
    """Refuse a checkpoint whose shape or recorded verifier is not `info`'s."""
    layer = config.get("transformer_layer_config")
    layer = layer if isinstance(layer, dict) else {}
    verifier = saved_verifier(config)
    problems = []
    if layer.get("hidden_size") not in (None, info.hidden_size):
        problems.append(f"hidden size {layer.get('hidden_size')} (the verifier's is {info.hidden_size})")
    if layer.get("vocab_size") not in (None, info.vocab_size):
        problems.append(f"vocabulary {layer.get('vocab_size')} (the verifier's is {info.vocab_size})")
    archs = verifier.get("architectures")
    if archs and info.architectures and list(archs) != list(info.architectures):
        problems.append(f"verifier architecture {archs} (this one is {info.architectures})")
    if problems:
        raise CheckpointError(f"{ckpt} was trained for another verifier than {info.path}: "
                              f"{'; '.join(problems)}. Use a checkpoint of this verifier (or another --run-id)")


def check_save_root(save_path: str, info: VerifierInfo) -> None:
    """Refuse to resume into a save root holding another verifier's checkpoints."""
    marker = os.path.join(save_path, VERIFIER_FILE)
    if os.path.exists(marker):
        try:
            with open(marker, encoding="utf-8") as f:
                recorded = json.load(f)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{marker} is not readable JSON ({exc}); move {save_path} away or pass "
                                  f"--fresh") from None
        if isinstance(recorded, dict) and recorded.get("fingerprint") != info.fingerprint:
            raise CheckpointError(f"{save_path} holds checkpoints of another verifier ({recorded.get('path')}, "
                                  f"fingerprint {recorded.get('fingerprint')}; this one is {info.path}, "
                                  f"{info.fingerprint}): choose another --run-id, or pass --fresh to archive it")
    for epoch in epoch_dirs(save_path):
        ckpt = os.path.join(save_path, str(epoch))
        if os.path.exists(os.path.join(ckpt, "config.json")):
            check_against(ckpt, read_config(ckpt), info)


def mark_save_root(save_path: str, info: VerifierInfo) -> None:
    os.makedirs(save_path, exist_ok=True)
    write_json_atomic(os.path.join(save_path, VERIFIER_FILE), {"path": info.path, "fingerprint": info.fingerprint,
                                                              "architectures": info.architectures})


def recorded_fingerprint(ckpt: str) -> str | None:
    """The fingerprint the train stage recorded beside this checkpoint (in its save root), if any."""
    for root in (ckpt, os.path.dirname(os.path.realpath(ckpt))):
        try:
            with open(os.path.join(root, VERIFIER_FILE), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("fingerprint"), str):
            return data["fingerprint"]
    return None
