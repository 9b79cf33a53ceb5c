"""Clean every string of a snapshot where it is made: the boundary where remote text enters the model.

Log lines, root causes, model ids, error messages, GPU names and run ids all come from the host or its
server; whatever they contain (escape sequences, control characters, megabytes), what leaves the
collector is plain, bounded text (console/parsers/text.py), and every float is finite (NaN and
infinities are not JSON: `status --json` stays JSON). The walk is generic so that a field added later is
covered without anyone remembering to.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeVar

from console.parsers.text import clean

T = TypeVar("T")
# a snapshot holds a run's last event three levels down (runs, the RunInfo, last_event), and a bench event's
# per-position acceptance (result, levels, a level, acceptance, per_position) six below that; deeper is not
# worth showing
MAX_DEPTH = 12


def sanitized(value: T, _depth: int = 0) -> T:
    if isinstance(value, str):
        return clean(value)  # type: ignore[return-value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # type: ignore[return-value]  # NaN and infinities are not JSON: no reading
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if _depth >= MAX_DEPTH:
        return None  # type: ignore[return-value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name)
            new = sanitized(old, _depth + 1)
            if new is not old:
                changes[f.name] = new
        return dataclasses.replace(value, **changes) if changes else value  # type: ignore[return-value]
    if isinstance(value, dict):
        return {clean(k, 200): sanitized(v, _depth + 1) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, (list, tuple)):
        items = [sanitized(v, _depth + 1) for v in value]
        return type(value)(items) if isinstance(value, tuple) else items  # type: ignore[return-value]
    return clean(repr(value))  # type: ignore[return-value]
