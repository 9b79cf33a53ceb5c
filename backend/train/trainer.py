"""`HostTrainer`: speculators' EAGLE-3 Trainer with a clean stop, resumable checkpoints and events.

A subclass, not a patch: the worker constructs it where speculators' own `train` command constructs
`Trainer`. What it changes and why:

- Device: `local_rank` and the autocast device come from backend.drafter.adapters (the CPU when there is
  no accelerator; speculators would use `cuda:<rank>`). On a GPU host they are what speculators uses.
- Stop: speculators' SIGTERM handler raises from wherever the main thread is (mid optimizer step
  included) and saves to `<save>/interrupted/`, which its own resume never reads. Here the trainer
  installs no signal handler: the process's one handler (the stage's lifecycle in-process, the torchrun
  worker's main on a rank) sets what `stop_check` reads; the step callback (speculators' `train_epoch(step_callback=...)` hook) stops after the
  step in flight, agreed by all ranks, and saves a mid-epoch checkpoint in speculators' own resumable
  layout (`<save>/<epoch>/` + training_state.json with the local step), so starting the run again
  resumes at the next step and no step is trained (or reported) twice.
- Saves: every checkpoint is written beside its epoch directory and committed by rename
  (backend/drafter/checkpoints.py), because speculators overwrites `<save>/<epoch>/` in place and a kill -9
  mid-save would tear the only copy.
- Events: checkpoints saved, the best checkpoint, and where a restart resumes (`Reporter`).
- Selection: after each epoch whose checkpoint was saved, `selector(epoch, step, model, val_loss)` (rank
  0: backend/train/selection.py measures held-out acceptance) says whether to stop early; every rank
  agrees on its answer. A restart at an epoch boundary first measures the epoch saved last if a kill
  came between its save and its measurement, so every saved epoch is in the choice.
`run_training` is speculators' epoch loop (train, save, validate, update best) with these hooks.
"""
from __future__ import annotations

import json
import logging
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import torch
import torch.distributed as dist
from speculators.train.trainer import Trainer

from backend.drafter import checkpoints as ck
from backend.drafter.adapters import autocast_device_type, host_device

log = logging.getLogger("speculators")


class Reporter(Protocol):
    def plan(self, total_steps: int, steps_per_epoch: int, epochs: int) -> None: ...
    def resumed(self, step: int, epoch: int, local_step: int, checkpoint: str) -> None: ...
    def checkpoint(self, path: str, kind: str, epoch: int, step: int) -> None: ...
    def best(self, path: str, epoch: int, val_loss: float) -> None: ...


class TrainingStopped(Exception):
    """Raised from the step callback once a stop was asked for and the step in flight is done."""


class HostTrainer(Trainer):
    def __init__(self, *args: Any, reporter: Reporter | None = None,
                 stop_check: Callable[[], bool] | None = None,
                 selector: Callable[[int, int, Any, float | None], bool] | None = None, **kwargs: Any):
        self.reporter = reporter
        self.stop_check = stop_check  # a stop asked for (the process's one SIGTERM/SIGINT handler sets it)
        self.stop_requested = False
        self.stopped = False
        self.selector = selector
        self.stopped_early = False
        self._epoch = 0
        self._epoch_base = 0  # the epoch's local step the current train_epoch call starts at
        self._epoch_start_step = 0
        self._saved_at: int | None = None  # global step of the newest checkpoint on disk
        super().__init__(*args, **kwargs)

    # -- device (speculators: `.to(local_rank)` and autocast "cuda") --
    def setup_trainer(self) -> None:
        self.local_rank = host_device(self.local_rank)  # type: ignore[assignment]
        self.device_type = autocast_device_type()
        super().setup_trainer()
        if self.checkpointer.previous_epoch != -1 and self.resume_from_checkpoint:
            self._saved_at = self.global_step
            if self.reporter and self._is_main():
                self.reporter.resumed(self.global_step, self.current_epoch,
                                      getattr(self, "_resume_local_step", 0), str(self.checkpointer.prev_path))

    # -- stop --
    def _stop_agreed(self) -> bool:
        if self.stop_check is not None and self.stop_check():
            self.stop_requested = True
        if not self.is_distributed:
            return self.stop_requested
        # one tiny all-reduce per step: every rank must stop after the same step, or DDP deadlocks
        flag = torch.tensor([1.0 if self.stop_requested else 0.0], device=self.local_rank)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _after_step(self) -> None:
        if self._stop_agreed():
            raise TrainingStopped()

    def _is_main(self) -> bool:
        return not self.is_distributed or dist.get_rank() == 0

    @property
    def local_step(self) -> int:
        return self._epoch_base + (self.global_step - self._epoch_start_step)

    # -- checkpoints --
    @contextmanager
    def _staged(self) -> Iterator[Path]:
        """speculators' checkpointer writes under `<save>/.saving/` while this is open; yields `<save>`."""
        root = self.checkpointer.path
        self.checkpointer.path = root / ck.STAGING_DIR
        try:
            yield root
        finally:
            self.checkpointer.path = root

    def _commit(self, root: Path, epoch: int, local_step: int) -> bool:
        """Put the staged save in place (rank 0) and name it as speculators does (`epoch0_step5 -> 0`);
        every rank learns whether there was a save to commit."""
        saved = False
        if self._is_main():
            staged = Path(ck.staged_dir(str(root), epoch))
            saved = staged.is_dir()
            if saved:
                command = root / self.checkpointer.TRAIN_COMMAND_FILENAME
                if command.exists():
                    shutil.copy2(command, staged / command.name)
                for link in (root / ck.STAGING_DIR).glob(f"epoch{epoch}_*"):
                    link.unlink()
                ck.commit_staged(str(root), epoch)
                for old in root.glob(f"epoch{epoch}_*"):
                    if old.is_symlink():
                        old.unlink()
                (root / f"epoch{epoch}_{f'step{local_step}' if local_step > 0 else 'end'}").symlink_to(str(epoch))
        if self.is_distributed:
            flag = torch.tensor([1.0 if saved else 0.0], device=self.local_rank)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            saved = bool(flag.item())
        return saved

    def _save_resumable(self, epoch: int, local_step: int, kind: str) -> None:
        """speculators' checkpoint layout for `epoch` with its mid-epoch training state, always saved
        (speculators' maybe_save_checkpoint skips epochs outside checkpoint_freq)."""
        with self._staged() as root:
            self.checkpointer.save_checkpoint(self.model, self.optimizers, epoch)
            if self.schedulers:
                self.checkpointer.save_scheduler_state_dict(self.schedulers, epoch)
            self._save_training_state(epoch, local_step)
        self._commit(root, epoch, local_step)
        self._saved_at = self.global_step
        if self.reporter and self._is_main():
            self.reporter.checkpoint(str(root / str(epoch)), kind, epoch, self.global_step - 1)

    def maybe_save_checkpoint(self, epoch: int | str, local_step: int = 0) -> None:
        if not isinstance(epoch, int):  # speculators' own "interrupted" save: never taken here (request_stop)
            return super().maybe_save_checkpoint(epoch, local_step=local_step)
        with self._staged() as root:
            super().maybe_save_checkpoint(epoch, local_step=local_step)
        if self._commit(root, epoch, local_step):
            self._saved_at = self.global_step
            if self.reporter and self._is_main():
                self.reporter.checkpoint(str(root / str(epoch)), "mid_epoch" if local_step else "epoch", epoch,
                                         self.global_step - 1)

    def maybe_update_best(self, epoch: int, val_metrics: dict | None) -> None:
        before = self.best_val_loss
        super().maybe_update_best(epoch, val_metrics)
        if self.best_val_loss != before and self.reporter and self._is_main():
            self.reporter.best(str(self.checkpointer.path / str(epoch)), epoch, float(self.best_val_loss))

    def _select(self, epoch: int, val_metrics: dict | None, catch_up: bool = False) -> bool:
        """Measure the epoch's checkpoint (rank 0) and agree on whether to stop early. `catch_up`: the
        model was just loaded from that checkpoint, and is measured only if it never was."""
        stop = False
        if self.selector is not None and self._is_main():
            loss = val_metrics.get("loss_epoch") if isinstance(val_metrics, dict) else None
            model = getattr(self.model, "module", self.model)  # DDP wraps the draft
            measure = getattr(self.selector, "catch_up", self.selector) if catch_up else self.selector
            stop = bool(measure(epoch, self.global_step, model, float(loss) if loss is not None else None))
        if self.is_distributed:
            flag = torch.tensor([1.0 if stop else 0.0], device=self.local_rank)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        return stop

    # -- the epoch loop --
    def _plan(self, epoch: int, n_epochs: int) -> int:
        """Steps in this epoch (the packing sampler's count varies by epoch) and the run's total so far."""
        sampler = self.train_loader.batch_sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # train_epoch sets it again; the count is then this epoch's
        steps = len(self.train_loader)
        total = self._epoch_start_step - self._epoch_base + steps * (n_epochs - epoch)
        if self.config.max_steps is not None:
            total = min(total, self.config.max_steps)
        if self.reporter and self._is_main():
            self.reporter.plan(total, steps, n_epochs)
        return steps

    def _resumed_at_epoch_end(self) -> int | None:
        """The epoch whose end-of-epoch checkpoint this run resumed from, if it did."""
        prev = self.checkpointer.previous_epoch
        if prev == -1 or not self.resume_from_checkpoint or getattr(self, "_resume_local_step", 0):
            return None
        return prev if self.current_epoch == prev + 1 else None

    def _saved_val_metrics(self, epoch: int) -> dict | None:
        try:
            data = json.loads(self.checkpointer.val_metrics_path(epoch).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def run_training(self) -> None:
        n_epochs = self.config.num_epochs
        steps = len(self.train_loader)
        try:
            last = self._resumed_at_epoch_end()
            if last is not None and self._select(last, self._saved_val_metrics(last), catch_up=True):
                self.stopped_early = True
                log.info(f"stopping early after epoch {last + 1}: held-out acceptance has not improved")
                return
            for epoch in range(self.current_epoch, n_epochs):
                self._epoch = epoch
                self._epoch_base = getattr(self, "_resume_local_step", 0) if epoch == self.current_epoch else 0
                self._epoch_start_step = self.global_step
                steps = self._plan(epoch, n_epochs)
                if self._stop_agreed():
                    raise TrainingStopped()
                log.info(f"Training epoch {epoch + 1}/{n_epochs} started")
                self.train_epoch(epoch, step_callback=self._after_step)
                if self.is_distributed:
                    dist.barrier()
                self.maybe_save_checkpoint(epoch)
                saved = self._saved_at == self.global_step
                if self.is_distributed:
                    dist.barrier()
                val_metrics = self.val_epoch(epoch) if self.val_loader is not None else None
                if self.is_distributed:
                    dist.barrier()
                self.maybe_update_best(epoch, val_metrics)
                if self.is_distributed:
                    dist.barrier()
                if saved and self._select(epoch, val_metrics):
                    self.stopped_early = True
                    log.info(f"stopping early after epoch {epoch + 1}: held-out acceptance has not improved")
                    break
                if self.config.max_steps is not None and self.global_step >= self.config.max_steps:
                    break
        except TrainingStopped:
            self.stopped = True
            if self._saved_at != self.global_step and self.global_step > 0:
                if self.local_step > 0:
                    self._save_resumable(self._epoch, self.local_step, "interrupt")
                else:  # stopped between epochs, the last one not saved (checkpoint_freq > 1)
                    self._save_resumable(self._epoch - 1, steps, "interrupt")

