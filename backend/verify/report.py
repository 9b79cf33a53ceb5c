"""verify's report as a table (pure): printed by the stage on the host, and by `run verify --wait` and
`run pipeline --wait` on the operator's side from the finish event."""
from __future__ import annotations

from typing import Any


def table(report: dict[str, Any]) -> str:
    lines = [f"verify: {report['checkpoint']}", ""]
    width = max(len(c["name"]) for c in report["checks"]) if report["checks"] else 5
    for c in report["checks"]:
        lines.append(f"  {c['name']:<{width}}  {'ok  ' if c['ok'] else 'FAIL'}  {c['detail']}"
                     + (f"\n  {'':<{width}}        -> {c['fix']}" if c.get("fix") else ""))
    acc = report.get("acceptance")
    if acc:
        k = acc["k"]
        trained, base = acc["trained"], acc["untrained"]
        lines += ["", f"offline acceptance, k={k}: {trained['samples']} held-out samples, {trained['anchors']} "
                      f"anchor positions (greedy chain)", ""]
        head = "".join(f"  pos{j + 1:<4}" for j in range(k))
        lines.append(f"  {'draft':<16}{head}  mean accepted  acceptance length")
        for name, a in (("trained", trained), ("untrained", base)):
            cells = "".join(f"  {p:<7.3f}" for p in a["per_position"])
            lines.append(f"  {name:<16}{cells}  {a['mean_accepted']:<13.3f}  {a['mean_acceptance_length']:.3f}")
    if isinstance(report.get("k_table"), dict):
        from backend.verify.k_table import KRow, KTable, format_table

        t = report["k_table"]
        table_ = KTable(rows=tuple(KRow(**r) for r in t["rows"]), draft_cost=t["draft_cost"],
                        cost_source=t["cost_source"], recommended=t["recommended"])
        lines += ["", *format_table(table_)]
    if report.get("error"):
        lines += ["", f"error: {report['error']}"]
    return "\n".join(lines)
