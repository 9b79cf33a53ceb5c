"""Simulated failures of the vLLM stand-in (simulated only: nothing here exists in real vLLM).

Given on the command line as `--fault KIND[:VALUE]` (repeatable) or at run time with
`POST /_sim/fault {"kind": KIND, "value": VALUE}` (`{"kind": "clear"}` drops the run-time ones):

  crash-during-load:F  CUDA OOM traceback when weight loading reaches fraction F (0..1), exit 1
  nccl-error[:F]       NCCL error while the workers start (at load fraction F, default 0), exit 1
  address-in-use       bind fails with `[Errno 98] Address already in use`, exit 1
  die-after:N          after N answered generation requests the next one kills the process mid-way
  engine-dead[:N]      after N answered generation requests the engine dies: /health 503, requests 500
  slow:S               S seconds of added latency per generation request
  stall                generation requests are accepted and never answered
  5xx:N                the next N generation requests get 500 with an error body
  no-tokenize          /tokenize answers 404 as if absent (a proxy that passes only /v1 routes)
  inf-metrics          /metrics reports +Inf requests running (a buggy exporter: the console must shrug)
"""
from __future__ import annotations

from dataclasses import dataclass, fields

LOAD_KINDS = ("crash-during-load", "nccl-error", "address-in-use")
RUNTIME_KINDS = ("die-after", "engine-dead", "slow", "stall", "5xx", "no-tokenize", "inf-metrics")
KINDS = LOAD_KINDS + RUNTIME_KINDS


class FaultError(ValueError):
    pass


@dataclass
class Faults:
    crash_at: float | None = None
    nccl_at: float | None = None
    address_in_use: bool = False
    die_after: int | None = None
    engine_dead_after: int | None = None
    slow_s: float = 0.0
    stall: bool = False
    error_burst: int = 0
    no_tokenize: bool = False
    inf_metrics: bool = False
    engine_dead: bool = False  # set once engine_dead_after is reached

    def apply(self, kind: str, value: object = None) -> None:
        """Set one fault; raises FaultError with a sentence naming the problem."""
        kind = kind.strip().lower()
        if kind == "clear":
            for f in fields(self):
                if f.name not in ("crash_at", "nccl_at", "address_in_use"):
                    setattr(self, f.name, f.default)
            return
        if kind not in KINDS:
            raise FaultError(f"unknown fault {kind!r}; known: {', '.join(KINDS)}, clear")
        if kind == "crash-during-load":
            self.crash_at = _fraction(kind, value, required=True)
        elif kind == "nccl-error":
            self.nccl_at = _fraction(kind, value, required=False)
        elif kind == "address-in-use":
            self.address_in_use = True
        elif kind == "die-after":
            self.die_after = _count(kind, value, required=True)
        elif kind == "engine-dead":
            self.engine_dead_after = _count(kind, value, required=False)
            self.engine_dead = self.engine_dead_after == 0
        elif kind == "slow":
            self.slow_s = _number(kind, value)
        elif kind == "stall":
            self.stall = value is None or value is True or str(value).lower() not in ("0", "false", "off")
        elif kind == "5xx":
            self.error_burst = _count(kind, value, required=True)
        elif kind == "no-tokenize":
            self.no_tokenize = value is None or value is True or str(value).lower() not in ("0", "false", "off")
        elif kind == "inf-metrics":
            self.inf_metrics = value is None or value is True or str(value).lower() not in ("0", "false", "off")

    def describe(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def parse_spec(spec: str) -> tuple[str, str | None]:
    kind, sep, value = spec.partition(":")
    return kind, (value if sep else None)


def _number(kind: str, value: object) -> float:
    if value is None:
        raise FaultError(f"fault {kind} needs a value, e.g. {kind}:2")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise FaultError(f"fault {kind}: {value!r} is not a number") from None
    if number < 0:
        raise FaultError(f"fault {kind}: value must be >= 0, got {number}")
    return number


def _fraction(kind: str, value: object, *, required: bool) -> float:
    if value is None and not required:
        return 0.0
    number = _number(kind, value)
    if number > 1:
        raise FaultError(f"fault {kind}: fraction must be between 0 and 1, got {number}")
    return number


def _count(kind: str, value: object, *, required: bool) -> int:
    if value is None and not required:
        return 0
    number = _number(kind, value)
    if number != int(number):
        raise FaultError(f"fault {kind}: {value!r} is not a whole number")
    return int(number)
