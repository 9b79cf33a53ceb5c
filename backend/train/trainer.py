"""`HostTrainer`: speculators' EAGLE-3 Trainer with a clean stop, resumable checkpoints and events.

A subclass, not a patch: the worker constructs it where speculators' own `train` command constructs
`Trainer`. What it changes and why:

- Device: `local_rank` and the autocast device come from backend.train.adapters (the CPU when there is
  no accelerator; speculators would use `cuda:<rank>`). On a GPU host they are what speculators uses.
- Stop: speculators' SIGTERM handler raises from wherever the main thread is (mid optimizer step
  included) and saves to `<save>/interrupted/`, which its own resume never reads. Here SIGTERM/SIGINT
  only set a flag; the step callback (speculators' `train_epoch(step_callback=...)` hook) stops after the
  step in flight, agreed by all ranks, and saves a mid-epoch checkpoint in speculators' own resumable
  layout (`<save>/<epoch>/` + training_state.json with the local step), so starting the run again
  resumes at the next step and no step is trained (or reported) twice.
- Events: checkpoints saved, the best checkpoint, and where a restart resumes (`Reporter`).
- Selection: after each epoch whose checkpoint was saved, `selector(epoch, step, model, val_loss)` (rank
  0: backend/train/selection.py measures held-out acceptance) says whether to stop early; every rank
  agrees on its answer.
`run_training` is speculators' epoch loop (train, save, validate, update best) with these hooks.
"""
from __future__ import annotations

import logging
import os
import signal
from typing import Any, Callable, Protocol

import torch
import torch.distributed as dist
from speculators.train.trainer import Trainer

from backend.train.adapters import autocast_device_type, host_device

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
        self.stop_check = stop_check  # a stop asked for before training started (the stage's own handler)
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
    def request_stop(self, signum: int, _frame: Any = None) -> None:
        if not self.stop_requested:
            log.warning(f"received {signal.Signals(signum).name}: stopping after the step in flight and "
                        f"saving a resumable checkpoint")
        self.stop_requested = True

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
    def _save_resumable(self, epoch: int, local_step: int, kind: str) -> None:
        """speculators' checkpoint layout for `epoch` with its mid-epoch training state, always saved
        (speculators' maybe_save_checkpoint skips epochs outside checkpoint_freq)."""
        self.checkpointer.save_checkpoint(self.model, self.optimizers, epoch)
        if self.schedulers:
            self.checkpointer.save_scheduler_state_dict(self.schedulers, epoch)
        self._save_training_state(epoch, local_step)
        self._saved_at = self.global_step
        if self.reporter and self._is_main():
            self.reporter.checkpoint(str(self.checkpointer.path / str(epoch)), kind, epoch, self.global_step - 1)

    def maybe_save_checkpoint(self, epoch: int | str, local_step: int = 0) -> None:
        path = self.checkpointer.model_path(epoch)
        before = _mtime(path)
        super().maybe_save_checkpoint(epoch, local_step=local_step)
        if _mtime(path) != before:
            self._saved_at = self.global_step
            if self.reporter and self._is_main() and isinstance(epoch, int):
                self.reporter.checkpoint(str(path.parent), "mid_epoch" if local_step else "epoch", epoch,
                                         self.global_step - 1)

    def maybe_update_best(self, epoch: int, val_metrics: dict | None) -> None:
        before = self.best_val_loss
        super().maybe_update_best(epoch, val_metrics)
        if self.best_val_loss != before and self.reporter and self._is_main():
            self.reporter.best(str(self.checkpointer.path / str(epoch)), epoch, float(self.best_val_loss))

    def _select(self, epoch: int, val_metrics: dict | None) -> bool:
        """Measure the epoch's checkpoint (rank 0) and agree on whether to stop early."""
        stop = False
        if self.selector is not None and self._is_main():
            loss = val_metrics.get("loss_epoch") if isinstance(val_metrics, dict) else None
            model = getattr(self.model, "module", self.model)  # DDP wraps the draft
            stop = bool(self.selector(epoch, self.global_step, model, float(loss) if loss is not None else None))
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

    def run_training(self) -> None:
        handlers = {sig: signal.signal(sig, self.request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        n_epochs = self.config.num_epochs
        steps = len(self.train_loader)
        try:
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
            for sig, old in handlers.items():  # a second signal during the save is the operator insisting
                signal.signal(sig, old)
            if self._saved_at != self.global_step and self.global_step > 0:
                if self.local_step > 0:
                    self._save_resumable(self._epoch, self.local_step, "interrupt")
                else:  # stopped between epochs, the last one not saved (checkpoint_freq > 1)
                    self._save_resumable(self._epoch - 1, steps, "interrupt")
        finally:
            for sig, old in handlers.items():
                signal.signal(sig, old)


def _mtime(path: os.PathLike[str]) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
