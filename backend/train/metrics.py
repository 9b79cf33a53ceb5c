"""speculators' training metrics -> structured progress events, through a handler on its metrics logger.

speculators' Trainer logs one dict per logged step and one per validation epoch on the Python logger
`speculators.metrics` (rich prints them to stdout, wrapped at 80 columns when piped: never parsed here).
`MetricsHandler` is a `logging.Handler` on that logger that turns each dict into a `progress` event of
events.jsonl (backend/contract/events.py) at the moment it is logged:

- train step: phase "train", step (speculators' global_step, 0-based), done (steps finished), total,
  epoch, loss, loss_k / acc_k / cond_acc_k (lists by draft position: acc_k is the chain accuracy,
  position k right and every earlier one too; cond_acc_k given the earlier ones were right), lr (the
  first optimizer's; lr_groups when there are several), rate (steps/s over the last steps), eta_s,
  tokens_per_s.
- validation: phase "val", step (the last step trained before it), epoch, val_loss, val_loss_k,
  val_acc_k, val_cond_acc_k.
Everything else speculators logs there (the resolved config, with `hparams`) is ignored.
"""
from __future__ import annotations

import logging
import math
import re
import time
from collections import deque
from typing import Any, Callable

METRICS_LOGGER = "speculators.metrics"
RATE_WINDOW = 20  # steps the rate is averaged over
_POSITIONAL = re.compile(r"^(?P<name>[a-z_]+?)_(?P<k>\d+)(?P<epoch>_epoch)?$")
_KEYS = {"loss": "loss_k", "full_acc": "acc_k", "cond_acc": "cond_acc_k"}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def positional(metrics: dict[str, Any], epoch_suffix: bool = False) -> dict[str, list[float | None]]:
    """`loss_0, loss_1, full_acc_0 ...` -> {"loss_k": [..], "acc_k": [..], "cond_acc_k": [..]}."""
    found: dict[str, dict[int, float | None]] = {}
    for key, value in metrics.items():
        m = _POSITIONAL.match(key)
        if not m or bool(m.group("epoch")) != epoch_suffix or m.group("name") not in _KEYS:
            continue
        found.setdefault(_KEYS[m.group("name")], {})[int(m.group("k"))] = _number(value)
    return {name: [by_k.get(k) for k in range(max(by_k) + 1)] for name, by_k in found.items()}


class MetricsHandler(logging.Handler):
    """Writes speculators' metric dicts as progress events through `emit_event(kind, **data)`."""

    def __init__(self, emit_event: Callable[..., Any], *, clock: Callable[[], float] = time.monotonic):
        super().__init__(level=logging.INFO)
        self.emit_event = emit_event
        self.clock = clock
        self.total_steps = 0
        self.steps_per_epoch = 0
        self._times: deque[tuple[int, float]] = deque(maxlen=RATE_WINDOW)

    def set_plan(self, total_steps: int, steps_per_epoch: int) -> None:
        self.total_steps = int(total_steps)
        self.steps_per_epoch = int(steps_per_epoch)

    def rate(self) -> float | None:
        if len(self._times) < 2:
            return None
        (s0, t0), (s1, t1) = self._times[0], self._times[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if not isinstance(msg, dict) or getattr(record, "hparams", False):
            return
        try:
            if isinstance(msg.get("train"), dict):
                self.emit_event("progress", **self.train_event(msg))
            elif isinstance(msg.get("val"), dict):
                self.emit_event("progress", **self.val_event(msg, getattr(record, "step", None)))
        except Exception:  # a metrics record must never take training down
            self.handleError(record)

    def train_event(self, msg: dict[str, Any]) -> dict[str, Any]:
        metrics: dict[str, Any] = msg["train"]
        step = int(msg.get("global_step") or 0)
        self._times.append((step, self.clock()))
        rate = self.rate()
        done = step + 1
        self.total_steps = max(self.total_steps, done)  # the plan is an estimate: never report done > total
        eta = (self.total_steps - done) / rate if rate and self.total_steps >= done else None
        lr = msg.get("lr")
        event: dict[str, Any] = {"phase": "train", "step": step, "done": done, "total": self.total_steps,
                                 "epoch": msg.get("epoch"), "loss": _number(metrics.get("loss")),
                                 **positional(metrics)}
        if isinstance(lr, dict):
            event["lr"] = _number(next(iter(lr.values()), None))
            event["lr_groups"] = {str(k): _number(v) for k, v in lr.items()}
        else:
            event["lr"] = _number(lr)
        event["rate"] = round(rate, 4) if rate else None
        event["eta_s"] = round(eta, 1) if eta is not None else None
        profile = msg.get("profile")
        if isinstance(profile, dict):
            event["tokens_per_s"] = _number(profile.get("tokens_per_s"))
            event["step_ms"] = _number(profile.get("step_ms"))
        return event

    def val_event(self, msg: dict[str, Any], step: Any) -> dict[str, Any]:
        metrics: dict[str, Any] = msg["val"]
        pos = positional(metrics, epoch_suffix=True)
        event: dict[str, Any] = {"phase": "val", "epoch": msg.get("epoch"),
                                 "val_loss": _number(metrics.get("loss_epoch")),
                                 **{f"val_{k}": v for k, v in pos.items()}}
        if isinstance(step, int):  # speculators passes its step count: the last step done is one less
            event["step"] = step - 1
            event["done"] = step
        event["total"] = self.total_steps
        return event


def attach(handler: MetricsHandler) -> logging.Logger:
    """Add the handler to speculators' metrics logger (after speculators configured it)."""
    logger = logging.getLogger(METRICS_LOGGER)
    logger.addHandler(handler)
    return logger
