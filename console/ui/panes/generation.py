"""Data generation progress, from the newest "generate" run's latest progress event."""
from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.content import Content

from console.telemetry.snapshot import RunInfo, Snapshot
from console.ui.panes.base import Pane, Text, lines, markup
from console.ui.panes.gauges import bar, duration, human_bytes, num, pct

_FREE_DISK_KEYS = ("free_disk", "disk_free_bytes", "free_disk_bytes")  # generate emits free_disk


def pick_run(runs: list[RunInfo], stage: str) -> RunInfo | None:
    """The running run of `stage` if any, else the last one listed (the newest)."""
    mine = [r for r in runs if r.stage == stage]
    running = [r for r in mine if r.state == "running"]
    return (running or mine or [None])[-1]


def _number(event: dict[str, Any], key: str) -> float | None:
    value = event.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} is {value!r}, expected a number")
    return value


class TokenRate:
    """Tokens/s from successive events' completion_tokens (the event itself carries only totals)."""

    def __init__(self) -> None:
        self._prev: tuple[str, float, float] | None = None
        self.value: float | None = None

    def feed(self, run_id: str, event: dict[str, Any]) -> float | None:
        if isinstance(event.get("tokens_per_s"), (int, float)):
            self.value = float(event["tokens_per_s"])
            return self.value
        tokens, ts = _number(event, "completion_tokens"), _number(event, "ts")
        if tokens is None or ts is None:
            return self.value
        if self._prev and self._prev[0] == run_id and ts > self._prev[1]:
            self.value = (tokens - self._prev[2]) / (ts - self._prev[1])
        elif self._prev is None or self._prev[0] != run_id:
            self.value = None
        if self._prev is None or ts != self._prev[1] or self._prev[0] != run_id:
            self._prev = (run_id, ts, tokens)
        return self.value


def by_reason(counts: Any, limit: int = 4) -> str:
    """`prompt_too_long 2 · invalid_json 1` from an event's `*_by_reason` map, biggest first. Plain text:
    the reasons come from the host, so they are cut and stripped of control characters here and go into
    the pane only as `markup()` values."""
    if not isinstance(counts, dict):
        return ""
    items = [(str(k), v) for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    items.sort(key=lambda kv: (-kv[1], kv[0]))
    shown = [f"{''.join(ch for ch in k if ch.isprintable())[:40]} {v}" for k, v in items[:limit]]
    if len(items) > limit:
        shown.append(f"+{len(items) - limit} more")
    return " · ".join(shown)


def outcome_lines(event: dict[str, Any]) -> list[Content]:
    """Samples left out (skipped), failed and sent with a cut budget, by reason; nothing when none."""
    out = []
    skipped, reduced = int(_number(event, "skipped") or 0), int(_number(event, "reduced") or 0)
    if skipped or reduced:
        reasons = by_reason(event.get("skipped_by_reason"))
        out.append(markup("skipped  $n$reasons$reduced", n=skipped, reasons=f": {reasons}" if reasons else "",
                          reduced=f"   reduced max_tokens {reduced}" if reduced else ""))
    failed = int(_number(event, "failed") or 0)
    reasons = by_reason(event.get("failed_by_reason"))
    if failed and reasons:
        permanent = int(_number(event, "failed_permanent") or 0)
        tail = ("   [dim]a rerun retries them[/]" if failed > permanent else "") + \
               (f"   [dim]{permanent} rejected: a rerun cannot help[/]" if permanent else "")
        out.append(markup("failed   [red]$n[/]: $reasons", n=failed, reasons=reasons) + Content.from_markup(tail))
    return out


def source_line(event: dict[str, Any], limit: int = 6) -> Content | None:
    """`sources  chat 7/7 · code 2/8`: done of selected per source (--sources runs only). The names come
    from the host: cut, stripped of control characters, and passed as a `markup()` value."""
    by = event.get("by_source")
    if not isinstance(by, dict) or not isinstance(by.get("selected"), dict):
        return None
    done = by.get("done") if isinstance(by.get("done"), dict) else {}
    cells = []
    for name, selected in list(by["selected"].items())[:limit]:
        if isinstance(selected, int) and not isinstance(selected, bool):
            n = done.get(name)
            cells.append(f"{''.join(ch for ch in str(name) if ch.isprintable())[:32]} "
                         f"{n if isinstance(n, int) and not isinstance(n, bool) else 0}/{selected}")
    if len(by["selected"]) > limit:
        cells.append(f"+{len(by['selected']) - limit} more")
    return markup("sources  $cells", cells=" · ".join(cells)) if cells else None


def generation_markup(run: RunInfo, tokens_per_s: float | None, width: int = 60) -> Content:
    event = run.last_event or {}
    done = int(_number(event, "done") or run.done)
    total = int(_number(event, "total") or run.total)
    errors = int(_number(event, "failed") or run.failed)
    rate = run.rate if run.rate is not None else _number(event, "rate")
    frac = done / total if total else None
    free = next((event[k] for k in _FREE_DISK_KEYS if k in event), None)
    return lines(
        markup("run      [b]$run[/b]  [dim]$state[/]", run=run.run_id, state=run.state),
        f"done     {done}/{total} {pct(done, total)}  ▕[green]{bar(frac, max(4, min(30, width - 40)))}[/]▏",
        f"rate     {num(rate, '{:.2f}/s')}   ETA {duration(run.eta_s)}   "
        f"errors {'[red]' if errors else ''}{errors}{'[/]' if errors else ''}",
        f"reasoning captured {pct(_number(event, 'reasoning_captured'), done)}   "
        f"truncated (length) {pct(_number(event, 'truncated'), done)}",
        f"tokens/s {num(tokens_per_s, '{:.0f}')}   written {human_bytes(_number(event, 'bytes_written'))}"
        f"   free disk {human_bytes(free) if isinstance(free, (int, float)) else 'N/A'}",
        *outcome_lines(event),
        *([line] if (line := source_line(event)) is not None else []),
    )


class GenerationPane(Pane):
    TITLE = "Generation"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.tokens = TokenRate()

    def compose_body(self) -> ComposeResult:
        yield Text("[dim]no generation run[/]", id="generation-body")

    def render_snapshot(self, snapshot: Snapshot) -> None:
        run = pick_run(snapshot.runs, "generate")
        body = self.query_one("#generation-body", Text)
        if run is None:
            body.show("[dim]no generation run[/]")
            return
        rate = self.tokens.feed(run.run_id, run.last_event or {})
        body.show(generation_markup(run, rate, self.content_size.width or 60))
