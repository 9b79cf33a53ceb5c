"""A bench run as the console shows it: the side-by-side comparison from its finish summary (or, for a
run without one, its own levels), or how far it has got while it runs.

The summary comes from the host: it is read through the bench stage's own bounded reader
(backend.bench.compare.comparison_from_dict, one definition of the comparison's shape), and anything
that does not read is reported as the view's error instead of reaching the screen. Pure; no Textual.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from backend.bench.compare import MAX_ROWS, CompareError, Row, comparison_from_dict
from backend.bench.results import BenchResultError, LevelResult
from console.snapshot import RunInfo


@dataclass(frozen=True)
class BenchView:
    run_id: str
    state: str
    label: str | None = None
    baseline: str | None = None
    rows: tuple[Row, ...] = ()
    missing: tuple[str, ...] = ()
    done: int = 0
    total: int = 0
    level: int | None = None  # the concurrency level being measured
    error: str | None = None

    @property
    def slower(self) -> bool:
        return any(r.slower for r in self.rows)


def _own_rows(result: Any) -> tuple[Row, ...]:
    """A run without a comparison (a baseline): its levels, no ratios."""
    if not isinstance(result, dict) or not isinstance(result.get("levels"), list):
        return ()
    label = str(result.get("label") or "")[:40]
    rows = []
    for raw in result["levels"][:MAX_ROWS]:
        lv = LevelResult.from_dict(raw)
        acc = lv.acceptance
        rows.append(Row(concurrency=lv.concurrency, label=label, output_tps=lv.output_throughput, ratio=None,
                        slower=False, median_tpot_ms=lv.stat("tpot", "median"),
                        median_ttft_ms=lv.stat("ttft", "median"), acceptance_length=acc.length if acc else None,
                        acceptance_rate=acc.rate if acc else None, failed=lv.failed))
    return tuple(rows)


def bench_view(run: RunInfo) -> BenchView:
    event = run.last_event or {}
    base = BenchView(run_id=run.run_id, state=run.state, done=run.done, total=run.total)
    level = event.get("level")
    if isinstance(level, int) and not isinstance(level, bool):
        base = replace(base, level=level)
    if event.get("kind") != "finish":
        return base
    # the RunBook merges a finished run's summary into its last event (telemetry/runs.py); a finish event
    # as the stage wrote it holds it under "summary"
    summary = event.get("summary") if isinstance(event.get("summary"), dict) else event
    label = summary.get("label") if isinstance(summary.get("label"), str) else None
    error = summary.get("error") if isinstance(summary.get("error"), str) else None
    try:
        if isinstance(summary.get("comparison"), dict):
            cmp = comparison_from_dict(summary["comparison"])
            return replace(base, label=label, baseline=cmp.baseline, rows=cmp.rows, missing=cmp.missing,
                           error=error)
        return replace(base, label=label, rows=_own_rows(summary.get("result")), error=error)
    except (CompareError, BenchResultError, TypeError, ValueError) as exc:
        return replace(base, label=label, error=f"unreadable bench summary: {exc}")
