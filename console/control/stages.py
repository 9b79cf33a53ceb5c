"""The pipeline's stages as the console shows and starts them, in order.

The host-side stages (backend/lookup.py) framed by what the console itself drives: the baseline
server before them, serving with the drafter, fetching a published drafter to compare against (the bench's
third contender) and benchmarking after, and a pipeline run of them all.
"""
from __future__ import annotations

from backend.benchpair import STAGE as BENCHPAIR
from backend.fetch_drafter import STAGE as FETCH_DRAFTER  # noqa: F401 - started on its own: no GPU, no input run
from backend.lookup import STAGES as HOST_STAGES

STAGES: tuple[str, ...] = ("serve", *HOST_STAGES, "serve_drafter", FETCH_DRAFTER, "bench", "pipeline")
# The host stage of the runs a console stage starts, where the two differ: `bench` runs the bench pair
# (backend/benchpair.py), whose own benches are runs of the host stage "bench".
RUN_STAGE: dict[str, str] = {"bench": BENCHPAIR}


def host_stage(stage: str) -> str:
    """The stage name the runs of console stage `stage` carry in their events."""
    return RUN_STAGE.get(stage, stage)
