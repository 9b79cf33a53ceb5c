"""Adapters between speculators 0.9.0 and the hosts and verifiers we train on; each says what it handles.

Nothing here edits installed files, and nothing is applied silently: the stage enters these context
managers explicitly (backend/train/worker.py, backend/verify/), and each one names the speculators
assumption it handles. Tests: tests/test_train_adapters.py.

Device (applied ONLY when torch reports no accelerator; on a GPU host speculators runs untouched):
  speculators assumes an accelerator in four places.
  1. `speculators.train.trainer._StepTimer` calls `torch.accelerator.synchronize()` on every logged step,
     which raises "Cannot access accelerator device when none is available" on CPU.
     -> `HostStepTimer`, the same timer with the synchronize skipped (CPU work is synchronous anyway).
  2. `Trainer` moves the model and each batch with `.to(local_rank)`: an int, i.e. `cuda:<n>`.
     -> `HostTrainer` (backend/train/trainer.py) sets `local_rank` to `host_device()` (cpu).
  3. `SingleGPUCheckpointer` loads checkpoints with `map_location=get_current_device()`, which answers
     "cuda:0" when there is no accelerator, so a resume fails.
     -> `speculators.train.checkpointer.get_current_device` answers "cpu" inside `no_accelerator()`.
  4. `Trainer` autocasts with `device_type="cuda"` when there is no accelerator.
     -> `HostTrainer` sets `device_type` to `autocast_device_type()` ("cpu").
     On the CPU the stage computes in float32 (backend/train/config.py: resolved_dtype), and torch's CPU
     autocast then warns at each autocast site that float32 is not an autocast dtype and runs without
     autocast, which is what is asked: `no_accelerator()` silences that one warning.
  Also on CPU the stage passes `--draft-attn-impl sdpa` (FlexAttention has no CPU backward) and
  `--loss-implementation eager` (the fused loss needs Triton): flags, not patches.

Verifier (applied for every verifier; a no-op for a plain single-model checkpoint):
  5. speculators looks up the embedding, lm_head and final norm by the shortest key with a matching
     suffix (`speculators.utils.loading.load_model_layers`), so a vision tower's `vision_model.norm.weight`
     can be loaded as the language model's norm. -> `pinned_verifier_tensors(info)` answers those three
     names with the exact tensors backend/drafter/verifier.py pinned, for that verifier's path only.
  6. `Eagle3DraftModel.load_verifier_weights` and `.from_pretrained` call `AutoConfig.from_pretrained`
     without `trust_remote_code`, which fails (or prompts) for a remote-code verifier.
     -> `register_remote_code(info)` loads the verifier's config class once with trust_remote_code and
     registers it with `AutoConfig.register` (transformers' public API), so those calls resolve it.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import torch

from backend.drafter.verifier import VerifierInfo

SPECULATORS_VERSION = "0.9.0"  # the version whose internals the patches below name


class AdapterError(RuntimeError):
    """The installed speculators no longer has what an adapter patches: update the adapter."""


def accelerator_present() -> bool:
    return bool(torch.accelerator.is_available())


def host_device(local_rank: int = 0) -> torch.device:
    """Where the model and batches go: the rank's accelerator, else the CPU."""
    acc = torch.accelerator.current_accelerator() if accelerator_present() else None
    return torch.device(acc.type, local_rank) if acc is not None else torch.device("cpu")


def autocast_device_type() -> str:
    acc = torch.accelerator.current_accelerator() if accelerator_present() else None
    return acc.type if acc is not None else "cpu"


def _step_timer_class() -> type:
    from speculators.train import trainer

    base = getattr(trainer, "_StepTimer", None)
    if base is None:
        raise AdapterError(f"speculators.train.trainer._StepTimer is gone (adapters written for speculators "
                           f"{SPECULATORS_VERSION}); update backend/drafter/adapters.py")

    class HostStepTimer(base):  # type: ignore[misc, valid-type]
        """speculators' step timer without `torch.accelerator.synchronize()` (1: no accelerator)."""

        def mark(self, name: str) -> None:
            if self.enabled:
                import time
                self._marks[name] = time.perf_counter()

        def now(self) -> float | None:
            if not self.enabled:
                return None
            import time
            return time.perf_counter()

    return HostStepTimer


@contextlib.contextmanager
def _replaced(module: Any, name: str, value: Any) -> Iterator[None]:
    if not hasattr(module, name):
        raise AdapterError(f"{module.__name__}.{name} is gone (adapters written for speculators "
                           f"{SPECULATORS_VERSION}); update backend/drafter/adapters.py")
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


@contextlib.contextmanager
def no_accelerator() -> Iterator[list[str]]:
    """Device adapters 1 and 3, and 4's float32 warning silenced, while the block runs, only when there is
    no accelerator (yields the names of what was applied, for the log; empty on a GPU host)."""
    if accelerator_present():
        yield []
        return
    import warnings

    from speculators.train import checkpointer, trainer

    with _replaced(trainer, "_StepTimer", _step_timer_class()), \
            _replaced(checkpointer, "get_current_device", lambda: "cpu"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="In CPU autocast, but the target dtype is not supported",
                                category=UserWarning)
        yield ["step timer without accelerator synchronize", "checkpoint map_location cpu"]


@contextlib.contextmanager
def pinned_verifier_tensors(info: VerifierInfo) -> Iterator[bool]:
    """Adapter 5: speculators' verifier-tensor lookup answers with the pinned exact keys (yields whether
    the lookup needed it: False for a checkpoint where speculators' own rule already picks them)."""
    from speculators.utils import loading

    original: Callable[..., dict[str, torch.Tensor]] = loading.load_model_layers
    target = os.path.realpath(info.path)

    def load_model_layers(layer_names: list[str], model_path: str) -> dict[str, torch.Tensor]:
        if os.path.realpath(str(model_path)) != target:
            return original(layer_names, model_path)
        exact = [info.pinned.get(name, name) for name in layer_names]
        # exact keys always win in speculators' resolution, so this cannot pick another tensor
        loaded = original(exact, model_path)
        return {name: loaded[key] for name, key in zip(layer_names, exact) if key in loaded}

    with _replaced(loading, "load_model_layers", load_model_layers):
        yield info.needs_pinning()


def register_remote_code(info: VerifierInfo) -> bool:
    """Adapter 6: make `AutoConfig.from_pretrained(verifier)` work without trust_remote_code (True when
    the verifier has remote code and was registered)."""
    if not info.remote_code:
        return False
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(info.path, trust_remote_code=True)
    AutoConfig.register(info.model_type, type(config), exist_ok=True)
    return True


@contextlib.contextmanager
def verifier_adapters(info: VerifierInfo) -> Iterator[None]:
    """Adapters 5 and 6 together: what every stage that loads a draft for this verifier enters."""
    register_remote_code(info)
    with pinned_verifier_tensors(info):
        yield
