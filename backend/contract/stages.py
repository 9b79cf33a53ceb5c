"""The host's stage table: every host stage program, one row each, pipeline stages in pipeline order.

The run lookup (backend/contract/lookup.py), the GPU plan (backend/kit/gpu_owners.py), the chain's plan
and its checks (backend/chain/), `backend.ask` and the console's stage table (console/control/stages.py)
all read it, so a new pipeline stage is its package, one row here, one console row and its argv builder.
A row says:
- `name`: the stage its run directories carry (`python -m backend.<name>` runs it);
- `gpus`: whose GPUs it computes with: "baseline" (it asks the baseline server), "extraction" (the
  extraction server in the baseline's place), "trainer" (`[train] gpus`; online, beside the extraction
  server), "drafter" (the drafter server in the baseline's place), "none";
- `input_stage`: the stage whose latest completed run it consumes by default (`online_input`: when it
  trains online); `skip_online`: an online pipeline has no such stage; `in_pipeline`: a pipeline run
  chains it, in table order;
- `modules`: "module:NAME", where its program keeps the python modules it imports (the chain checks
  them before its first stage starts), and `extra`: the install extra that brings them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FETCH_DRAFTER = "fetch_drafter"
BENCH = "bench"
# The bench pair's own run directories (backend/benchpair.py): a name of its own, so the console never
# takes one of the pair's benches (stage "bench", run ids R-baseline, R-drafter) for the pair itself
BENCH_PAIR = "bench_pair"

GpuUse = Literal["none", "baseline", "extraction", "trainer", "drafter"]


@dataclass(frozen=True)
class HostStage:
    name: str
    gpus: GpuUse = "none"
    input_stage: str | None = None
    online_input: str | None = None
    skip_online: bool = False
    in_pipeline: bool = False
    cpu_offline: bool = False  # offline it computes on the CPU: the baseline may stay up beside it
    modules: str | None = None
    extra: Literal["host", "train"] = "train"

    @property
    def takes_gpus(self) -> Literal["no", "always", "online"]:
        """Whether starting it takes the GPUs from the baseline server (it stops it): a server in the
        baseline's place always does; the trainer does when it trains online (beside the extraction server)."""
        if self.gpus in ("extraction", "drafter"):
            return "always"
        return "online" if self.gpus == "trainer" else "no"

    @property
    def gpu_user(self) -> bool:
        """It computes on the GPUs itself (no server holds them for it)."""
        return self.gpus == "trainer"


_TRAIN_MODULES = "backend.train.preflight:TRAIN_MODULES"  # train and verify load the verifier with speculators

TABLE: tuple[HostStage, ...] = (
    # generate's modules depend on its dataset's format: the jsonl minimum here, its own preflight checks the rest
    HostStage("generate", gpus="baseline", in_pipeline=True, modules="backend.generate.preflight:JSONL_MODULES",
              extra="host"),
    HostStage("prepare", gpus="baseline", input_stage="generate", in_pipeline=True,
              modules="backend.prepare.__main__:REQUIRED_MODULES"),
    HostStage("extract", gpus="extraction", input_stage="prepare", skip_online=True, in_pipeline=True,
              modules="backend.extract.runner:REQUIRED_MODULES"),
    HostStage("train", gpus="trainer", input_stage="extract", online_input="prepare", in_pipeline=True,
              modules=_TRAIN_MODULES),
    HostStage("verify", gpus="trainer", input_stage="train", in_pipeline=True, cpu_offline=True,
              modules=_TRAIN_MODULES),
    HostStage(FETCH_DRAFTER),
    HostStage(BENCH, gpus="drafter"),
)


def names() -> tuple[str, ...]:
    return tuple(s.name for s in TABLE)


def pipeline() -> tuple[str, ...]:
    """The stages a pipeline run chains, in order."""
    return tuple(s.name for s in TABLE if s.in_pipeline)


def find(name: str) -> HostStage | None:
    return next((s for s in TABLE if s.name == name), None)


def get(name: str) -> HostStage:
    found = find(name)
    if found is None:
        raise KeyError(f"no host stage {name!r} (the host's stages: {', '.join(names())})")
    return found


def gpu_use(name: str) -> GpuUse:
    """Whose GPUs the stage computes with ("none" for a name that is no host stage)."""
    found = find(name)
    return found.gpus if found is not None else "none"


def input_stages() -> dict[str, str]:
    """The stage whose output each stage consumes by default."""
    return {s.name: s.input_stage for s in TABLE if s.input_stage}
