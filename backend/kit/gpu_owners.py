"""Who holds which GPUs at each step: decided here, once, before anything starts.

Every stage and server declares the GPUs it needs: the baseline and the servers derived from it (the
extraction server, the drafter server) hold the same GPUs (`HostShape.server`: its tensor-parallel ranks);
the trainer holds `HostShape.trainer` (`[train] gpus`, empty: the CPU); verify computes on the CPU (it
loads the drafter and the held-out hidden states with torch's default device) and needs a GPU program only
online, where the extraction server answers for its held-out rows. From that, `plan_gpus` says for a chain, a single stage, a bench or a serve switch which
programs hold which GPUs at each step and what must stop first, and refuses what cannot work:

- generate, prepare        the baseline serves (they ask it)
- extract                  the extraction server in the baseline's place
- train (offline)          the trainer; the baseline stops first when they share a GPU
- verify (offline)         the CPU: the baseline serves on
- train, verify (online)   the extraction server in the baseline's place AND the trainer: only where the
                           two have disjoint GPUs (else refused, offering offline training)
- bench, serve-drafter     the baseline, then the drafter server in its place

A chain whose steps take the baseline's GPUs more than once in a row keeps it down from the first such
step through the last (`hold`: one stop, one start at the end) instead of a load between each: on the
seed host (TP8 holding every GPU, training on one of them) extract and train run with the baseline down,
one load at the end, and verify runs on the CPU with the baseline back. Pure functions, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from backend.contract import stages as host_stages

BASELINE = "baseline"
EXTRACTION = "extraction server"
DRAFTER = "drafter server"
TRAINER = "trainer"


class OwnershipError(ValueError):
    """The GPUs cannot be shared as asked; the message says what to change."""


@dataclass(frozen=True)
class HostShape:
    gpus: int                    # on the host
    server: tuple[int, ...]      # the baseline's (and every server derived from it)
    trainer: tuple[int, ...] = ()  # the trainer's; empty: the CPU

    def __post_init__(self) -> None:
        for what, ids in (("server", self.server), ("trainer", self.trainer)):
            bad = [i for i in ids if not 0 <= i < self.gpus]
            if bad:
                raise OwnershipError(f"the {what}'s GPUs {list(ids)} are not all on a host of {self.gpus} GPUs "
                                     f"(indices 0..{self.gpus - 1})")

    @property
    def shared(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.server) & set(self.trainer)))


@dataclass(frozen=True)
class Step:
    stage: str
    holders: dict[str, tuple[int, ...]]      # program -> the GPUs it holds during the step
    stops_first: tuple[str, ...] = ()         # what must stop before the step starts
    baseline_down: bool = False               # the baseline is not serving during the step

    def describe(self) -> str:
        held = ", ".join(f"{who} on {_gpus(ids)}" for who, ids in self.holders.items()) or "no GPU"
        first = f" (first stop: {', '.join(self.stops_first)})" if self.stops_first else ""
        return f"{self.stage}: {held}{first}"


@dataclass(frozen=True)
class GpuPlan:
    steps: list[Step]
    hold: tuple[str, str] | None = None   # the baseline kept down from this stage through that one
    loads: int = 0                        # baseline loads the action costs (each start after a stop)
    notes: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        lines = [s.describe() for s in self.steps]
        if self.hold:
            lines.append(f"the baseline stays down from {self.hold[0]} through {self.hold[1]}, started once "
                         f"after {self.hold[1]} (also after a failure or a stop)")
        return lines + self.notes


def _gpus(ids: Sequence[int]) -> str:
    return "GPU " + ",".join(map(str, ids)) if ids else "the CPU"


def _step(stage: str, shape: HostShape, online: bool) -> Step:
    gpus = host_stages.gpu_use(stage)  # the stage's row (backend/contract/stages.py)
    if gpus == "baseline":
        return Step(stage, {BASELINE: shape.server})
    if gpus == "extraction":
        return Step(stage, {EXTRACTION: shape.server}, (BASELINE,), baseline_down=True)
    if gpus == "trainer" and not online and host_stages.get(stage).cpu_offline:
        return Step(stage, {BASELINE: shape.server, stage: ()})  # on the CPU, beside the baseline
    if gpus == "trainer":
        if online:
            if shape.shared:
                raise OwnershipError(
                    f"online {stage} needs the extraction server and the trainer on different GPUs, but both "
                    f"would use {_gpus(shape.shared)} (the server holds {_gpus(shape.server)}, [train] gpus "
                    f"asks for {_gpus(shape.trainer)}): give [train] gpus GPUs the server does not use, or "
                    f"train offline (--no-online, or [extract] online = false: extract, then train with the "
                    f"baseline down)")
            return Step(stage, {EXTRACTION: shape.server, TRAINER: shape.trainer}, (BASELINE,), baseline_down=True)
        if shape.shared:
            return Step(stage, {TRAINER: shape.trainer}, (BASELINE,), baseline_down=True)
        return Step(stage, {BASELINE: shape.server, TRAINER: shape.trainer})
    if gpus == "drafter" or stage == "serve-drafter":
        return Step(stage, {DRAFTER: shape.server}, (BASELINE,), baseline_down=True)
    if stage == "serve-baseline":
        return Step(stage, {BASELINE: shape.server}, (DRAFTER,))
    return Step(stage, {})  # needs no GPU (fetch_drafter)


def plan_gpus(shape: HostShape, stages: Sequence[str], *, online: bool = False, chain: bool = False) -> GpuPlan:
    """The GPU plan of `stages` (a chain when `chain`, else one stage program). OwnershipError when it
    cannot work."""
    steps = [_step(s, shape, online) for s in stages]
    down = [i for i, s in enumerate(steps) if s.baseline_down]
    hold = None
    if chain and len(down) > 1:
        first, last = down[0], down[-1]
        hold = (steps[first].stage, steps[last].stage)
        # between the two the baseline is not started again: whoever ran beside it runs without it
        for i in range(first, last + 1):
            s = steps[i]
            holders = {k: v for k, v in s.holders.items() if k != BASELINE}
            steps[i] = Step(s.stage, holders, (BASELINE,) if i == first else (), baseline_down=True)
    # a load per server started: each derived server (extraction, drafter), and the baseline each time it
    # comes back (once with a hold); a serve switch loads only the server it switches to
    starts = sum(1 for s in steps if EXTRACTION in s.holders or DRAFTER in s.holders)
    if list(stages) in (["serve-drafter"], ["serve-baseline"]):
        loads = 1
    else:
        loads = starts + (1 if hold else len(down))
    return GpuPlan(steps=steps, hold=hold, loads=loads)


# no host has more GPUs than this: a bigger TP x PP is a typo or a hostile unit, never a plan (and a
# range of 100000000 GPU indices would take minutes and gigabytes to build)
PARALLEL_MAX = 1024


def parallel_error(tensor_parallel: int, pipeline_parallel: int = 1, host_gpus: int | None = None) -> str | None:
    """Why this TP x PP cannot be a server's on a host of `host_gpus` GPUs (None: unknown), or None."""
    limit = min(PARALLEL_MAX, host_gpus) if host_gpus else PARALLEL_MAX
    if tensor_parallel < 1 or pipeline_parallel < 1 or tensor_parallel * pipeline_parallel > limit:
        where = f"the host's {host_gpus} GPUs" if host_gpus and host_gpus < PARALLEL_MAX else f"{PARALLEL_MAX}"
        return (f"tensor parallel {tensor_parallel} x pipeline parallel {pipeline_parallel}: expected a "
                f"product from 1 to {limit} ({where})")
    return None


def server_gpus_of(tensor_parallel: int, pipeline_parallel: int = 1, host_gpus: int | None = None) -> tuple[int, ...]:
    """The GPUs a vLLM server started without CUDA_VISIBLE_DEVICES takes: the first TP x PP."""
    error = parallel_error(max(1, tensor_parallel), max(1, pipeline_parallel), host_gpus)
    if error:
        raise OwnershipError(error)
    return tuple(range(max(1, tensor_parallel) * max(1, pipeline_parallel)))


def visible_devices(ids: Sequence[int]) -> str:
    """CUDA_VISIBLE_DEVICES for a program given these GPUs ("" for the CPU: it sees none)."""
    return ",".join(str(i) for i in ids)
