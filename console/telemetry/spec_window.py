"""Speculative decoding over the window between two /metrics scrapes (the parser reads one scrape,
console/parsers/metrics.py; this compares two).

The arithmetic is the bench's own (backend/bench/scrape.py: acceptance_between), one definition for the
console's gauges and the bench's table.
"""
from __future__ import annotations

from backend.bench.scrape import SpecCounters, acceptance_between
from console.parsers.metrics import SpecWindow, VllmMetrics


def spec_decode_window(prev: VllmMetrics | None, cur: VllmMetrics) -> SpecWindow | None:
    """Acceptance over (prev, cur]; None without a drafter or when nothing was drafted in between.

    Counters that went down mean the server restarted: the window is then everything since restart.
    """
    if cur is None or cur.spec_drafts is None or cur.spec_draft_tokens is None:
        return None
    base = prev if prev is not None and prev.spec_drafts is not None else None
    if base is not None and (cur.spec_drafts < base.spec_drafts
                             or (cur.spec_draft_tokens or 0) < (base.spec_draft_tokens or 0)):
        base = None
    a = acceptance_between(_counters(base) if base else None, _counters(cur))
    if a is None:
        return None
    return SpecWindow(drafts=a.drafts, draft_tokens=a.draft_tokens, accepted_tokens=a.accepted,
                      acceptance_rate=a.rate, mean_acceptance_length=a.length, per_position=a.per_position)


def _counters(m: VllmMetrics) -> SpecCounters:
    return SpecCounters(drafts=m.spec_drafts or 0.0, draft_tokens=m.spec_draft_tokens or 0.0,
                        accepted=m.spec_accepted_tokens or 0.0, per_pos=dict(m.spec_accepted_per_pos))
