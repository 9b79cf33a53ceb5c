"""vLLM's own count of a drafter's acceptance, for the verify report beside its prediction: from the newest
completed bench pair of the same checkpoint (backend/benchpair.py: its summary names the checkpoint and its
drafter bench runs), the drafter bench at the verified K. None when no such bench has run (the pipeline
verifies before it benches: the console then finds the bench in its run book, console/telemetry/bench_view.py).
Reads host files defensively: a bench that does not read is no count, never an error of the verify run.
"""
from __future__ import annotations

import os
from typing import Any

from backend.contract.lookup import CompletedRun, InputError, completed_run, latest_completed
from backend.contract.stages import BENCH, BENCH_PAIR
from backend.kit.acceptance_gap import Level, drafter_run_id, levels_from_json, online_record

MAX_LEVELS = 64


def _levels(run: CompletedRun) -> list[Level]:
    result = run.summary.get("result")
    return levels_from_json(result.get("levels") if isinstance(result, dict) else None, MAX_LEVELS)


def vllm_count(work_dir: str, checkpoint: str, k: int) -> dict[str, Any] | None:
    """The report's `online` (acceptance_gap.online_record) from the newest bench pair of `checkpoint` whose
    drafter bench counted drafts at K; None when there is none."""
    want = os.path.realpath(checkpoint)
    found: list[dict[str, Any]] = []

    def counted_here(pair: CompletedRun) -> bool:
        ckpt = pair.summary.get("checkpoint")
        drafter = drafter_run_id(pair.summary, k)
        if not isinstance(ckpt, str) or os.path.realpath(ckpt) != want or drafter is None:
            return False
        try:
            bench = completed_run(work_dir, drafter, BENCH)
        except (InputError, OSError):
            return False
        record = online_record(_levels(bench), pair.run_id, drafter)
        if record is None or record["k"] != k:
            return False
        found.append(record)
        return True

    try:
        latest_completed(work_dir, BENCH_PAIR, counted_here)
    except (InputError, OSError):
        return None
    return found[-1] if found else None
