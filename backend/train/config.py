"""Every knob of the train stage, as flags (`python -m backend.train --help`).

The stage's own settings map onto speculators' `train` flags in backend/train/plan.py; `--extra-args`
passes further speculators flags through verbatim (those the stage sets itself are refused there).
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from backend.kit.lifecycle import ConfigError  # noqa: F401 - the one definition, raised here

_URL = re.compile(r"https?://[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+")


# flags the stage sets itself: passing them again through --extra-args would silently fight the plan
OWNED_FLAGS = ("--speculator-type", "--verifier-name-or-path", "--data-path", "--save-path", "--target-layer-ids",
               "--epochs", "--lr", "--ttt-steps", "--total-seq-len", "--num-layers", "--optimizer", "--seed",
               "--checkpoint-freq", "--log-freq", "--num-workers", "--hidden-states-dtype", "--train-data-ratio",
               "--max-steps", "--draft-vocab-size", "--d2t-path", "--t2d-path", "--token-freq-path",
               "--hidden-states-path", "--on-missing", "--vllm-endpoint", "--trust-remote-code", "--logger",
               "--log-dir", "--draft-attn-impl", "--loss-implementation", "--no-resume-from-checkpoint",
               "--dry-run", "--config", "--dump-config", "--hidden-states-backend", "--from-pretrained")


def resolved_dtype(requested: str, cpu: bool) -> str:
    """The dtype a run computes in. On the CPU, speculators' bfloat16 autocast is emulated where the CPU has
    no bfloat16 units (AVX2): a small demo training took 14.5 CPU-s in float32 against 20.0 in bfloat16
    (about 9 of each is imports), to the same acceptance. The draft's own weights are float32 either way
    (autocast casts per op); a warm start's bfloat16 weights are cast when it computes in float32
    (backend/train/worker.py)."""
    if requested != "auto":
        return requested
    return "float32" if cpu else "bfloat16"


def check_extra_args(args: list[str]) -> None:
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            raise ConfigError(f"--extra-args may not set {flag}: the stage sets it from its own settings "
                              f"(use the matching stage option instead)")
        if not flag.startswith("--") and arg is args[0]:
            raise ConfigError(f"--extra-args must start with a speculators flag (--name), got {arg!r}")


@dataclass
class TrainStageConfig:
    work_dir: str = "."
    run_id: str = "train"
    input_run: str | None = None  # an extract run (offline) or a prepare run (online); default the latest
    verifier: str = ""  # the verifier's directory on this host
    aux_layer_ids: list[int] | None = None  # default: the extract run's
    epochs: int = 20
    lr: float = 1e-3
    speculative_tokens: int = 3
    draft_vocab_size: int | None = None  # None: by coverage (backend/train/vocab.py); >= the verifier's: all of it
    vocab_coverage: float = 0.99  # the default draft vocabulary covers this share of the supervised tokens
    vocab_floor: int = 32000  # ... and holds at least this many tokens
    seq_length: int = 8192  # tokens per packed batch
    draft_layers: int = 1
    optimizer: str = "muon"
    seed: int = 0
    gpus: int | None = None  # None: every visible GPU (CPU when there is none); 0: CPU
    gpu_ids: list[int] | None = None  # the GPUs to use by index: CUDA_VISIBLE_DEVICES, one process each
    nvidia_smi: list[str] | None = None  # how this host's GPUs are asked (default: nvidia-smi)
    simulated_gpus: bool = False  # the demo host: GPUs counted and checked in --nvidia-smi, computed on the CPU
    checkpoint_freq: float = 1.0  # epochs between checkpoints (< 1: also mid-epoch)
    log_freq: int = 1
    num_workers: int | None = None  # dataloader workers; None: 0 on CPU, 4 per GPU process
    hidden_states_dtype: str = "auto"  # auto: bfloat16 on GPUs, float32 on the CPU (resolved_dtype)
    train_data_ratio: float = 0.9  # the rest of the training rows validates each epoch
    max_steps: int | None = None
    vllm_endpoint: str | None = None  # online: an extraction server (speculators' --on-missing generate)
    served_model: str | None = None  # the id that server reports in /v1/models (default: the verifier path)
    plan: str | None = None  # online under the swap (backend/kit/swap.py): the extraction server takes the baseline's place
    trust_remote_code: str = "auto"  # auto (when config.json has auto_map) | on | off
    acceptance_samples: int = 16  # held-out rows each checkpoint's acceptance is measured on (0: off)
    acceptance_patience: int = 3  # stop after this many epochs without a better acceptance (0: never)
    acceptance_min_delta: float = 0.01  # mean accepted length a better epoch must gain (measurement noise)
    from_pretrained: str | None = None  # warm start: a train or fetch_drafter run id, or a checkpoint directory
    extra_args: list[str] = field(default_factory=list)
    min_free_bytes: int = 1 << 30
    fresh: bool = False
    preflight_only: bool = False
    skip_preflight: bool = False

    def validate(self) -> None:
        if not self.verifier:
            raise ConfigError("--verifier is required (the verifier model's directory on this host)")
        for name, low in (("epochs", 1), ("speculative_tokens", 1), ("seq_length", 16), ("draft_layers", 1),
                          ("log_freq", 1)):
            if getattr(self, name) < low:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(self, name)}")
        if not 0 < self.lr < 10:
            raise ConfigError(f"--lr must be in (0, 10), got {self.lr}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 2:
            raise ConfigError(f"--draft-vocab-size must be >= 2, got {self.draft_vocab_size}")
        if not 0 < self.vocab_coverage <= 1:
            raise ConfigError(f"--vocab-coverage must be in (0, 1], got {self.vocab_coverage}")
        if self.vocab_floor < 2:
            raise ConfigError(f"--vocab-floor must be >= 2, got {self.vocab_floor}")
        if self.optimizer not in ("muon", "adamw"):
            raise ConfigError(f"--optimizer must be muon or adamw, got {self.optimizer!r}")
        if self.gpus is not None and not 0 <= self.gpus <= 1024:
            raise ConfigError(f"--gpus must be 0 (CPU) .. 1024, got {self.gpus}")
        if self.gpu_ids is not None:
            if not self.gpu_ids or len(set(self.gpu_ids)) != len(self.gpu_ids) or min(self.gpu_ids) < 0:
                raise ConfigError(f"--gpu-ids must be distinct GPU indices, got {self.gpu_ids}")
            if self.gpus is not None and self.gpus != len(self.gpu_ids):
                raise ConfigError(f"--gpus {self.gpus} and --gpu-ids {self.gpu_ids} disagree: give one")
        if self.checkpoint_freq <= 0:
            raise ConfigError(f"--checkpoint-freq must be > 0, got {self.checkpoint_freq}")
        if self.num_workers is not None and self.num_workers < 0:
            raise ConfigError(f"--num-workers must be >= 0, got {self.num_workers}")
        if self.hidden_states_dtype not in ("auto", "bfloat16", "float32"):
            raise ConfigError(f"--hidden-states-dtype must be auto, bfloat16 or float32, "
                              f"got {self.hidden_states_dtype!r}")
        if not 0 < self.train_data_ratio < 1:
            raise ConfigError(f"--train-data-ratio must be in (0, 1), got {self.train_data_ratio}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"--max-steps must be >= 1, got {self.max_steps}")
        if self.vllm_endpoint is not None and not _URL.fullmatch(self.vllm_endpoint):
            raise ConfigError(f"--vllm-endpoint must be an http(s) URL such as http://127.0.0.1:8000/v1, "
                              f"got {self.vllm_endpoint!r}")
        if self.plan is not None and not self.plan.strip():
            raise ConfigError("--plan is empty: give the swap plan's JSON file")
        if self.trust_remote_code not in ("auto", "on", "off"):
            raise ConfigError(f"--trust-remote-code must be auto, on or off, got {self.trust_remote_code!r}")
        if self.aux_layer_ids is not None and not self.aux_layer_ids:
            raise ConfigError("--aux-layer-ids is empty")
        check_extra_args(self.extra_args)
        for name in ("acceptance_samples", "acceptance_patience"):
            if not 0 <= getattr(self, name) <= 100_000:
                raise ConfigError(f"--{name.replace('_', '-')} must be 0 .. 100000, got {getattr(self, name)}")
        if not 0 <= self.acceptance_min_delta < 100:
            raise ConfigError(f"--acceptance-min-delta must be in [0, 100), got {self.acceptance_min_delta}")
        if self.from_pretrained is not None:
            from backend.train.warm_start import SHAPING_FLAGS

            shaping = [a for a in self.extra_args if a.split("=", 1)[0] in SHAPING_FLAGS]
            if shaping:
                raise ConfigError(f"--extra-args {' '.join(shaping)}: a warm start takes the draft's shape from "
                                  f"--from-pretrained, and speculators refuses decoder-shaping flags beside it")
            if not self.from_pretrained.strip():
                raise ConfigError("--from-pretrained is empty: give a train or fetch_drafter run id, or a "
                                  "checkpoint directory")

    @property
    def online(self) -> bool:
        return self.vllm_endpoint is not None or self.plan is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int_list(text: str) -> list[int]:
    text = text.strip()
    try:
        value = json.loads(text) if text.startswith("[") else [int(p) for p in re.split(r"[,\s]+", text) if p]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected layer ids such as 1,2,3 ({exc})") from exc
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise argparse.ArgumentTypeError("expected a list of integers such as 1,2,3")
    return value


def _arg_list(text: str) -> list[str]:
    text = text.strip()
    if text.startswith("["):
        value = json.loads(text)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError("expected a JSON list of strings")
        return value
    return shlex.split(text)


_HELP = {
    "input_run": "the extract run whose hidden states to train on, or (with --vllm-endpoint) the prepare run",
    "verifier": "the verifier model's directory on this host",
    "aux_layer_ids": "verifier layers whose input states the draft reads (vLLM's convention); default: the "
                     "extract run's",
    "draft_vocab_size": "the draft's vocabulary: the N most frequent supervised tokens (N >= the verifier's "
                        "vocabulary: all of it); default: by --vocab-coverage and --vocab-floor",
    "vocab_coverage": "the default draft vocabulary is the smallest that covers this share of the prepare "
                      "run's supervised tokens",
    "vocab_floor": "the default draft vocabulary holds at least this many tokens (at most the verifier's)",
    "seq_length": "tokens per packed training batch",
    "hidden_states_dtype": "what the hidden states are read as and training autocasts to: auto is bfloat16 on "
                           "GPUs and float32 on the CPU (a CPU without bfloat16 units emulates it, at half the "
                           "speed)",
    "gpus": "GPU processes (torchrun when > 1); 0 trains on the CPU; default: every visible GPU",
    "nvidia_smi": "how this host's GPUs are asked, as a JSON list (the console passes its profile's [gpus] "
                  "command without the query): the GPU check reads the table the console's telemetry reads",
    "simulated_gpus": "simulated GPUs (the demo host): the GPUs are counted and checked in --nvidia-smi's table, "
                      "training computes on the CPU",
    "gpu_ids": "the GPUs to train on, by index (e.g. 6,7; the console passes a profile's [train] gpus list "
               "here): the stage sets CUDA_VISIBLE_DEVICES to them and starts one process each",
    "checkpoint_freq": "epochs between checkpoints; below 1 also saves within an epoch (e.g. 0.25)",
    "vllm_endpoint": "online training: an extraction server's URL ending in /v1; hidden states are fetched "
                     "per batch and deleted after use",
    "plan": "online training under the server swap: the swap plan's JSON file (the console writes it); the "
            "baseline server is stopped, the extraction server started for the training and the baseline "
            "started again afterwards, also after a failure or SIGTERM; --vllm-endpoint defaults to its endpoint",
    "served_model": "online: the model id the extraction server serves (speculators checks it; default: "
                    "the verifier path, vLLM's default id)",
    "acceptance_samples": "held-out rows each saved checkpoint's acceptance is measured on; the checkpoint with "
                          "the best mean accepted length is the one handed on (0: speculators' lowest "
                          "validation loss)",
    "acceptance_patience": "stop early after this many epochs without a better acceptance (0: never)",
    "acceptance_min_delta": "mean accepted length an epoch must gain to count as better",
    "from_pretrained": "warm start from this drafter: a train run or fetch_drafter run of the work dir (its "
                       "checkpoint), or a checkpoint directory; it must fit the verifier, the aux layers and the "
                       "draft vocabulary (its shape replaces --draft-layers)",
    "extra_args": "further `speculators train` flags, as one shell-quoted string or a JSON list",
    "fresh": "archive an existing run directory (renamed, never deleted) and start over",
    "preflight_only": "run the preflight checks, print them as JSON, and exit",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m backend.train",
                                description="Train an EAGLE-3 drafter with speculators.")
    for f in fields(TrainStageConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type)
        help_text = _HELP.get(f.name)
        if kind == "bool":
            p.add_argument(flag, dest=f.name, action="store_true", default=None, help=help_text)
        elif f.name in ("aux_layer_ids", "gpu_ids"):
            p.add_argument(flag, dest=f.name, type=_int_list, default=None, help=help_text)
        elif f.name in ("extra_args", "nvidia_smi"):
            p.add_argument(flag, dest=f.name, type=_arg_list, default=None, help=help_text)
        elif kind.startswith("int"):
            p.add_argument(flag, dest=f.name, type=int, default=None, help=help_text)
        elif kind.startswith("float"):
            p.add_argument(flag, dest=f.name, type=float, default=None, help=help_text)
        else:
            p.add_argument(flag, dest=f.name, type=str, default=None, help=help_text)
    return p


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, as ConfigError, instead of usage + exit
        raise ConfigError(message)


def parse_config(argv: list[str] | None = None) -> TrainStageConfig:
    parser = build_parser()
    parser.__class__ = _Parser
    args = parser.parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in fields(TrainStageConfig) if getattr(args, f.name) is not None}
    config = TrainStageConfig(**values)
    config.validate()
    return config
