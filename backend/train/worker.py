"""One training process: speculators' own `train` flow (speculators.train.cli.main) with HostTrainer.

`python -m backend.train.worker PLAN.json` is what torchrun starts on each rank; on the CPU or one GPU the
stage calls `train(plan)` in its own process. The flow is speculators' `main()` step for step (seed,
loggers, distributed setup, run.yaml, vocab mappings, draft model, data loaders, Trainer) with three
differences: HostTrainer instead of Trainer (backend/train/trainer.py), the adapters of
backend/drafter/adapters.py around it, and rank 0 writing events (metrics through MetricsHandler).
"""
from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
from typing import Any, Callable

from backend.contract.events import EventLog
from backend.train.launch import die_with_parent
from backend.train.plan import TrainPlan, write_status

STAGE = "train"


class EventsReporter:
    """HostTrainer's Reporter and the metrics handler's sink: rank 0's events."""

    def __init__(self, log: EventLog):
        from backend.train.metrics import MetricsHandler

        self.log = log
        self.handler = MetricsHandler(self.emit)
        self.total = 0

    def emit(self, kind: str, **data: Any) -> None:
        try:
            self.log.emit(kind, **data)
        except OSError as exc:  # a full disk must not take training down; the checkpoint says more
            print(f"train: could not write the {kind} event: {exc}", file=sys.stderr)

    def plan(self, total_steps: int, steps_per_epoch: int, epochs: int) -> None:
        self.total = total_steps
        self.handler.set_plan(total_steps, steps_per_epoch)
        self.emit("progress", phase="plan", total=total_steps, steps_per_epoch=steps_per_epoch, epochs=epochs)

    def resumed(self, step: int, epoch: int, local_step: int, checkpoint: str) -> None:
        # every progress event of a step >= `step` written before this one is superseded (a kill -9
        # after the checkpoint leaves steps that are trained again): see backend/contract/events.py
        self.emit("resume", step=step, epoch=epoch, local_step=local_step, checkpoint=checkpoint, fsync=True)

    def checkpoint(self, path: str, kind: str, epoch: int, step: int) -> None:
        self.emit("progress", phase="checkpoint", checkpoint=path, checkpoint_kind=kind, epoch=epoch, step=step,
                  done=step + 1, total=self.total, fsync=True)

    def best(self, path: str, epoch: int, val_loss: float) -> None:
        self.emit("progress", phase="best", best_checkpoint=path, epoch=epoch, best_val_loss=val_loss,
                  total=self.total, fsync=True)

    def acceptance(self, entry: Any, choice: Any, patience: int) -> None:
        self.emit("progress", phase="acceptance", epoch=entry.epoch, step=entry.step - 1,
                  mean_acceptance_length=entry.mean_acceptance_length, per_position=entry.per_position,
                  anchors=entry.anchors, val_loss=entry.val_loss, chosen_epoch=choice.epoch,
                  stale_epochs=choice.stale, patience=patience, stop=choice.stop, total=self.total, fsync=True)


class Selector:
    """The trainer's selector (rank 0): measure, record in <save>/acceptance.json, report, say stop."""

    def __init__(self, settings: dict[str, Any], info: Any, save_path: str, reporter: EventsReporter | None):
        from backend.train import selection

        self.settings = selection.SelectionSettings(**settings)
        self.save_path = save_path
        self.reporter = reporter
        self.probe = selection.Probe(self.settings, info)
        self.state = selection.load_state(save_path, self.settings.patience, self.settings.min_delta)

    def __call__(self, epoch: int, step: int, model: Any, val_loss: float | None) -> bool:
        from backend.train import selection

        acc = self.probe.measure(model)
        entry = selection.EpochAcceptance(epoch=epoch, step=step, anchors=acc.anchors,
                                          mean_acceptance_length=round(acc.mean_acceptance_length, 4),
                                          per_position=[round(p, 4) for p in acc.per_position], val_loss=val_loss)
        choice = self.state.record(entry)
        selection.save_state(self.save_path, self.state)
        if self.reporter:
            self.reporter.acceptance(entry, choice, self.settings.patience)
        print(f"train: epoch {epoch + 1}: held-out mean acceptance length {entry.mean_acceptance_length:.3f} "
              f"(best: epoch {choice.epoch + 1 if choice.epoch is not None else '-'})", file=sys.stderr)
        return choice.stop

    def catch_up(self, epoch: int, step: int, model: Any, val_loss: float | None) -> bool:
        """On a restart from `epoch`'s end: measure it unless it was (a kill came between save and measure)."""
        if any(r.epoch == epoch for r in self.state.history):
            return self.state.choice().stop
        return self(epoch, step, model, val_loss)


def trainer_config(args: argparse.Namespace, train_kwargs: dict, val_kwargs: dict, dtype: Any) -> Any:
    """speculators' TrainerConfig from the resolved flags, as speculators.train.cli.main builds it
    (fields with the flag's name are taken by name, so a new field with a default needs no change)."""
    from speculators.train.trainer import TrainerConfig

    renamed = {"num_epochs": args.epochs, "resume_from_checkpoint": not args.no_resume_from_checkpoint,
               "train_call_kwargs": train_kwargs, "val_call_kwargs": val_kwargs, "hidden_states_dtype": dtype}
    values = {name: renamed[name] if name in renamed else getattr(args, name)
              for name in TrainerConfig._fields if name in renamed or hasattr(args, name)}
    return TrainerConfig(**values)


def train(plan: TrainPlan, stop_check: Callable[[], bool] | None = None) -> str:
    """Train as planned; returns "completed" or "stopped" (raises on failure)."""
    import torch
    from hs_connectors import HiddenStatesBackend
    from speculators.model import SpeculatorModel
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.cli import build_draft_model, parse_vocab_mappings, set_seed
    from speculators.train.config import TrainConfig
    from speculators.train.dataloader import create_train_val_loaders
    from speculators.train.distributed import get_rank, maybe_destroy_distributed, maybe_setup_distributed
    from speculators.train.logger import setup_metric_logger, setup_root_logger

    from backend.drafter import adapters
    from backend.drafter.verifier import inspect_verifier
    from backend.train import metrics
    from backend.train.trainer import HostTrainer

    try:
        cfg = TrainConfig.resolve(plan.argv)
    except SystemExit as exc:  # speculators' resolver reports through argparse
        raise RuntimeError(f"speculators refused the training settings (exit {exc.code}); "
                           f"see the lines above") from None
    args = argparse.Namespace(**cfg.flatten())
    set_seed(args.seed, args.deterministic_cuda)
    setup_root_logger()
    setup_metric_logger(loggers=args.logger, run_name=args.run_name, output_dir=args.log_dir)
    maybe_setup_distributed()
    rank = get_rank()
    log = EventLog(plan.events_path, STAGE, plan.run_id) if rank == 0 else None
    reporter = EventsReporter(log) if log else None
    if reporter:
        metrics.attach(reporter.handler)
    info = inspect_verifier(plan.verifier)
    try:
        if rank == 0:
            cfg.save(args.save_path)
        dtype = getattr(torch, args.hidden_states_dtype)
        with adapters.verifier_adapters(info), adapters.no_accelerator() as applied:
            if applied and rank == 0:
                print(f"train: no accelerator: {', '.join(applied)} (backend/drafter/adapters.py)", file=sys.stderr)
            d2t, t2d, draft_vocab_size = parse_vocab_mappings(args)
            model_class = SpeculatorModel.registry["eagle3"]
            draft = build_draft_model(args, model_class, t2d, d2t, draft_vocab_size)
            if dtype == torch.float32:  # computed without autocast: a warm start's bfloat16 weights are cast once
                draft.float()
            hidden_size = draft.config.transformer_layer_config.hidden_size
            transfer = HiddenStatesBackend.registry[args.hidden_states_backend].from_train_args(args, args.data_path)
            train_loader, val_loader = create_train_val_loaders(
                data_path=args.data_path, total_seq_len=args.total_seq_len, hidden_states_dtype=dtype,
                transfer=transfer, vllm_endpoint=args.vllm_endpoint, on_missing=args.on_missing,
                # speculators compares this with the id the extraction server serves (online only)
                verifier_name_or_path=plan.served_model or args.verifier_name_or_path,
                request_timeout=args.request_timeout,
                max_retries=args.max_retries, generation_validation_retries=args.generation_validation_retries,
                max_consecutive_generation_failures=args.max_consecutive_generation_failures,
                hidden_size=hidden_size, num_target_layers=len(draft.target_layer_ids),
                num_workers=args.num_workers, prefetch_factor=args.prefetch_factor, preprocess=shift_batch,
                train_data_ratio=args.train_data_ratio, seed=args.seed)
            train_kwargs, val_kwargs = model_class.get_trainer_kwargs(**vars(args))
            selector = (Selector(plan.selection, info, args.save_path, reporter)
                        if plan.selection and rank == 0 else None)
            trainer = HostTrainer(draft, trainer_config(args, train_kwargs, val_kwargs, dtype), train_loader,
                                  val_loader, reporter=reporter, stop_check=stop_check, selector=selector)
            trainer.run_training()
            status = "stopped" if trainer.stopped else "completed"
            if rank == 0:
                write_status(plan.run_dir, status, global_step=trainer.global_step,
                             stopped_early=trainer.stopped_early)
        del trainer, draft
        gc.collect()
        return status
    finally:
        if reporter:
            import logging
            logging.getLogger(metrics.METRICS_LOGGER).removeHandler(reporter.handler)
        if log:
            log.close()
        maybe_destroy_distributed()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m backend.train.worker PLAN.json", file=sys.stderr)
        return 2
    plan = TrainPlan.load(argv[0])
    stop: list[int] = []  # SIGTERM/SIGINT (torchrun forwards them): the trainer stops after the step in flight and saves

    def stop_asked(signum: int, _frame: Any) -> None:
        if not stop:
            print(f"train: received {signal.Signals(signum).name}: stopping after the step in flight and saving "
                  f"a resumable checkpoint", file=sys.stderr, flush=True)
        stop.append(signum)

    # this rank's one handler (a separate process: no lifecycle here); the trainer installs none
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop_asked)
    die_with_parent()  # torchrun gone (killed -9): this rank stops as on SIGTERM, never trains on alone
    status = train(plan, stop_check=lambda: bool(stop))
    return 0 if status in ("completed", "stopped") else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
