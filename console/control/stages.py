"""The pipeline's stages as the console shows and starts them, in order.

The host-side stages (backend/pipeline.py) framed by what the console itself drives: the baseline
server before them, and serving with the drafter and benchmarking after.
"""
from __future__ import annotations

STAGES: tuple[str, ...] = ("serve", "generate", "extract", "train", "verify", "serve_drafter", "bench")
