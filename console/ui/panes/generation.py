"""Data generation progress, from the newest "generate" run's typed view (console/telemetry/progress.py)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content

from console.telemetry.progress import GenerationProgress, generation_view
from console.control.stages import pick_run
from console.snapshot import RunInfo, Snapshot
from console.ui.panes.base import Pane, Text, lines, markup
from console.ui.panes.gauges import bar, duration, human_bytes, num, pct


class TokenRate:
    """Tokens/s from successive views' completion_tokens (the event itself carries only totals)."""

    def __init__(self) -> None:
        self._prev: tuple[str, float, float] | None = None
        self.value: float | None = None

    def feed(self, view: GenerationProgress) -> float | None:
        if view.tokens_per_s is not None:
            self.value = view.tokens_per_s
            return self.value
        run_id, tokens, ts = view.run_id, view.completion_tokens, view.ts
        if tokens is None or ts is None:
            return self.value
        if self._prev and self._prev[0] == run_id and ts > self._prev[1]:
            self.value = (tokens - self._prev[2]) / (ts - self._prev[1])
        elif self._prev is None or self._prev[0] != run_id:
            self.value = None
        if self._prev is None or ts != self._prev[1] or self._prev[0] != run_id:
            self._prev = (run_id, ts, tokens)
        return self.value


def by_reason(counts: tuple[tuple[str, int], ...], limit: int = 4) -> str:
    """`prompt_too_long 2 · invalid_json 1`, biggest first (the view cut and cleaned the host's reasons;
    they still go into the pane only as `markup()` values)."""
    shown = [f"{k} {v}" for k, v in counts[:limit]]
    if len(counts) > limit:
        shown.append(f"+{len(counts) - limit} more")
    return " · ".join(shown)


def outcome_lines(view: GenerationProgress) -> list[Content]:
    """Samples left out (skipped), failed and sent with a cut budget, by reason; nothing when none."""
    out = []
    if view.skipped or view.reduced:
        reasons = by_reason(view.skipped_by_reason)
        out.append(markup("skipped  $n$reasons$reduced", n=view.skipped, reasons=f": {reasons}" if reasons else "",
                          reduced=f"   reduced max_tokens {view.reduced}" if view.reduced else ""))
    reasons = by_reason(view.failed_by_reason)
    if view.failed and reasons:
        permanent = view.failed_permanent
        tail = ("   [dim]a rerun retries them[/]" if view.failed > permanent else "") + \
               (f"   [dim]{permanent} rejected: a rerun cannot help[/]" if permanent else "")
        out.append(markup("failed   [red]$n[/]: $reasons", n=view.failed, reasons=reasons) + Content.from_markup(tail))
    return out


def source_line(view: GenerationProgress, limit: int = 6) -> Content | None:
    """`sources  chat 7/7 · code 2/8`: done of selected per source (--sources runs only); the names were
    cleaned by the typed view and go in as a `markup()` value."""
    if not view.by_source:
        return None
    cells = [f"{name} {done}/{selected}" for name, done, selected in view.by_source[:limit]]
    if len(view.by_source) > limit:
        cells.append(f"+{len(view.by_source) - limit} more")
    return markup("sources  $cells", cells=" · ".join(cells))


def generation_markup(run: RunInfo | GenerationProgress, tokens_per_s: float | None, width: int = 60) -> Content:
    v = run if isinstance(run, GenerationProgress) else generation_view(run)
    done, total, errors = v.done, v.total, v.failed
    frac = done / total if total else None
    return lines(
        markup("run      [b]$run[/b]  [dim]$state[/]", run=v.run_id, state=v.state),
        f"done     {done}/{total} {pct(done, total)}  ▕[green]{bar(frac, max(4, min(30, width - 40)))}[/]▏",
        f"rate     {num(v.rate, '{:.2f}/s')}   ETA {duration(v.eta_s)}   "
        f"errors {'[red]' if errors else ''}{errors}{'[/]' if errors else ''}",
        f"reasoning captured {pct(v.reasoning_captured, done)}   "
        f"truncated (length) {pct(v.truncated, done)}",
        f"tokens/s {num(tokens_per_s, '{:.0f}')}   written {human_bytes(v.bytes_written)}"
        f"   free disk {human_bytes(v.free_disk) if v.free_disk is not None else 'N/A'}",
        *outcome_lines(v),
        *([line] if (line := source_line(v)) is not None else []),
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
        view = generation_view(run)
        body.show(generation_markup(view, self.tokens.feed(view), self.content_size.width or 60))
