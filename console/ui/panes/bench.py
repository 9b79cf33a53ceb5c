"""The bench: baseline and drafter side by side per concurrency level, with the drafter's acceptance; a
drafter that makes generation slower in red; a bench of several K names the best. Hidden until the host
has a bench run."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content

from console.telemetry.bench_view import BenchView, Row, bench_view
from console.snapshot import Snapshot
from console.ui.panes.base import Pane, Text, lines, markup
from console.control.stages import pick_run

LABEL_WIDTH = 14


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def row_markup(row: Row) -> Content:
    """One contender at one level. The label is host text: a template variable, padded by us."""
    label = row.label[:LABEL_WIDTH]
    ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
    figures = (f"{row.output_tps:>10.1f} {ratio:>7} {_num(row.median_tpot_ms, '.1f'):>8} "
               f"{_num(row.median_ttft_ms, '.1f'):>8} {_num(row.acceptance_length, '.2f'):>7} "
               f"{_num(row.acceptance_rate, '.0%'):>6}")
    failed = f"  [yellow]{row.failed} failed[/]" if row.failed else ""
    pad = " " * (LABEL_WIDTH - len(label))
    if row.slower:
        return markup(f"[b red]{row.concurrency:>4}  $label{pad}{figures}  SLOWER[/]{failed}", label=label)
    style = "dim" if row.ratio is None else "green"
    return markup(f"{row.concurrency:>4}  [{style}]$label[/]{pad}{figures}{failed}", label=label)


def bench_markup(view: BenchView) -> Content:
    what = (markup("run [b]$run[/b] [dim]$state[/]  [b]$label[/] against [b]$base[/]", run=view.run_id,
                   state=view.state, label=view.label or "?", base=view.baseline)
            if view.baseline else
            markup("run [b]$run[/b] [dim]$state[/]  [b]$label[/]", run=view.run_id, state=view.state,
                   label=view.label or "(running)"))
    parts: list[Content | str] = [what]
    if view.state == "running":
        level = f"concurrency {view.level}, " if view.level is not None else ""
        parts.append(f"measuring: {level}{view.done}/{view.total} requests")
    if view.rows:
        parts.append(f"[dim]conc  {'label':<{LABEL_WIDTH}}{'out tok/s':>10} {'ratio':>7} {'TPOT p50':>8} "
                     f"{'TTFT p50':>8} {'acc len':>7} {'accept':>6}[/]")
        parts.extend(row_markup(r) for r in view.rows)
    parts.extend(markup("[dim]$note[/]", note=m) for m in view.missing)
    parts.extend(markup("[b red]$note[/]" if "FAILED" in n else "$note", note=n) for n in view.notes)
    if view.best is not None:  # several K: the verdict is the best K's (a K that lost is marked in its rows)
        parts.append(markup(f"[b {'red' if view.best.slower else 'green'}]$best[/]", best=view.best.line()))
    elif view.slower:
        parts.append("[b red]the drafter is slower than the baseline where marked: do not serve it[/]")
    if view.error:
        parts.append(markup("[red]$error[/]", error=view.error))
    return lines(*parts)


class BenchPane(Pane):
    TITLE = "Bench"
    DEFAULT_CSS = """
    BenchPane { display: none; }
    BenchPane.-shown { display: block; }
    """

    def compose_body(self) -> ComposeResult:
        yield Text("", id="bench-body")

    _seen: tuple[str, str] | None = None  # the bench run (id, state) last shown

    def render_snapshot(self, snapshot: Snapshot) -> None:
        run = pick_run(list(snapshot.runs), "bench")
        self.set_class(run is not None, "-shown")
        if run is not None:
            self.query_one("#bench-body", Text).show(bench_markup(bench_view(run)))
            # it sits below the fold of the pane area: a bench started or finished while the operator
            # watches scrolls into view (an old one found at start-up leaves the view where it is)
            seen, self._seen = self._seen, (run.run_id, run.state)
            if seen is not None and seen != self._seen:
                self.call_after_refresh(self.scroll_visible)
        elif self._seen is None:
            self._seen = ("", "")  # nothing yet: the first bench run that appears is a new one
