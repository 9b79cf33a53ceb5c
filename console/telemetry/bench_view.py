"""A bench run as the console shows it: the side-by-side comparison from its finish summary (or, for a
run without one, its own levels), or how far it has got while it runs.

The summary comes from the host: it is read through the bench stage's own bounded reader
(backend.bench.compare.comparison_from_dict, one definition of the comparison's shape), and anything
that does not read is reported as the view's error instead of reaching the screen. Pure; no Textual.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from backend.bench import PAIR_STAGE
from backend.bench.compare import MAX_LABEL, MAX_ROWS, CompareError, Row, comparison_from_dict, reference_from_dict
from backend.kit.acceptance_gap import (AcceptanceGap, acceptance_gap, drafter_run_id, gap_of_count,
                                         reported_count)
from backend.bench.results import BenchResultError, LevelResult
from backend.contract.numbers import count, finite
from backend.verify.report import K_MAX
from console.snapshot import RunInfo


@dataclass(frozen=True)
class BestK:
    """A bench of several K: the one with the highest mean speed-up over the levels (backend/benchpair.py)."""
    k: int
    label: str
    speedup: float
    acceptance_length: float | None
    slower: bool

    def line(self) -> str:
        acc = f", acceptance length {self.acceptance_length:.2f}" if self.acceptance_length is not None else ""
        verdict = ": SLOWER than the baseline at some level, do not serve it" if self.slower else ""
        return f"best K: {self.k} ({self.label}, {self.speedup:.2f}x mean speed-up over the levels{acc}){verdict}"


def best_k_of(summary: Any) -> BestK | None:
    """The summary's best_k, read as host data (types checked, sizes bounded); None when absent or odd."""
    raw = summary.get("best_k") if isinstance(summary, dict) else None
    if not isinstance(raw, dict):
        return None
    k, speedup, label = count(raw.get("k")), finite(raw.get("speedup")), raw.get("label")
    if not 1 <= k <= K_MAX or speedup is None or not isinstance(label, str):
        return None
    return BestK(k=k, label=label[:MAX_LABEL], speedup=speedup, acceptance_length=finite(raw.get("acceptance_length")),
                 slower=raw.get("slower") is True)


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
    best: BestK | None = None  # several K benched: the best of them
    notes: tuple[str, ...] = ()  # the reference line, the reasoning/answer split, the self-test (summary_notes)

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


def finish_summary(event: Any) -> dict[str, Any]:
    """A finished run's summary: the RunBook merges it into the run's last event (telemetry/runs.py); a
    finish event as the stage wrote it holds it under "summary"."""
    if not isinstance(event, dict):
        return {}
    return event["summary"] if isinstance(event.get("summary"), dict) else event


def _length(value: Any) -> float | None:
    v = finite(value)
    return v if v is not None and 1 <= v <= K_MAX + 1 else None


def summary_notes(summary: Any) -> tuple[str, ...]:
    """What a bench (or a pair, for our drafter) said beyond the table, rebuilt from its numbers (host data:
    types and ranges checked, labels cut): the reference line, acceptance by phase, the self-test."""
    if not isinstance(summary, dict):
        return ()
    out: list[str] = []
    raw = summary.get("reference")
    ref = reference_from_dict(raw)
    if ref is not None and isinstance(raw, dict):
        label = str(raw["label"]) if isinstance(raw.get("label"), str) else "drafter"
        k = count(raw.get("measured_k")) or None
        out.append(ref.line(label[:MAX_LABEL], _length(raw.get("measured")), k if k and k <= K_MAX else None))
    ph = summary.get("phases")
    if isinstance(ph, dict):
        label = str(ph["label"]) if isinstance(ph.get("label"), str) else "drafter"
        sides = []
        for name in ("reasoning", "answer"):
            side = ph.get(name)
            length = _length(side.get("length")) if isinstance(side, dict) else None
            drafts = count(side.get("drafts")) if isinstance(side, dict) else 0
            sides.append(f"{name} {length:.2f} ({drafts} drafts)" if length is not None else f"{name} -")
        requests, spill = count(ph.get("requests")), count(ph.get("spill"))
        out.append(f"acceptance by phase ({label[:MAX_LABEL]}, {requests} requests one at a time): "
                   f"{', '.join(sides)}; up to {spill} answer steps counted as reasoning")
    st = summary.get("self_test")
    if isinstance(st, dict) and _length(st.get("set")) is not None:
        read = _length(st.get("read"))
        verdict = "ok" if st.get("ok") is True else "FAILED"
        out.append(f"self-test: set {_length(st.get('set')):.2f}, read "
                   f"{'nothing' if read is None else format(read, '.2f')}: {verdict}")
    return tuple(out)


def bench_view(run: RunInfo) -> BenchView:
    event = run.last_event or {}
    base = BenchView(run_id=run.run_id, state=run.state, done=run.done, total=run.total)
    level = event.get("level")
    if isinstance(level, int) and not isinstance(level, bool):
        base = replace(base, level=level)
    if event.get("kind") != "finish":
        return base
    summary = finish_summary(event)
    label = summary.get("label") if isinstance(summary.get("label"), str) else None
    error = summary.get("error") if isinstance(summary.get("error"), str) else None
    try:
        if isinstance(summary.get("comparison"), dict):
            cmp = comparison_from_dict(summary["comparison"])
            return replace(base, label=label, baseline=cmp.baseline, rows=cmp.rows, missing=cmp.missing,
                           error=error, best=best_k_of(summary), notes=summary_notes(summary))
        return replace(base, label=label, rows=_own_rows(summary.get("result")), error=error,
                       notes=summary_notes(summary))
    except (CompareError, BenchResultError, TypeError, ValueError) as exc:
        return replace(base, label=label, error=f"unreadable bench summary: {exc}")


def _drafter_levels(summary: dict[str, Any], k: int, runs: Sequence[RunInfo]) -> list[LevelResult] | None:
    """The levels of a finished pair's bench of our drafter at K (one K benched: "drafter"; several:
    "drafter_k<K>"), read from the run book; None when that bench is not there or does not read."""
    drafter_id = drafter_run_id(summary, k)
    drafter = next((r for r in runs if r.run_id == drafter_id and r.state == "done"), None)
    if drafter is None:
        return None
    result = finish_summary(drafter.last_event).get("result")
    raw = result.get("levels") if isinstance(result, dict) else None
    if not isinstance(raw, list):
        return None
    try:
        return [LevelResult.from_dict(x) for x in raw[:MAX_ROWS]]
    except (BenchResultError, TypeError, ValueError):
        return None


def gap_of(summary: Any, runs: Sequence[RunInfo]) -> tuple[str, AcceptanceGap] | None:
    """A finished bench pair's offline-vs-online acceptance: the drafter bench run's levels (vLLM's counts)
    next to the completed verify run that verified the benched checkpoint (its prediction at the same K).
    None when either is missing among `runs` (the console's run book) or the K differ."""
    if not isinstance(summary, dict) or not isinstance(summary.get("runs"), dict):
        return None
    checkpoint = summary.get("checkpoint")
    verified = [r for r in runs if r.stage == "verify" and r.state == "done"
                and isinstance(r.last_event, dict) and r.last_event.get("checkpoint") == checkpoint]
    if not verified or not isinstance(checkpoint, str):
        return None
    verify = max(verified, key=lambda r: r.started or 0)
    levels = _drafter_levels(summary, count((verify.last_event or {}).get("k")), runs)
    gap = acceptance_gap(verify.last_event, levels) if levels is not None else None
    return (verify.run_id, gap) if gap is not None else None


def counted_for(verify: RunInfo, runs: Sequence[RunInfo]) -> tuple[str, AcceptanceGap] | None:
    """A finished verify run's prediction beside vLLM's count of the same checkpoint at the same K: the
    newest finished bench pair of that checkpoint in the run book, else the count its report carries (a
    bench that ran before it, backend/verify/online.py). (the bench pair's run id, the gap), or None."""
    event = verify.last_event if isinstance(verify.last_event, dict) else {}
    checkpoint, k = event.get("checkpoint"), count(event.get("k"))
    if verify.state != "done" or not isinstance(checkpoint, str) or not k:
        return None
    pairs = sorted((r for r in runs if r.stage == PAIR_STAGE and r.state == "done"
                    and finish_summary(r.last_event).get("checkpoint") == checkpoint),
                   key=lambda r: r.started or 0, reverse=True)
    for pair in pairs:
        levels = _drafter_levels(finish_summary(pair.last_event), k, runs)
        gap = acceptance_gap(event, levels) if levels is not None else None
        if gap is not None:
            return pair.run_id, gap
    reported = reported_count(event)
    gap = gap_of_count(event, reported[:2]) if reported is not None else None
    return (reported[2], gap) if gap is not None and reported is not None else None
