"""A kill -9 at any instant of a checkpoint save leaves a resumable save root, and a restart at an epoch
boundary measures the epoch a kill left unmeasured (backend/drafter/checkpoints.py, backend/train/trainer.py).

speculators writes `<save>/<epoch>/` in place; these are the states a kill can leave between the stage's
staged write and its two-rename commit, made on disk directly so each instant is tested, not hoped for."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from backend.drafter import checkpoints as ck


def _ckpt(path: Path, tag: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"tag": tag}))
    (path / "model.safetensors").write_bytes(b"weights-" + tag.encode())
    return path


def _tag(path: Path) -> str:
    return json.loads((path / "config.json").read_text())["tag"]


def test_a_commit_replaces_the_epoch_and_leaves_nothing_beside_it(tmp_path):
    _ckpt(tmp_path / "0", "old")
    _ckpt(Path(ck.staged_dir(str(tmp_path), 0)), "new")
    assert ck.commit_staged(str(tmp_path), 0) == str(tmp_path / "0")
    assert _tag(tmp_path / "0") == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0"]
    assert ck.epoch_dirs(str(tmp_path)) == [0]


def test_a_kill_while_the_save_is_written_keeps_the_previous_checkpoint(tmp_path):
    _ckpt(tmp_path / "0", "old")
    torn = Path(ck.staged_dir(str(tmp_path), 0))
    torn.mkdir(parents=True)
    (torn / "config.json").write_text('{"tag": "ne')  # cut off mid-write
    assert ck.epoch_dirs(str(tmp_path)) == [0]  # speculators' resume never looks at the staging dir
    said = ck.recover_interrupted_save(str(tmp_path))
    assert said == [f"dropped a save cut off while it was written (0 in {ck.STAGING_DIR}/)"]
    assert _tag(tmp_path / "0") == "old" and not (tmp_path / ck.STAGING_DIR).exists()


def test_a_kill_between_the_two_renames_puts_the_previous_checkpoint_back(tmp_path):
    _ckpt(tmp_path / f"{ck.REPLACED_PREFIX}1", "old")
    _ckpt(Path(ck.staged_dir(str(tmp_path), 1)), "new")
    _ckpt(tmp_path / "0", "epoch0")
    said = ck.recover_interrupted_save(str(tmp_path))
    assert said[0].startswith("checkpoint 1: the save that was replacing it was cut off")
    assert _tag(tmp_path / "1") == "old" and _tag(tmp_path / "0") == "epoch0"
    assert ck.epoch_dirs(str(tmp_path)) == [0, 1]


def test_a_kill_after_the_new_checkpoint_landed_keeps_the_new_one(tmp_path):
    _ckpt(tmp_path / f"{ck.REPLACED_PREFIX}0", "old")
    _ckpt(tmp_path / "0", "new")
    assert ck.recover_interrupted_save(str(tmp_path)) == []
    assert _tag(tmp_path / "0") == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["0"]


def test_recovery_of_a_clean_or_missing_save_root_does_nothing(tmp_path):
    assert ck.recover_interrupted_save(str(tmp_path / "absent")) == []
    _ckpt(tmp_path / "0", "a")
    (tmp_path / ".replaced-x").mkdir()  # not one of ours: left alone
    assert ck.recover_interrupted_save(str(tmp_path)) == []
    assert (tmp_path / ".replaced-x").is_dir()


# ---- the trainer's catch-up measurement (speculators' Trainer: the `torch` fixture) --------------------

class _Selector:
    """Records what was measured; `measured` epochs are already in acceptance.json."""

    def __init__(self, measured: set[int], stop: bool = False):
        self.measured, self.stop, self.calls = measured, stop, []

    def __call__(self, epoch, step, model, val_loss):
        self.calls.append((epoch, step, val_loss))
        return self.stop

    def catch_up(self, epoch, step, model, val_loss):
        return self.stop if epoch in self.measured else self(epoch, step, model, val_loss)


def _resumed_trainer(tmp_path: Path, selector: _Selector, local_step: int = 0, epochs: int = 2):
    """A HostTrainer as setup_trainer leaves it after resuming from epoch 1's checkpoint, with the
    epoch loop already done (so run_training only does what happens before it)."""
    from backend.train.trainer import HostTrainer

    t = HostTrainer.__new__(HostTrainer)
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "val_metrics.json").write_text(json.dumps({"loss_epoch": 0.5}))
    t.checkpointer = SimpleNamespace(previous_epoch=1, path=tmp_path,
                                     val_metrics_path=lambda e: tmp_path / str(e) / "val_metrics.json")
    t.resume_from_checkpoint, t._resume_local_step = True, local_step
    t.current_epoch = 1 if local_step else 2
    t.config = SimpleNamespace(num_epochs=epochs, max_steps=None)
    t.train_loader, t.model, t.global_step, t.is_distributed = [0] * 4, object(), 8, False
    t.selector, t.reporter, t.stop_check = selector, None, None
    t.stop_requested = t.stopped = t.stopped_early = False
    t._saved_at, t._epoch = 8, 1
    return t


@pytest.mark.usefixtures("torch")
def test_a_restart_at_an_epoch_end_measures_the_epoch_a_kill_left_unmeasured(tmp_path):
    sel = _Selector(measured={0})
    _resumed_trainer(tmp_path, sel).run_training()
    assert sel.calls == [(1, 8, 0.5)]  # epoch 1 saved, its val loss on disk, never measured


@pytest.mark.usefixtures("torch")
def test_a_measured_epoch_is_not_measured_again_and_its_stop_holds(tmp_path):
    sel = _Selector(measured={0, 1}, stop=True)
    t = _resumed_trainer(tmp_path, sel, epochs=4)
    t.run_training()
    assert sel.calls == [] and t.stopped_early  # patience ran out before the kill: no epoch more


@pytest.mark.usefixtures("torch")
def test_a_mid_epoch_restart_measures_nothing_before_training(tmp_path):
    from backend.train.trainer import HostTrainer

    sel = _Selector(measured=set())
    t = _resumed_trainer(tmp_path, sel, local_step=3)
    assert HostTrainer._resumed_at_epoch_end(t) is None
