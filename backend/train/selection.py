"""Which checkpoint a train run hands on: the one with the best held-out acceptance, not the lowest loss.

Acceptance (mean accepted length) is what decides the speed-up, and it can peak and fall while the
validation loss still improves. At the end of each epoch (each checkpoint `<save>/<epoch>/`) the trainer
measures verify's offline acceptance (backend/drafter/acceptance.py) on a fixed small subset of the
held-out rows: the first `samples` rows of the prepare run's held-out split (already a seeded sample),
the verifier's own argmax computed once, only the draft run again each epoch.

`<save>/acceptance.json` keeps every epoch's figure and the choice (written atomically after each
measurement, so a restart after kill -9 goes on with the same history). The chosen epoch is the one with
the highest mean accepted length (the earlier one on a tie); training stops early once `patience`
epochs in a row have not improved on it by more than `min_delta` (patience 0: never). speculators'
own `checkpoint_best` link (lowest validation loss) stays as speculators leaves it; the stage names the
chosen checkpoint in its summary (`outputs.checkpoint`), which verify and the drafter server take.

Without held-out hidden states (online training) nothing is measured and the choice is speculators'.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from backend.contract.runs import write_json_atomic

ACCEPTANCE_FILE = "acceptance.json"


@dataclass
class EpochAcceptance:
    epoch: int
    step: int
    mean_acceptance_length: float
    per_position: list[float]
    anchors: int
    val_loss: float | None = None


@dataclass
class Choice:
    epoch: int | None  # the chosen epoch (None: nothing measured)
    stale: int  # epochs since the chosen one that did not improve on it
    stop: bool  # patience exhausted


@dataclass
class SelectionSettings:
    samples: int
    k: int
    patience: int
    min_delta: float
    heldout_data: str
    heldout_hidden_states: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose(history: list[EpochAcceptance], patience: int, min_delta: float = 0.0) -> Choice:
    """The best epoch by mean accepted length and whether to stop (pure; `history` in any order)."""
    best: EpochAcceptance | None = None
    stale = 0
    for record in sorted(history, key=lambda r: r.epoch):
        if best is None or record.mean_acceptance_length > best.mean_acceptance_length + min_delta:
            best, stale = record, 0
        else:
            stale += 1
    return Choice(epoch=best.epoch if best else None, stale=stale,
                  stop=bool(best is not None and patience > 0 and stale >= patience))


@dataclass
class SelectionState:
    patience: int
    min_delta: float = 0.0
    history: list[EpochAcceptance] = field(default_factory=list)
    stopped_early: bool = False

    def record(self, entry: EpochAcceptance) -> Choice:
        self.history = [r for r in self.history if r.epoch != entry.epoch] + [entry]
        self.history.sort(key=lambda r: r.epoch)
        choice = self.choice()
        self.stopped_early = choice.stop
        return choice

    def choice(self) -> Choice:
        return choose(self.history, self.patience, self.min_delta)

    def to_dict(self) -> dict[str, Any]:
        choice = self.choice()
        return {"patience": self.patience, "min_delta": self.min_delta, "chosen_epoch": choice.epoch,
                "stale_epochs": choice.stale, "stopped_early": self.stopped_early,
                "history": [asdict(r) for r in self.history]}


def load_state(save_path: str, patience: int, min_delta: float = 0.0) -> SelectionState:
    state = SelectionState(patience=patience, min_delta=min_delta)
    data = read(save_path)
    for item in (data or {}).get("history", []):
        try:
            state.history.append(EpochAcceptance(**item))
        except TypeError:
            continue
    return state


def save_state(save_path: str, state: SelectionState) -> None:
    write_json_atomic(os.path.join(save_path, ACCEPTANCE_FILE), state.to_dict())


def read(save_path: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(save_path, ACCEPTANCE_FILE), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def chosen_checkpoint(save_path: str) -> str | None:
    """The epoch directory acceptance chose, when it was measured and that checkpoint exists."""
    data = read(save_path)
    epoch = data.get("chosen_epoch") if data else None
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        return None
    path = os.path.join(os.path.abspath(save_path), str(epoch))
    return path if os.path.exists(os.path.join(path, "config.json")) else None


def describe(data: dict[str, Any] | None, loss_best_epoch: int | None) -> dict[str, Any] | None:
    """The summary's `selection`: which epoch won and why, in words and figures."""
    if not data or not isinstance(data.get("chosen_epoch"), int):
        return None
    history = [h for h in data.get("history", []) if isinstance(h, dict)]
    won = next((h for h in history if h.get("epoch") == data["chosen_epoch"]), {})
    last = history[-1] if history else {}
    # people count epochs from 1; speculators' checkpoint directories from 0
    why = (f"epoch {_human(won.get('epoch'))} (checkpoint {won.get('epoch')}) had the best held-out mean "
           f"acceptance length ({won.get('mean_acceptance_length'):.3f}")
    if last and last.get("epoch") != won.get("epoch"):
        why += (f"; the last measured, epoch {_human(last.get('epoch'))}, reached "
                f"{last.get('mean_acceptance_length'):.3f}")
    why += ")"
    if loss_best_epoch is not None and loss_best_epoch != won.get("epoch"):
        why += f"; the lowest validation loss was at epoch {_human(loss_best_epoch)}"
    if data.get("stopped_early"):
        why += f"; stopped early: no improvement for {data.get('stale_epochs')} epochs (patience {data.get('patience')})"
    return {"by": "acceptance", "epoch": won.get("epoch"), "mean_acceptance_length": won.get("mean_acceptance_length"),
            "loss_best_epoch": loss_best_epoch, "stopped_early": bool(data.get("stopped_early")), "why": why,
            "history": [{"epoch": h.get("epoch"), "mean_acceptance_length": h.get("mean_acceptance_length"),
                         "val_loss": h.get("val_loss")} for h in history]}


def _human(epoch: Any) -> Any:
    return epoch + 1 if isinstance(epoch, int) and not isinstance(epoch, bool) else epoch


class Probe:
    """Measures a draft in training on the fixed held-out subset (rank 0; the model's own device)."""

    def __init__(self, settings: SelectionSettings, verifier: Any):
        self.s = settings
        self.info = verifier
        self._batches: list[tuple[dict[str, Any], Any, Any]] | None = None  # (batch, targets, supervised)

    def _prepare(self, model: Any) -> None:
        import torch

        from backend.drafter.acceptance import shifted
        from backend.drafter.draft import verifier_head
        from backend.drafter.samples import heldout_items

        device = next(model.parameters()).device
        head = verifier_head(model, self.info)
        weight = head.weight.to(device)
        self._batches = []
        with torch.no_grad():
            for sample in heldout_items(self.s.heldout_data, self.s.heldout_hidden_states, self.s.samples):
                batch = shifted(sample)
                if batch["input_ids"].shape[0] < self.s.k:
                    continue
                last = batch.pop("verifier_last_hidden_states").to(device)
                normed = head.norm(last.to(head.norm.weight.dtype)).float()
                targets = (normed @ weight.T).argmax(dim=-1).cpu()
                self._batches.append((batch, targets, batch["loss_mask"]))
        del weight

    def measure(self, model: Any) -> Any:
        """verify's Acceptance of `model` as it is now; the model goes back to training mode after."""
        import torch

        from backend.drafter.acceptance import Acceptance, chain_accepted, draft_proposals

        was_training = model.training
        model.eval()
        try:
            if self._batches is None:
                self._prepare(model)
            device = next(model.parameters()).device
            result = Acceptance(k=self.s.k)
            with torch.no_grad():
                for batch, targets, supervised in self._batches or []:
                    on_device = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
                    proposals = draft_proposals(model, on_device, self.s.k).cpu()
                    result.add(chain_accepted(proposals, targets, supervised))
            return result
        finally:
            model.train(was_training)
