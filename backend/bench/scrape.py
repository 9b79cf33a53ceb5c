"""vLLM's speculative-decoding counters from /metrics, and acceptance over the window between two scrapes.

Host code cannot lean on the console's Prometheus parser (nor on prometheus_client being installed
there), so this reads the four counter families line by line, as `vllm bench serve` does itself: sample
names ending in `_total` (the `_created` timestamps are skipped), summed over engines, optionally for
one `model_name`. Definitions are vLLM's (vllm/benchmarks/serve.py and its SpecDecoding log line):
acceptance rate = accepted / draft tokens; mean acceptance length = 1 + accepted / drafts (the
verifier's own token counts too); per position i = accepted at i / drafts.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
MAX_POSITIONS = 64  # a label value beyond this is not a draft position anyone runs


@dataclass(frozen=True)
class SpecCounters:
    """The spec-decode counters of one scrape (summed over engines)."""
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: dict[int, float] = field(default_factory=dict)


def parse_spec_counters(text: str, model_name: str | None = None) -> SpecCounters | None:
    """The counters in a /metrics page; None when the server has no drafter (no such family)."""
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    per_pos: dict[int, float] = {}
    found = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("vllm:spec_decode_"):
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        name = line[:name_end]
        if name not in totals and name != ACCEPTED_PER_POS:
            continue
        labels: dict[str, str] = {}
        rest = line[name_end:]
        if rest.startswith("{"):
            close = rest.rfind("}")
            if close < 0:
                continue
            labels = dict(_LABEL.findall(rest[1:close]))
            rest = rest[close + 1:]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if value != value or value < 0:  # NaN or nonsense: no reading
            continue
        if model_name is not None and labels.get("model_name", model_name) != model_name:
            continue
        found = True
        if name == ACCEPTED_PER_POS:
            try:
                pos = int(labels.get("position", ""))
            except ValueError:
                continue
            if 0 <= pos < MAX_POSITIONS:
                per_pos[pos] = per_pos.get(pos, 0.0) + value
        else:
            totals[name] += value
    if not found:
        return None
    return SpecCounters(drafts=totals[DRAFTS], draft_tokens=totals[DRAFT_TOKENS], accepted=totals[ACCEPTED],
                        per_pos=per_pos)


@dataclass(frozen=True)
class Acceptance:
    """Speculative decoding over one window: what the drafter's proposals were worth."""
    drafts: float
    draft_tokens: float
    accepted: float
    rate: float | None  # accepted / draft tokens, 0..1
    length: float  # mean acceptance length: 1 + accepted / drafts
    per_position: tuple[float, ...]  # accepted at position i / drafts

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["per_position"] = list(self.per_position)
        return out


def acceptance_between(before: SpecCounters | None, after: SpecCounters | None) -> Acceptance | None:
    """Acceptance over (before, after]; None without a drafter, or when nothing was drafted between. A
    counter that went down means the server restarted in between: the window is then unknowable."""
    if after is None:
        return None
    base = before or SpecCounters()
    drafts = after.drafts - base.drafts
    draft_tokens = after.draft_tokens - base.draft_tokens
    accepted = after.accepted - base.accepted
    if drafts <= 0 or draft_tokens < 0 or accepted < 0:
        return None
    positions = sorted(set(base.per_pos) | set(after.per_pos))
    per_pos = tuple(max(0.0, after.per_pos.get(p, 0.0) - base.per_pos.get(p, 0.0)) / drafts for p in positions)
    return Acceptance(drafts=drafts, draft_tokens=draft_tokens, accepted=accepted,
                      rate=accepted / draft_tokens if draft_tokens > 0 else None,
                      length=1.0 + accepted / drafts, per_position=per_pos)
