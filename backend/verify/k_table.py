"""Which K (draft tokens per step) pays, from the per-position acceptance verify measured.

Greedy chain drafting proposes the same first tokens whatever K is (each step reads only the draft's own
earlier states), so with K' <= K the chance that at least j+1 tokens are accepted is the measured
p_j = P(accepted >= j+1) for every j < K'. Hence the expected tokens per verifier step (vLLM's mean
acceptance length, the verifier's own token included):

    E[K'] = 1 + p_0 + ... + p_(K'-1)

One step costs the verifier's forward plus K' draft forwards: T_v + K'·T_d. With c = T_d / T_v (the draft's
cost relative to a verifier step), the throughput against no speculation is

    speedup(K') = E[K'] / (1 + K'·c)

and the recommended K is the one with the highest speedup (the smaller on a tie). This ignores what a
verifier step itself loses by checking K'+1 tokens instead of one (small while decoding is bound by
memory, not compute); a bench with the drafter measures the rest.

c comes from a bench (`draft_cost_from_bench`: the baseline's and the drafter's median time per output
token at the lowest concurrency, and the drafter's acceptance length there, at the K that bench served,
`served_k`: a bench of several K serves others than the trained one), else an assumption that the report
states.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ASSUMED_DRAFT_COST = 0.05  # one draft step against one verifier step: a 1-layer dense draft beside a large model


@dataclass(frozen=True)
class KRow:
    k: int
    expected_length: float  # mean acceptance length with k draft tokens
    speedup: float  # against no speculation, at the draft cost used


@dataclass(frozen=True)
class KTable:
    rows: tuple[KRow, ...]
    draft_cost: float
    cost_source: str  # where c came from, in words
    recommended: int  # 0: no K pays at this cost

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "draft_cost": self.draft_cost,
                "cost_source": self.cost_source, "recommended": self.recommended}


def expected_lengths(per_position: list[float]) -> list[float]:
    """E[K'] for K' = 1 .. len(per_position)."""
    out, total = [], 1.0
    for p in per_position:
        total += p
        out.append(total)
    return out


def k_table(per_position: list[float], draft_cost: float, cost_source: str) -> KTable:
    if draft_cost < 0:
        raise ValueError(f"draft cost must be >= 0, got {draft_cost}")
    rows = tuple(KRow(k=k, expected_length=round(e, 4), speedup=round(e / (1 + k * draft_cost), 4))
                 for k, e in enumerate(expected_lengths(per_position), start=1))
    best = max(rows, key=lambda r: (r.speedup, -r.k), default=None)
    recommended = best.k if best is not None and best.speedup > 1.0 else 0
    return KTable(rows=rows, draft_cost=draft_cost, cost_source=cost_source, recommended=recommended)


def _lowest_level(comparison: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the baseline's row, the first drafter's row with an acceptance) at the lowest concurrency level."""
    rows = [r for r in comparison.get("rows") or [] if isinstance(r, dict)]
    levels = sorted({r.get("concurrency") for r in rows if isinstance(r.get("concurrency"), int)})
    if not levels:
        return None, None
    at = [r for r in rows if r.get("concurrency") == levels[0]]
    base = next((r for r in at if r.get("ratio") is None), None)
    drafted = next((r for r in at if r.get("ratio") is not None and _pos(r.get("acceptance_length"))), None)
    return base, drafted


def served_k(comparison: dict[str, Any]) -> int | None:
    """The K the drafter of draft_cost_from_bench's row was served with, from its own counters: vLLM drafts
    K tokens per step, so draft tokens = K · drafts, and rate = accepted / draft tokens, length = 1 +
    accepted / drafts give K = (length - 1) / rate. None when it accepted nothing (no way to tell)."""
    _, drafted = _lowest_level(comparison)
    if drafted is None or not _pos(drafted.get("acceptance_rate")) or not drafted["acceptance_length"] > 1:
        return None
    k = (drafted["acceptance_length"] - 1) / drafted["acceptance_rate"]
    return round(k) if k >= 0.5 else None


def draft_cost_from_bench(comparison: dict[str, Any], k: int) -> float | None:
    """c from a bench comparison (backend/bench/compare.py's dict) of the baseline and a drafter served with
    `k` draft tokens: per step the drafter spends tpot_d · L ms for L tokens, and T_v + k·T_d = tpot_d · L with
    T_v = tpot_baseline, so c = (tpot_d · L / tpot_b - 1) / k. None when the bench lacks a figure."""
    base, drafted = _lowest_level(comparison)
    if k < 1 or base is None or drafted is None or not _pos(base.get("median_tpot_ms")) or not _pos(
            drafted.get("median_tpot_ms")):
        return None
    step = drafted["median_tpot_ms"] * drafted["acceptance_length"]
    return max(0.0, (step / base["median_tpot_ms"] - 1.0) / k)


def _pos(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def format_table(table: KTable) -> list[str]:
    lines = [f"K from evidence (draft step = {table.draft_cost:.3f} verifier steps, {table.cost_source}):", "",
             "  K   expected length   speedup vs no drafter"]
    for r in table.rows:
        mark = "  <- recommended" if r.k == table.recommended else ""
        lines.append(f"  {r.k:<3} {r.expected_length:<17.3f} {r.speedup:.3f}{mark}")
    if table.recommended == 0:
        lines.append("  no K pays at this draft cost: serve without this drafter")
    return lines
