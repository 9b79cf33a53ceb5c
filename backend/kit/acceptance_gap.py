"""Offline against online acceptance: what the verify stage predicted for a drafter next to what vLLM counted
while the bench decoded with it (same drafter, same K, the same held-out prompts: the bench's workload is the
prepare run's held-out rows, which verify measures too).

Offline: verify's greedy-chain acceptance on the held-out rows (backend/drafter/acceptance.py), per position
the share of anchors whose first i draft tokens were all accepted. Online: vLLM's spec-decode counters over
the bench's windows, pooled over its concurrency levels, per position accepted-at-i / drafts, which is the
same cumulative quantity. Both lengths are 1 + mean accepted per draft. Pure; reads host data defensively.

Where the count comes from: a bench pair of the verified checkpoint (its summary names the checkpoint and its
drafter bench runs; backend/benchpair.py). The verify stage puts the newest such bench's count in its report
(`online`, when a bench of the checkpoint ran before it: backend/verify/online.py); the console finds the
newest bench of the checkpoint in its run book (console/telemetry/bench_view.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from backend.contract.numbers import count, finite


class Counters(Protocol):
    """A bench level's window of vLLM's spec-decode counters (backend/bench/results.py's Acceptance)."""
    @property
    def drafts(self) -> float: ...

    @property
    def accepted(self) -> float: ...

    @property
    def per_position(self) -> Sequence[float]: ...


class Level(Protocol):
    """A bench level (backend/bench/results.py's LevelResult): its counters' window, if it had a drafter."""
    @property
    def acceptance(self) -> Counters | None: ...


@dataclass(frozen=True)
class _Window:
    drafts: float
    accepted: float
    per_position: tuple[float, ...]


@dataclass(frozen=True)
class _Level:
    acceptance: _Window | None


def levels_from_json(raw: Any, limit: int = 64) -> list[Level]:
    """A bench result's `levels` as host data (bench.json / the summary's `result`): each level's counters
    with finite numbers, or none; anything else reads as no level."""
    out: list[Level] = []
    for lv in raw[:limit] if isinstance(raw, list) else ():
        acc = lv.get("acceptance") if isinstance(lv, dict) else None
        per = acc.get("per_position") if isinstance(acc, dict) else None
        if not isinstance(acc, dict) or not isinstance(per, list):
            out.append(_Level(None))
            continue
        drafts, accepted = finite(acc.get("drafts")), finite(acc.get("accepted"))
        values = [finite(p) for p in per[:64]]
        ok = drafts is not None and accepted is not None and all(v is not None for v in values)
        out.append(_Level(_Window(drafts or 0.0, accepted or 0.0, tuple(v or 0.0 for v in values)) if ok else None))
    return out


# The gap a drafter may show between verify's prediction and vLLM's count and still be called served as
# verified. Offline (verify) predicts the length from teacher-forced greedy chains over the generated answers
# (sampled at the profile's temperature); vLLM counts it over its own continuations of the same held-out
# prompts, cut at the bench's output length: different token streams, and on the demo only a few hundred
# anchors/drafts on either side. Two recorded runs on vLLM's CPU build (4 held-out prompts, K=3) gave gaps of
# +0.35 (1.67 predicted, 1.32 counted) and +0.01 (1.36, 1.35); 0.6 of a length (the range at K=3 is 1..4)
# holds that with room for the noise of 4 prompts, and still fails a prediction off by a whole accepted
# token or a drafter vLLM cannot use. The engine tier asserts it (tests/test_engine_pipeline.py).
GAP_TOLERANCE = 0.6


@dataclass(frozen=True)
class Side:
    length: float
    per_position: tuple[float, ...]


@dataclass(frozen=True)
class AcceptanceGap:
    k: int
    offline: Side  # the verify stage's prediction
    online: Side  # vLLM's count
    drafts: int  # how many drafts vLLM counted (the online figure's weight)

    @property
    def gap(self) -> float:
        """Predicted minus counted acceptance length."""
        return self.offline.length - self.online.length

    @property
    def tolerance(self) -> float:
        return GAP_TOLERANCE

    @property
    def within(self) -> bool:
        return abs(self.gap) <= self.tolerance

    def verdict(self) -> str:
        return (f"within the tolerance of ±{self.tolerance:.2f}" if self.within
                else f"OUTSIDE the tolerance of ±{self.tolerance:.2f}: the drafter serves unlike it verified")

    def lines(self, verify_run: str, bench_run: str | None = None) -> list[str]:
        def pos(s: Side) -> str:
            return " ".join(f"{p:.3f}" for p in s.per_position)
        bench = f"bench {bench_run}, " if bench_run else ""
        return [f"acceptance at k={self.k}, offline (verify {verify_run}) vs online (vLLM's counters, "
                f"{bench}{self.drafts} drafts):",
                f"  predicted length {self.offline.length:.2f}  per position {pos(self.offline)}",
                f"  vLLM counted     {self.online.length:.2f}  per position {pos(self.online)}",
                f"  gap (predicted - counted) {self.gap:+.2f}, {self.verdict()}"]


def predicted(verify_summary: Any) -> Side | None:
    """The trained draft's offline acceptance from a verify summary (its `acceptance.trained`)."""
    acc = verify_summary.get("acceptance") if isinstance(verify_summary, dict) else None
    trained = acc.get("trained") if isinstance(acc, dict) else None
    if not isinstance(trained, dict):
        return None
    length, per = finite(trained.get("mean_acceptance_length")), trained.get("per_position")
    if length is None or not isinstance(per, list):
        return None
    values = tuple(finite(p) for p in per[:64])
    return None if any(v is None for v in values) else Side(length, tuple(v for v in values if v is not None))


def counted(levels: Sequence[Level]) -> tuple[Side, int] | None:
    """vLLM's acceptance pooled over the bench's levels (each a window of its counters)."""
    drafts = accepted = 0.0
    per: list[float] = []
    for lv in levels:
        a = lv.acceptance
        if a is None or a.drafts <= 0:
            continue
        drafts += a.drafts
        accepted += a.accepted
        if len(per) < len(a.per_position):
            per += [0.0] * (len(a.per_position) - len(per))
        for i, p in enumerate(a.per_position):
            per[i] += p * a.drafts
    if drafts <= 0:
        return None
    return Side(1.0 + accepted / drafts, tuple(p / drafts for p in per)), int(drafts)


def drafter_run_id(pair_summary: Any, k: int) -> str | None:
    """The pair's bench of our drafter at K: `drafter` (one K benched) or `drafter_k<K>` (several)."""
    runs = pair_summary.get("runs") if isinstance(pair_summary, dict) else None
    if not isinstance(runs, dict):
        return None
    found = runs.get(f"drafter_k{k}") or runs.get("drafter")
    return found if isinstance(found, str) else None


def online_record(levels: Sequence[Level], bench_run: str, drafter_run: str) -> dict[str, Any] | None:
    """vLLM's count as the verify report keeps it (`online`); None when the bench counted no drafts."""
    on = counted(levels)
    if on is None:
        return None
    side, drafts = on
    return {"bench_run": bench_run, "drafter_run": drafter_run, "k": len(side.per_position),
            "mean_acceptance_length": round(side.length, 4),
            "per_position": [round(p, 4) for p in side.per_position], "drafts": drafts}


def reported_count(verify_summary: Any) -> tuple[Side, int, str] | None:
    """A verify report's `online` (online_record) read back as host data: (count, drafts, bench run)."""
    raw = verify_summary.get("online") if isinstance(verify_summary, dict) else None
    if not isinstance(raw, dict) or not isinstance(raw.get("per_position"), list):
        return None
    length, drafts, bench = finite(raw.get("mean_acceptance_length")), count(raw.get("drafts")), raw.get("bench_run")
    values = tuple(finite(p) for p in raw["per_position"][:64])
    if length is None or drafts <= 0 or not isinstance(bench, str) or any(v is None for v in values):
        return None
    return Side(length, tuple(v for v in values if v is not None)), drafts, bench[:80]


def acceptance_gap(verify_summary: Any, levels: Sequence[Level]) -> AcceptanceGap | None:
    """None unless both sides exist at the same K (a bench at another K than verify's says nothing here)."""
    return gap_of_count(verify_summary, counted(levels))


def gap_of_count(verify_summary: Any, on: tuple[Side, int] | None) -> AcceptanceGap | None:
    """verify's prediction against a count already pooled (counted, or a report's reported_count)."""
    off = predicted(verify_summary)
    k = count(verify_summary.get("k")) if isinstance(verify_summary, dict) else 0
    if off is None or on is None or not k or len(off.per_position) != k or len(on[0].per_position) != k:
        return None
    return AcceptanceGap(k=k, offline=off, online=on[0], drafts=on[1])
