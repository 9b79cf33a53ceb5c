"""Training overhead of the train stage's own parts against stock speculators, side by side in one run.

Both sides train the same draft (same seed, same initial weights) on the same prepared data and hidden
states (the tiny verifier, built locally) for the same steps, alternating stock / ours for `--rounds`
pairs; the figure is the median over rounds of each pair's ratio of `run_training()` CPU time (process
time: on a shared machine wall time mostly measures the neighbours), with the wall-time ratio beside it.

- stock: speculators' own `Trainer`, untouched on a GPU host. On a machine without an accelerator stock
  speculators cannot train at all, so there the stock side gets only the device handling that makes it run
  (backend/drafter/adapters.py's `no_accelerator()` plus `.to("cpu")`/CPU autocast): the figure then measures
  our metrics capture and stop/plan hooks, and the device handling is the same on both sides.
- ours: `HostTrainer` with the MetricsHandler on `speculators.metrics` writing events.jsonl, the step
  callback, the per-epoch plan and the checkpoint/best events.

Also printed: the handler's own cost per metrics record, as a share of the median step. Target: <= 2 %.

    python3 benchmarks/bench_train_overhead.py [--steps 24] [--rounds 4]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from harness import train_support as ts  # noqa: E402


def speculators_args(data: ts.Dataset, save: Path, steps: int) -> list[str]:
    from backend.train.config import TrainStageConfig
    from backend.train.plan import speculators_argv

    c = TrainStageConfig(verifier=str(data.verifier), epochs=1, seq_length=512, lr=3e-3, optimizer="adamw",
                         max_steps=steps, checkpoint_freq=1.0)
    return speculators_argv(c, train_data=str(data.train_data), hidden_states=str(data.train_hs),
                            save_path=str(save), layer_ids=data.layers, vocab=None, remote_code=False,
                            cpu=not torch.accelerator.is_available(), num_workers=0, log_dir=str(save / "logs"),
                            cache_dir=str(save / "hs"))


def build(argv: list[str]):
    """Draft, loaders and TrainerConfig exactly as backend/train/worker.py builds them."""
    import argparse as ap

    from hs_connectors import HiddenStatesBackend
    from speculators.model import SpeculatorModel
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.cli import build_draft_model, parse_vocab_mappings, set_seed
    from speculators.train.config import TrainConfig
    from speculators.train.dataloader import create_train_val_loaders

    from backend.train.worker import trainer_config

    cfg = TrainConfig.resolve(argv)
    args = ap.Namespace(**cfg.flatten())
    set_seed(args.seed, args.deterministic_cuda)
    dtype = getattr(torch, args.hidden_states_dtype)
    d2t, t2d, vocab = parse_vocab_mappings(args)
    model_class = SpeculatorModel.registry["eagle3"]
    draft = build_draft_model(args, model_class, t2d, d2t, vocab)
    transfer = HiddenStatesBackend.registry[args.hidden_states_backend].from_train_args(args, args.data_path)
    train_loader, val_loader = create_train_val_loaders(
        data_path=args.data_path, total_seq_len=args.total_seq_len, hidden_states_dtype=dtype, transfer=transfer,
        vllm_endpoint=args.vllm_endpoint, on_missing=args.on_missing, verifier_name_or_path=args.verifier_name_or_path,
        request_timeout=args.request_timeout, max_retries=args.max_retries,
        generation_validation_retries=args.generation_validation_retries,
        max_consecutive_generation_failures=args.max_consecutive_generation_failures,
        hidden_size=draft.config.transformer_layer_config.hidden_size, num_target_layers=len(draft.target_layer_ids),
        num_workers=args.num_workers, prefetch_factor=args.prefetch_factor, preprocess=shift_batch,
        train_data_ratio=args.train_data_ratio, seed=args.seed)
    train_kwargs, val_kwargs = model_class.get_trainer_kwargs(**vars(args))
    return draft, train_loader, val_loader, trainer_config(args, train_kwargs, val_kwargs, dtype)


def stock_trainer_class():
    from speculators.train.trainer import Trainer

    if torch.accelerator.is_available():
        return Trainer

    class DeviceOnly(Trainer):
        """Stock Trainer plus only what lets it run without an accelerator (the same as ours)."""

        def setup_trainer(self):
            from backend.drafter.adapters import autocast_device_type, host_device

            self.local_rank = host_device(self.local_rank)
            self.device_type = autocast_device_type()
            super().setup_trainer()

    return DeviceOnly


def one_run(kind: str, data: ts.Dataset, steps: int) -> tuple[float, float, int]:
    from backend.contract.events import EventLog
    from backend.drafter import adapters
    from backend.drafter.verifier import inspect_verifier
    from backend.train import metrics
    from backend.train.trainer import HostTrainer
    from backend.train.worker import EventsReporter

    with tempfile.TemporaryDirectory(prefix=f"bench-{kind}-") as tmp:
        save = Path(tmp) / "checkpoints"
        argv = speculators_args(data, save, steps)
        info = inspect_verifier(str(data.verifier))
        with adapters.verifier_adapters(info), adapters.no_accelerator():
            draft, train_loader, val_loader, config = build(argv)
            log = reporter = None
            if kind == "ours":
                log = EventLog(os.path.join(tmp, "events.jsonl"), "train", "bench")
                reporter = EventsReporter(log)
                metrics.attach(reporter.handler)
                trainer = HostTrainer(draft, config, train_loader, val_loader, reporter=reporter)
            else:
                trainer = stock_trainer_class()(draft, config, train_loader, val_loader)
            try:
                start, cpu = time.perf_counter(), time.process_time()
                trainer.run_training()
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            finally:
                if reporter is not None:
                    logging.getLogger(metrics.METRICS_LOGGER).removeHandler(reporter.handler)
                    log.close()
        return elapsed, cpu, trainer.global_step


def handler_cost(records: int = 2000) -> float:
    """Seconds per metrics record through MetricsHandler into an events.jsonl."""
    from backend.contract.events import EventLog
    from backend.train.metrics import MetricsHandler

    with tempfile.TemporaryDirectory() as tmp:
        log = EventLog(os.path.join(tmp, "events.jsonl"), "train", "bench")
        handler = MetricsHandler(log.emit)
        handler.set_plan(records, records)
        msg = {"train": {**{f"{m}_{k}": 0.5 for m in ("loss", "full_acc", "cond_acc") for k in range(3)},
                         "loss": 1.5, "error_records": 0.0},
               "profile": {"tokens_per_s": 1000.0, "step_ms": 100.0}, "epoch": 0, "lr": 0.001}
        record = logging.LogRecord("speculators.metrics", logging.INFO, __file__, 1, msg, None, None)
        start = time.perf_counter()
        for step in range(records):
            msg["global_step"] = step
            handler.emit(record)
        cost = (time.perf_counter() - start) / records
        log.close()
    return cost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from speculators.train.logger import setup_metric_logger, setup_root_logger
    from sim import tinylm

    verifier = tinylm.ensure_model()
    root = Path(tempfile.mkdtemp(prefix="bench-train-data-"))
    data = ts.Dataset(root, verifier, train=48, heldout=4)
    setup_root_logger()
    setup_metric_logger(loggers="", run_name=None, output_dir=str(root / "logs"))
    wall: dict[str, list[float]] = {"stock": [], "ours": []}
    cpu: dict[str, list[float]] = {"stock": [], "ours": []}
    steps_done = 0
    one_run("stock", data, 2)  # warm-up: imports, allocator, first-call costs
    for r in range(args.rounds):
        order = ("stock", "ours") if r % 2 == 0 else ("ours", "stock")
        for kind in order:
            with contextlib.redirect_stdout(io.StringIO()):  # rich's console output costs the same both sides
                elapsed, used, steps_done = one_run(kind, data, args.steps)
            wall[kind].append(elapsed)
            cpu[kind].append(used)
            print(f"round {r + 1} {kind:<5} {elapsed:7.2f} s wall {used:7.2f} s CPU for {steps_done} steps",
                  file=sys.stderr)
    # a shared machine's load drifts between rounds: compare each round's pair, then take the median
    cpu_ratio = statistics.median(o / s for o, s in zip(cpu["ours"], cpu["stock"]))
    wall_ratio = statistics.median(o / s for o, s in zip(wall["ours"], wall["stock"]))
    stock = statistics.median(wall["stock"])
    per_record = handler_cost()
    step = stock / max(1, steps_done)
    device = "GPU" if torch.accelerator.is_available() else "CPU (stock side: device handling only)"
    print(f"device: {device}; {args.rounds} rounds of {steps_done} steps each side, alternating")
    print(f"stock speculators Trainer: median {stock:.2f} s wall, {statistics.median(cpu['stock']):.2f} s CPU")
    print(f"train stage (HostTrainer + metrics to events.jsonl): median {statistics.median(wall['ours']):.2f} s "
          f"wall, {statistics.median(cpu['ours']):.2f} s CPU")
    print(f"ratio ours/stock, CPU time (median of paired rounds): {cpu_ratio:.4f} "
          f"(overhead {100 * (cpu_ratio - 1):+.2f} %, target <= 2 %)")
    print(f"ratio ours/stock, wall time (median of paired rounds): {wall_ratio:.4f}")
    print(f"metrics handler: {per_record * 1e6:.1f} us per step record = {100 * per_record / step:.4f} % of a "
          f"{step * 1e3:.0f} ms step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
