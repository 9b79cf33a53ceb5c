"""verify's report as a table (pure): printed by the stage on the host, and by `run verify --wait` and
`run pipeline --wait` on the operator's side from the finish event.

The operator's side reads the report back from the host's events, so the table takes any JSON object:
a field of the wrong type reads as missing, and the draft positions shown are at most K_MAX (a finish
with `"k": 1000000000` would otherwise build a gigabyte line and hang whoever prints it)."""
from __future__ import annotations

from typing import Any

from backend.contract.numbers import count, finite

# The most draft positions a report shows: the profile's num_speculative_tokens is at most this.
K_MAX = 32


def draft_positions(acc: dict[str, Any]) -> int:
    """How many draft positions of an acceptance report to show: its `k`, at most K_MAX."""
    return min(count(acc.get("k")), K_MAX)


def _cell(value: Any, fmt: str, width: int = 0) -> str:
    number = finite(value)
    return f"{number:{fmt}}" if number is not None else f"{'N/A':<{width}}"


def table(report: dict[str, Any]) -> str:
    checks = [c for c in report.get("checks") or [] if isinstance(c, dict)]
    lines = [f"verify: {report.get('checkpoint')}", ""]
    width = max(len(str(c.get("name"))) for c in checks) if checks else 5
    for c in checks:
        lines.append(f"  {str(c.get('name')):<{width}}  {'ok  ' if c.get('ok') is True else 'FAIL'}  "
                     f"{c.get('detail')}" + (f"\n  {'':<{width}}        -> {c['fix']}" if c.get("fix") else ""))
    acc = report.get("acceptance")
    if isinstance(acc, dict) and acc:
        k = draft_positions(acc)
        trained, base = (acc.get(n) if isinstance(acc.get(n), dict) else {} for n in ("trained", "untrained"))
        lines += ["", f"offline acceptance, k={k}: {trained.get('samples')} held-out samples, "
                      f"{trained.get('anchors')} anchor positions (greedy chain)", ""]
        head = "".join(f"  pos{j + 1:<4}" for j in range(k))
        lines.append(f"  {'draft':<16}{head}  mean accepted  acceptance length")
        for name, a in (("trained", trained), ("untrained", base)):
            positions = a.get("per_position") if isinstance(a.get("per_position"), list) else []
            cells = "".join(f"  {_cell(p, '<7.3f', 7)}" for p in positions[:k])
            lines.append(f"  {name:<16}{cells}  {_cell(a.get('mean_accepted'), '<13.3f', 13)}  "
                         f"{_cell(a.get('mean_acceptance_length'), '.3f')}")
    k_table = read_k_table(report.get("k_table"))
    if k_table is not None:
        from backend.verify.k_table import format_table

        lines += ["", *format_table(k_table)]
    warnings = report.get("warnings")
    lines += [f"warning: {w}" for w in (warnings if isinstance(warnings, list) else [])[:8] if isinstance(w, str)]
    lines += online_lines(report)
    if report.get("error"):
        lines += ["", f"error: {report['error']}"]
    return "\n".join(lines)


def online_lines(report: dict[str, Any]) -> list[str]:
    """The prediction beside vLLM's count (the report's `online`, a bench of this checkpoint), with the gap
    and its tolerance (backend/kit/acceptance_gap.py); none when no bench counted it at this K."""
    from backend.kit.acceptance_gap import gap_of_count, reported_count

    found = reported_count(report)
    gap = gap_of_count(report, found[:2]) if found is not None else None
    if gap is None or found is None:
        return []
    return ["", *gap.lines(str(report.get("run_id"))[:80], found[2])]


def read_k_table(data: Any) -> Any:
    """The report's K table (backend/verify/k_table.py) read back as untrusted JSON: rows with finite numbers,
    at most K_MAX of them; None when there is nothing usable."""
    from backend.verify.k_table import KRow, KTable

    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        return None
    rows = []
    for r in data["rows"][:K_MAX]:
        if isinstance(r, dict) and count(r.get("k")) > 0 and finite(r.get("expected_length")) is not None \
                and finite(r.get("speedup")) is not None:
            rows.append(KRow(k=count(r.get("k")), expected_length=finite(r["expected_length"]),
                             speedup=finite(r["speedup"])))
    cost = finite(data.get("draft_cost"))
    if not rows or cost is None:
        return None
    return KTable(rows=tuple(rows), draft_cost=cost, cost_source=str(data.get("cost_source"))[:120],
                  recommended=min(count(data.get("recommended")), K_MAX))
