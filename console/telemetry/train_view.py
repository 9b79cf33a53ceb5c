"""A training run's curves as the console keeps them: built from every event of its events.jsonl.

The console reads events incrementally, and a snapshot carries only the latest one, so the loss curve,
validation per epoch and the checkpoints are accumulated here, per run (RunTrack owns one), and handed
to the training pane as `RunInfo.series` (`TrainSeries.to_dict()`).

Resume (backend/contract/events.py): a `resume` event with a `step` supersedes every progress event of a step
>= that step written before it; those points are dropped here, so a step trained again after a kill -9
is never counted twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backend.contract.numbers import finite

MAX_POINTS = 4000  # train-loss points kept; beyond that every other one is dropped (the curve's shape stays)
MAX_SENT = 400  # points handed to a snapshot


def _num(value: Any) -> float | None:
    return finite(value)


def _floats(value: Any) -> list[float | None] | None:
    return [_num(v) for v in value] if isinstance(value, list) else None


@dataclass
class TrainSeries:
    loss: list[tuple[int, float]] = field(default_factory=list)  # (step, train loss)
    val: list[tuple[int, int | None, float]] = field(default_factory=list)  # (step, epoch, val loss)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # {path, kind, epoch, step}
    best: dict[str, Any] | None = None  # {path, val_loss, epoch}
    acc_k: list[float | None] | None = None
    val_acc_k: list[float | None] | None = None
    epoch: int | None = None
    step: int | None = None
    steps_per_epoch: int | None = None
    epochs: int | None = None
    total: int | None = None
    lr: float | None = None
    rate: float | None = None
    eta_s: float | None = None
    resumed_from: int | None = None
    # held-out acceptance per saved epoch (backend/train/selection.py): (epoch, mean acceptance length, step)
    acceptance: list[tuple[int, float, int | None]] = field(default_factory=list)
    chosen_epoch: int | None = None  # the epoch whose checkpoint is handed on (best acceptance)
    acceptance_patience: int | None = None
    stale_epochs: int | None = None
    _stride: int = 1  # keep one loss point in `_stride` once decimated

    def apply(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "resume" and isinstance(data.get("step"), int):
            self.supersede(int(data["step"]))
            return
        if kind != "progress":
            return
        phase = data.get("phase")
        step = data.get("step") if isinstance(data.get("step"), int) else None
        if isinstance(data.get("total"), int) and data["total"] > 0:
            self.total = data["total"]
        if phase == "plan":
            per_epoch = data.get("steps_per_epoch")
            self.steps_per_epoch = per_epoch if isinstance(per_epoch, int) else None
            self.epochs = data.get("epochs") if isinstance(data.get("epochs"), int) else self.epochs
        elif phase == "val":
            loss = _num(data.get("val_loss"))
            if loss is not None and step is not None:
                self.val.append((step, data.get("epoch") if isinstance(data.get("epoch"), int) else None, loss))
            self.val_acc_k = _floats(data.get("val_acc_k")) or self.val_acc_k
        elif phase == "checkpoint" and isinstance(data.get("checkpoint"), str):
            self.checkpoints.append({"path": data["checkpoint"], "kind": data.get("checkpoint_kind"),
                                     "epoch": data.get("epoch"), "step": step})
        elif phase == "acceptance":
            self._apply_acceptance(data, step)
        elif phase == "best" and isinstance(data.get("best_checkpoint"), str):
            self.best = {"path": data["best_checkpoint"], "val_loss": _num(data.get("best_val_loss")),
                         "epoch": data.get("epoch")}
        elif step is not None:  # a train step (phase "train", or an older writer without phases)
            loss = _num(data.get("loss"))
            if loss is not None and (not self.loss or step > self.loss[-1][0]) and step % self._stride == 0:
                self.loss.append((step, loss))
                if len(self.loss) > MAX_POINTS:
                    self._stride *= 2
                    self.loss = [p for p in self.loss if p[0] % self._stride == 0]
            self.step = step
            self.epoch = data.get("epoch") if isinstance(data.get("epoch"), int) else self.epoch
            self.acc_k = _floats(data.get("acc_k")) or self.acc_k
            self.lr = _num(data.get("lr"))
            self.rate = _num(data.get("rate"))
            self.eta_s = _num(data.get("eta_s"))

    def _apply_acceptance(self, data: dict[str, Any], step: int | None) -> None:
        epoch, length = data.get("epoch"), _num(data.get("mean_acceptance_length"))
        if not isinstance(epoch, int) or isinstance(epoch, bool) or length is None:
            return
        self.acceptance = [a for a in self.acceptance if a[0] != epoch] + [(epoch, length, step)]
        chosen = data.get("chosen_epoch")
        self.chosen_epoch = chosen if isinstance(chosen, int) and not isinstance(chosen, bool) else self.chosen_epoch
        for name in ("patience", "stale_epochs"):
            value = data.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(self, "acceptance_patience" if name == "patience" else name, value)

    def supersede(self, step: int) -> None:
        """Drop what a restart from `step` trains again."""
        self.loss = [p for p in self.loss if p[0] < step]
        self.val = [v for v in self.val if v[0] < step]
        self.checkpoints = [c for c in self.checkpoints if not isinstance(c.get("step"), int) or c["step"] < step]
        self.acceptance = [a for a in self.acceptance if a[2] is None or a[2] < step]
        self.step = step - 1 if step > 0 else None
        self.resumed_from = step

    def to_dict(self) -> dict[str, Any]:
        stride = max(1, -(-len(self.loss) // MAX_SENT))
        points = self.loss[::stride]
        if self.loss and points[-1] != self.loss[-1]:
            points.append(self.loss[-1])
        return {"loss": [list(p) for p in points], "val": [list(v) for v in self.val],
                "last_checkpoint": self.checkpoints[-1] if self.checkpoints else None, "best": self.best,
                "acc_k": self.acc_k, "val_acc_k": self.val_acc_k, "epoch": self.epoch, "step": self.step,
                "steps_per_epoch": self.steps_per_epoch, "epochs": self.epochs, "total": self.total, "lr": self.lr, "rate": self.rate,
                "eta_s": self.eta_s, "resumed_from": self.resumed_from,
                "acceptance": [list(a) for a in self.acceptance[-MAX_SENT:]], "chosen_epoch": self.chosen_epoch,
                "acceptance_patience": self.acceptance_patience, "stale_epochs": self.stale_epochs}
