"""The pipeline's stages as the console shows and starts them, in order.

The host-side stages (backend/lookup.py) framed by what the console itself drives: the baseline
server before them, serving with the drafter, fetching a published drafter to compare against (the bench's
third contender) and benchmarking after, and a pipeline run of them all.
"""
from __future__ import annotations

from backend.fetch_drafter import STAGE as FETCH_DRAFTER  # noqa: F401 - started on its own: no GPU, no input run
from backend.lookup import STAGES as HOST_STAGES

STAGES: tuple[str, ...] = ("serve", *HOST_STAGES, "serve_drafter", FETCH_DRAFTER, "bench", "pipeline")
