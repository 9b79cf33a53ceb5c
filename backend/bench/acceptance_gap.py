"""Offline against online acceptance: what the verify stage predicted for a drafter next to what vLLM counted
while the bench decoded with it (same drafter, same K, the same held-out prompts: the bench's workload is the
prepare run's held-out rows, which verify measures too).

Offline: verify's greedy-chain acceptance on the held-out rows (backend/drafter/acceptance.py), per position
the share of anchors whose first i draft tokens were all accepted. Online: vLLM's spec-decode counters over
the bench's windows, pooled over its concurrency levels, per position accepted-at-i / drafts, which is the
same cumulative quantity. Both lengths are 1 + mean accepted per draft. Pure; reads host data defensively.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from backend.bench.results import LevelResult
from backend.contract.numbers import count, finite


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

    def lines(self, verify_run: str) -> list[str]:
        def pos(s: Side) -> str:
            return " ".join(f"{p:.3f}" for p in s.per_position)
        return [f"acceptance at k={self.k}, offline (verify {verify_run}) vs online (vLLM's counters, "
                f"{self.drafts} drafts):",
                f"  predicted length {self.offline.length:.2f}  per position {pos(self.offline)}",
                f"  vLLM counted     {self.online.length:.2f}  per position {pos(self.online)}",
                f"  gap (predicted - counted) {self.gap:+.2f}"]


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


def counted(levels: Sequence[LevelResult]) -> tuple[Side, int] | None:
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


def acceptance_gap(verify_summary: Any, levels: Sequence[LevelResult]) -> AcceptanceGap | None:
    """None unless both sides exist at the same K (a bench at another K than verify's says nothing here)."""
    off, on = predicted(verify_summary), counted(levels)
    k = count(verify_summary.get("k")) if isinstance(verify_summary, dict) else 0
    if off is None or on is None or not k or len(off.per_position) != k or len(on[0].per_position) != k:
        return None
    return AcceptanceGap(k=k, offline=off, online=on[0], drafts=on[1])
