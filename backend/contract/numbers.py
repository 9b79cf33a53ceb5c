"""Numbers read from files and answers another program wrote: finite, of the right kind, or nothing.

JSON and the Prometheus text format both carry NaN and infinities (`NaN`, `1e999`, `+Inf`), and a foreign
or hostile writer can put a string, a null or a 400-digit integer where a count belongs. Every place that
turns such a value into an int or a float goes through these, so a bad value becomes "no reading" for
that one field instead of an exception that stops whoever was reading (the console, a stage program).
"""
from __future__ import annotations

import math
from typing import Any

# Beyond any count a stage reports (records, steps, bytes); a bigger integer is not a reading but a
# hostile or broken writer, and would overflow a float in an ETA or a rate.
COUNT_MAX = 10**15


def finite(value: Any) -> float | None:
    """`value` as a float when it is a finite JSON number (never a bool, a string or NaN), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) <= COUNT_MAX else None
    return value if math.isfinite(value) else None


def whole(value: Any) -> int | None:
    """`value` as an int when it is a finite number within +-COUNT_MAX (a float is truncated), else None."""
    number = finite(value)
    if number is None or abs(number) > COUNT_MAX:
        return None
    return value if isinstance(value, int) else int(number)


def count(value: Any, default: int = 0) -> int:
    """A non-negative count: `value` when it is one, else `default`."""
    number = whole(value)
    return number if number is not None and number >= 0 else default
