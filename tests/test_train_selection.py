"""The checkpoint a train run hands on is chosen by held-out acceptance (backend/train/selection.py), and
training stops once acceptance has not improved for `patience` epochs."""
from __future__ import annotations

import json
import os
from pathlib import Path

from backend.drafter import checkpoints as ck
from backend.train import selection as sel


def _entry(epoch: int, length: float, val_loss: float) -> sel.EpochAcceptance:
    return sel.EpochAcceptance(epoch=epoch, step=10 * (epoch + 1), mean_acceptance_length=length,
                               per_position=[length - 1.0], anchors=100, val_loss=val_loss)


# acceptance peaks at epoch 1 and falls while the validation loss keeps improving to the last epoch
TURNS_OVER = [(0, 2.10, 3.0), (1, 2.55, 2.5), (2, 2.41, 2.2), (3, 2.30, 2.0)]


def test_choose_takes_the_best_acceptance_and_counts_the_epochs_since():
    history = [_entry(*t) for t in TURNS_OVER]
    assert sel.choose(history, patience=0) == sel.Choice(epoch=1, stale=2, stop=False)
    assert sel.choose(history, patience=2).stop and not sel.choose(history, patience=3).stop
    assert sel.choose(history[:2], patience=1) == sel.Choice(epoch=1, stale=0, stop=False)
    # a tie, or a gain inside min_delta, keeps the earlier epoch
    assert sel.choose([_entry(0, 2.0, 1.0), _entry(1, 2.0, 0.9)], patience=1).epoch == 0
    assert sel.choose([_entry(0, 2.0, 1.0), _entry(1, 2.004, 0.9)], patience=0, min_delta=0.01).epoch == 0
    assert sel.choose([], patience=1) == sel.Choice(epoch=None, stale=0, stop=False)


def _save_root(tmp_path: Path) -> Path:
    """Epoch checkpoints 0..3 with speculators' checkpoint_best link on the lowest validation loss (3)."""
    save = tmp_path / "checkpoints"
    for epoch in range(4):
        (save / str(epoch)).mkdir(parents=True)
        (save / str(epoch) / "config.json").write_text("{}")
    os.symlink(save / "3", save / ck.BEST_LINK)
    return save


def test_acceptance_turning_over_before_loss_chooses_the_best_acceptance_checkpoint(tmp_path):
    save = _save_root(tmp_path)
    state = sel.SelectionState(patience=2)
    choices = [state.record(_entry(*t)) for t in TURNS_OVER[:3]]
    assert [c.stop for c in choices] == [False, False, False]
    sel.save_state(str(save), state)
    stop = state.record(_entry(*TURNS_OVER[3]))
    sel.save_state(str(save), state)
    assert stop.stop and stop.epoch == 1  # two epochs without a better acceptance: stop
    assert ck.best_checkpoint(str(save)) == os.path.realpath(save / "3")  # what loss alone would pick
    assert sel.chosen_checkpoint(str(save)) == str(save / "1")
    described = sel.describe(sel.read(str(save)), ck.loss_best_epoch(str(save)))
    assert described["epoch"] == 1 and described["loss_best_epoch"] == 3 and described["stopped_early"]
    assert "epoch 2 (checkpoint 1) had the best held-out mean acceptance length (2.550" in described["why"]
    assert "the last measured, epoch 4, reached 2.300" in described["why"]
    assert "lowest validation loss was at epoch 4" in described["why"] and "patience 2" in described["why"]


def test_the_history_survives_a_restart_and_a_missing_checkpoint_falls_back(tmp_path):
    save = _save_root(tmp_path)
    state = sel.SelectionState(patience=3)
    for t in TURNS_OVER[:2]:
        state.record(_entry(*t))
    sel.save_state(str(save), state)
    again = sel.load_state(str(save), patience=3)
    assert [r.epoch for r in again.history] == [0, 1] and again.choice().epoch == 1
    again.record(_entry(1, 2.6, 2.4))  # the epoch measured again after a kill -9 replaces its record
    assert [r.epoch for r in again.history] == [0, 1] and again.choice().epoch == 1
    (save / "1" / "config.json").unlink()  # e.g. speculators' --save-best removed it
    assert sel.chosen_checkpoint(str(save)) is None
    (save / sel.ACCEPTANCE_FILE).write_text("not json")
    assert sel.read(str(save)) is None and sel.chosen_checkpoint(str(save)) is None


def test_acceptance_events_reach_the_training_view():
    from console.telemetry.train_view import TrainSeries

    series = TrainSeries()
    for epoch, length, loss in TURNS_OVER[:3]:
        series.apply("progress", {"phase": "acceptance", "epoch": epoch, "step": 10 * epoch + 9,
                                  "mean_acceptance_length": length, "per_position": [0.9, 0.5, 0.2],
                                  "val_loss": loss, "chosen_epoch": 1 if epoch else 0, "stale_epochs": epoch - 1,
                                  "patience": 3, "stop": False})
    out = series.to_dict()
    assert [a[1] for a in out["acceptance"]] == [2.10, 2.55, 2.41]
    assert out["chosen_epoch"] == 1 and out["acceptance_patience"] == 3
    series.supersede(25)  # a restart from step 25 drops what it measures again
    assert [a[0] for a in series.to_dict()["acceptance"]] == [0, 1]
    json.dumps(out)


def test_the_training_pane_shows_acceptance_beside_the_loss():
    from console.snapshot import RunInfo
    from console.telemetry.progress import train_view
    from console.ui.panes.training import TrainHistory, training_markup

    series = {"loss": [[0, 3.0], [9, 2.0]], "val": [[9, 0, 2.5]], "step": 9, "epoch": 1,
              "acceptance": [[0, 2.10, 9], [1, 2.55, 19], [2, 2.41, 29], ["x", 1.0], [3, float("nan")]],
              "chosen_epoch": 1, "acceptance_patience": 3, "stale_epochs": 1}

    def text(s: dict) -> str:
        h = TrainHistory()
        h.load_series("t", train_view(RunInfo(run_id="t", stage="train", state="running", series=s)))
        return training_markup("t", "running", None, h).plain

    assert "accept   ep1 2.10  ep2 2.55*  ep3 2.41   chosen: epoch 2   no gain 1/3 epochs" in text(series)
    assert "accept" not in text({**series, "acceptance": []})
