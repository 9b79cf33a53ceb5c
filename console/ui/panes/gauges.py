"""Pure text renderers for bars, sparklines and human-readable numbers (no widgets, easy to test)."""
from __future__ import annotations

import math
from typing import Iterable

_EIGHTHS = " ▏▎▍▌▋▊▉"
_SPARKS = "▁▂▃▄▅▆▇█"


def bar(fraction: float | None, width: int) -> str:
    """A bar `width` cells wide in 1/8-cell steps (nvitop style); padded with spaces to `width`."""
    if width <= 0:
        return ""
    if fraction is None or math.isnan(fraction):
        return " " * width
    eighths = round(min(max(fraction, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_EIGHTHS[part] if part else "")
    return text.ljust(width)


def level_colour(fraction: float | None, low: float = 0.10, high: float = 0.80) -> str:
    """Green below `low`, yellow up to `high`, red above: the thresholds nvitop uses for memory."""
    if fraction is None:
        return "dim"
    if fraction < low:
        return "green"
    if fraction < high:
        return "yellow"
    return "red"


def sparkline(values: Iterable[float | None], width: int, top: float = 100.0) -> str:
    """The last `width` values as block heights scaled to `top`; missing values are blanks."""
    vals = list(values)[-width:] if width > 0 else []
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        else:
            idx = int(min(max(v / top, 0.0), 1.0) * (len(_SPARKS) - 1) + 0.5)
            out.append(_SPARKS[idx])
    return "".join(out).rjust(width) if width > 0 else ""


def human_bytes(n: float | int | None) -> str:
    if n is None:
        return "N/A"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def duration(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return "N/A"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"


def pct(part: float | None, whole: float | None) -> str:
    if part is None or not whole:
        return "N/A"
    return f"{100.0 * part / whole:.1f}%"


def num(value: object, fmt: str = "{}", missing: str = "N/A") -> str:
    if value is None:
        return missing
    try:
        return fmt.format(value)
    except (TypeError, ValueError):  # a string from the host where a number belongs: no reading
        return missing
