"""The stage's settings and inputs -> the exact `speculators train` flags the worker runs with.

Written to `<run dir>/train_plan.json` by the stage and read by each worker process (one in-process
worker on CPU or one GPU; torchrun's N workers otherwise), so every rank trains the same plan.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from backend.contract.runs import write_json_atomic
from backend.train.config import TrainStageConfig, check_extra_args, resolved_dtype

PLAN_FILE = "train_plan.json"
STATUS_FILE = "train_status.json"  # written by rank 0 when training returns: completed | stopped
CHECKPOINTS_DIR = "checkpoints"
VOCAB_DIR = "vocab"
@dataclass
class TrainPlan:
    run_id: str
    run_dir: str
    events_path: str
    verifier: str
    save_path: str
    processes: int  # 1: in-process; more: torchrun
    device: str  # "cpu" or "gpu"
    served_model: str | None = None  # online: the extraction server's model id
    selection: dict[str, Any] | None = None  # acceptance-driven choice (backend/train/selection.py settings)
    argv: list[str] = field(default_factory=list)  # speculators train flags

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def load(cls, path: str) -> "TrainPlan":
        with open(path, encoding="utf-8") as f:
            return cls(**json.load(f))

    def save(self) -> str:
        path = os.path.join(self.run_dir, PLAN_FILE)
        write_json_atomic(path, self.to_dict())
        return path


def speculators_argv(c: TrainStageConfig, *, train_data: str, hidden_states: str | None, save_path: str,
                     layer_ids: list[int], vocab: tuple[int, str, str] | None, remote_code: bool,
                     cpu: bool, num_workers: int, log_dir: str, cache_dir: str,
                     warm_start: str | None = None) -> list[str]:
    """The `speculators train` flags for this run (see backend/drafter/adapters.py for the CPU ones).

    A warm start (`warm_start`: the staged checkpoint, backend/train/warm_start.py) passes --from-pretrained
    and leaves out what the checkpoint defines: the decoder shape (speculators refuses --num-layers beside
    it), the aux layer ids and the draft vocabulary mapping (both read from the checkpoint; the stage
    checked they fit)."""
    check_extra_args(c.extra_args)
    if warm_start is not None:
        shape = ["--from-pretrained", warm_start]
        vocab = None
    else:
        shape = ["--target-layer-ids", *map(str, layer_ids), "--num-layers", str(c.draft_layers)]
    argv = ["--speculator-type", "eagle3", "--verifier-name-or-path", c.verifier, "--data-path", train_data,
            "--save-path", save_path, *shape, "--epochs", str(c.epochs),
            "--lr", repr(c.lr), "--ttt-steps", str(c.speculative_tokens), "--total-seq-len", str(c.seq_length),
            "--optimizer", c.optimizer, "--seed", str(c.seed),
            "--checkpoint-freq", repr(c.checkpoint_freq), "--log-freq", str(c.log_freq),
            "--num-workers", str(num_workers),
            "--hidden-states-dtype", resolved_dtype(c.hidden_states_dtype, cpu),
            "--train-data-ratio", repr(c.train_data_ratio), "--logger", "", "--log-dir", log_dir]
    if c.max_steps is not None:
        argv += ["--max-steps", str(c.max_steps)]
    if vocab is not None:
        size, d2t, t2d = vocab
        argv += ["--draft-vocab-size", str(size), "--d2t-path", d2t, "--t2d-path", t2d]
    if c.online:
        # the cache dir is the run's own (empty): speculators would otherwise look in <data>/hidden_states
        argv += ["--on-missing", "generate", "--vllm-endpoint", str(c.vllm_endpoint),
                 "--hidden-states-path", cache_dir]
    else:
        argv += ["--on-missing", "raise", "--hidden-states-path", str(hidden_states)]
    if remote_code:
        argv.append("--trust-remote-code")
    if cpu:
        argv += ["--draft-attn-impl", "sdpa", "--loss-implementation", "eager"]
    return argv + list(c.extra_args)


def write_status(run_dir: str, status: str, **data: Any) -> None:
    write_json_atomic(os.path.join(run_dir, STATUS_FILE), {"status": status, **data})


def read_status(run_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(run_dir, STATUS_FILE), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
