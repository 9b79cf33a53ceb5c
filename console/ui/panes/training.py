"""Training progress: loss curve (train per step, validation per epoch), held-out acceptance per saved epoch
(the chosen checkpoint starred), accuracy per draft position, epoch
and step, lr, rate and ETA, last and best checkpoint; and verify's table once it finishes.

A real run's RunInfo carries its accumulated curves (`series`, console/telemetry/train_view.py); without
one (an older console feed) the pane accumulates points from successive snapshots' latest events.
Text from the host (run ids, paths, errors) goes into the markup as `$variables`, never parsed.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from textual.app import ComposeResult
from textual.content import Content
from textual_plotext import PlotextPlot

from console.telemetry.bench_view import counted_for
from console.telemetry.progress import TrainPoint, TrainProgress, train_view, verify_view
from console.snapshot import RunInfo, Snapshot
from console.ui.panes.base import Pane, Text, lines, markup
from console.ui.panes.gauges import bar, duration, num
from console.control.stages import pick_run

PLOT_INTERVAL_S = 5.0  # redrawing the curve is the costliest repaint here; a loss curve needs no 1 Hz
MAX_POINTS = 2000  # bounded history; at one step a second that is over half an hour of curve


class TrainHistory:
    """Points accumulated across snapshots (each snapshot carries only the latest event)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.run_id: str | None = None
        self.steps: deque[tuple[int, float]] = deque(maxlen=MAX_POINTS)
        self.val: dict[float, tuple[int, float]] = {}  # epoch -> (step first seen, validation loss)
        self.last: TrainPoint | None = None
        self.last_checkpoint: str | None = None
        self.best: tuple[float, str] | None = None  # (val_loss, checkpoint)
        self.series: TrainProgress | None = None  # the run's accumulated series, when the console sent one

    def feed(self, run_id: str, point: TrainPoint) -> bool:
        """Add a point; True if the curve changed."""
        if run_id != self.run_id:
            self._reset()
            self.run_id = run_id
        changed = False
        if point.loss is not None and (not self.steps or point.step > self.steps[-1][0]):
            self.steps.append((point.step, point.loss))
            changed = True
        seen = self.val.get(point.epoch) if point.epoch is not None else None
        if point.val_loss is not None and point.epoch is not None and (seen is None or seen[1] != point.val_loss):
            self.val[point.epoch] = (seen[0] if seen else point.step, point.val_loss)
            changed = True
        if point.checkpoint:
            self.last_checkpoint = point.checkpoint
            if point.val_loss is not None and (self.best is None or point.val_loss < self.best[0]):
                self.best = (point.val_loss, point.checkpoint)
        self.last = point
        return changed


    def load_series(self, run_id: str, view: TrainProgress) -> bool:
        """Replace the curve with a run's accumulated series (its typed view); True if it changed."""
        if run_id != self.run_id:
            self._reset()
            self.run_id = run_id
        val = {epoch: (step, v) for step, epoch, v in view.val}
        changed = list(self.steps) != list(view.loss) or self.val != val
        self.steps = deque(view.loss, maxlen=MAX_POINTS)
        self.val = val
        self.last_checkpoint = view.last_checkpoint
        self.best = view.best
        self.last = view.point
        self.series = view
        return changed


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positions(values: Sequence[Any] | None, with_bars: bool = True) -> str:
    """Our own markup: numbers only."""
    cells = []
    for i, a in enumerate(values or []):
        if _is_num(a):
            cells.append(f"{i + 1}:{a:.2f}" + (f"[green]{bar(a, 4)}[/]" if with_bars else ""))
    return "  ".join(cells) or "N/A"


def acceptance_line(view: Any) -> str | None:
    """Held-out acceptance per saved epoch (mean acceptance length), the chosen one starred, and how much
    patience is left before training stops early; None before the first measurement. Numbers only."""
    points = list(view.acceptance)
    if not points:
        return None
    chosen = view.chosen_epoch
    cells = [f"ep{e + 1} {v:.2f}" + ("*" if e == chosen else "") for e, v in points[-8:]]
    tail = f"   chosen: epoch {chosen + 1}" if chosen is not None else ""
    if view.acceptance_patience and view.stale_epochs is not None:
        tail += f"   [dim]no gain {view.stale_epochs}/{view.acceptance_patience} epochs[/]"
    return f"accept   {'  '.join(cells)}{tail}"


def training_markup(run_id: str, state: str, eta_s: float | None, h: TrainHistory,
                    rate: float | None = None) -> Content:
    p = h.last
    if p is None:
        return markup("run      [b]$run[/b]  [dim]$state (no progress yet)[/]", run=run_id, state=state)
    series = h.series
    total = series.steps_total if series else None
    epochs = series.epochs if series else None
    if series is not None:  # the stage counts epochs and steps from 0; people count from 1
        epoch = num(p.epoch + 1 if p.epoch is not None else None, "{:g}") + (f"/{epochs}" if epochs else "")
        step = f"{p.step + 1}" + (f"/{total}" if total else "")
    else:
        epoch = num(p.epoch, "{:g}")
        step = f"{p.step}"
    rate = rate if rate is not None else (series.rate if series else None)
    eta = eta_s if eta_s is not None else (series.eta_s if series else None)
    eta = eta if state == "running" else None
    resumed = f"   [dim]resumed at step {series.resumed_from}[/]" if series and series.resumed_from is not None else ""
    best = f"{h.best[1]} (val {h.best[0]:.4f})" if h.best else "N/A"
    val_acc = list(series.val_acc) if series else None
    accept = acceptance_line(series) if series else None
    return lines(
        markup(f"run      [b]$run[/b]  [dim]$state[/]   epoch {epoch}  step {step}   "
               f"rate {num(rate, '{:.2f} step/s')}   ETA {duration(eta)}{resumed}", run=run_id, state=state),
        f"loss     {num(p.loss, '{:.4f}')}   val {num(p.val_loss, '{:.4f}')}   lr {num(p.lr, '{:.2e}')}",
        *([accept] if accept else []),
        f"acc/pos  {_positions(p.acc)}" + (f"   [dim]val {_positions(val_acc, False)}[/]" if val_acc else ""),
        markup("ckpt     last $last   best $best", last=h.last_checkpoint or "N/A", best=best),
    )


def verify_markup(run: RunInfo, runs: Sequence[RunInfo] = ()) -> Content:
    """verify's table once it has finished (its typed view reads the report in its finish summary), and
    beside its prediction vLLM's count of the same checkpoint (the newest bench of it in `runs`, else the
    count the report carries) with the gap and its tolerance."""
    v = verify_view(run)
    if not v.finished:
        return markup("verify   [b]$run[/b]  [dim]$state[/]", run=v.run_id, state=v.state)
    failed = v.failed_checks
    head = markup("verify   [b]$run[/b]  [dim]$state[/]   checks "
                  + ("[red]failed: $failed[/]" if failed else f"[green]{len(v.checks)} ok[/]"),
                  run=v.run_id, state=v.state, failed=", ".join(failed))
    if v.trained is None and v.untrained is None:
        return lines(head, markup("         [red]$error[/]", error=v.error[:200])) if v.error else head
    k = v.k
    rows: list[Content | str] = [head + Content(f"   k={k}"),
                                 "         draft      " + "".join(f"pos{j + 1:<4}" for j in range(k))
                                 + "accepted  length"]
    for name, a in (("trained", v.trained), ("untrained", v.untrained)):
        per = a.per_position if a is not None else ()
        cells = "".join(f"{x:<7.2f}" if x is not None else "N/A    " for x in per[:k])
        rows.append(f"         {name:<10} {cells}{num(a and a.mean_accepted, '{:<9.2f}')} "
                    f"{num(a and a.mean_acceptance_length, '{:.2f}')}")
    k_line = _k_line(v.k_table)
    online = _online_line(run, runs)
    return lines(*rows, *([k_line] if k_line else []), *([online] if online else []))


def _online_line(run: RunInfo, runs: Sequence[RunInfo]) -> Content | None:
    """verify's predicted acceptance length beside the one vLLM counted while a bench served the drafter."""
    found = counted_for(run, runs)
    if found is None:
        return None
    bench, gap = found
    verdict = (f"[green]within ±{gap.tolerance:.2f}[/]" if gap.within
               else f"[red]OUTSIDE ±{gap.tolerance:.2f}: serves unlike it verified[/]")
    return markup(f"vLLM     counted {gap.online.length:.2f} ({gap.drafts} drafts, bench [b]$bench[/b])   "
                  f"predicted {gap.offline.length:.2f}   gap {gap.gap:+.2f} {verdict}", bench=bench)


def _k_line(table: Any) -> Content | None:
    """verify's K table (the typed view's, read tolerantly there) in one line: expected length and speed-up
    per K, the recommended K and where the draft cost came from (host text, as a variable)."""
    if table is None or not table.rows:
        return None
    cells = [f"{r.k}:{r.expected_length:.2f}/x{r.speedup:.2f}" for r in table.rows]
    verdict = f"recommended K={table.recommended}" if table.recommended > 0 else "no K pays"
    return markup(f"         K length/speed-up  {'  '.join(cells)}   [b]{verdict}[/b]  [dim]$source[/]",
                  source=table.cost_source[:80])


class TrainingPane(Pane):
    TITLE = "Training"
    DEFAULT_CSS = """
    TrainingPane > PlotextPlot { height: 10; display: none; }
    TrainingPane > PlotextPlot.-shown { display: block; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.history = TrainHistory()
        self._plot_stale = False
        self._plotted_at: float | None = None  # snapshot time of the last redraw

    def compose_body(self) -> ComposeResult:
        yield Text("[dim]no training run[/]", id="training-body")
        yield PlotextPlot(id="loss-plot")

    def render_snapshot(self, snapshot: Snapshot) -> None:
        run = pick_run(snapshot.runs, "train")
        verify = pick_run(snapshot.runs, "verify")
        body = self.query_one("#training-body", Text)
        plot = self.query_one("#loss-plot", PlotextPlot)
        verify_text = verify_markup(verify, snapshot.runs) if verify is not None else None
        if run is None:
            body.show(lines("[dim]no training run[/]", verify_text) if verify_text else "[dim]no training run[/]")
            plot.set_class(False, "-shown")
            return
        if run.run_id != self.history.run_id:  # a new run: fresh curve, drawn at once
            self.history = TrainHistory()
            self.history.run_id = run.run_id
            self._plotted_at = None
        view = train_view(run)
        if view.from_series:
            changed = self.history.load_series(run.run_id, view)
        else:
            changed = self.history.feed(run.run_id, view.point) if view.point else False
        text = training_markup(run.run_id, run.state, run.eta_s, self.history, run.rate)
        body.show(lines(text, verify_text) if verify_text else text)
        plot.set_class(bool(self.history.steps), "-shown")
        self._plot_stale = self._plot_stale or changed
        t = snapshot.taken_at
        if self._plot_stale and (self._plotted_at is None or not 0 <= t - self._plotted_at < PLOT_INTERVAL_S):
            self._plot(plot)
            self._plot_stale = False
            self._plotted_at = t

    def _plot(self, plot: PlotextPlot) -> None:
        plt = plot.plt
        plt.clear_data()
        plt.title("loss")
        if self.history.steps:
            xs, ys = zip(*self.history.steps)
            plt.plot(list(xs), list(ys), label="train", marker="braille")
        if self.history.val:
            points = sorted(self.history.val.values())
            plt.scatter([s for s, _ in points], [v for _, v in points], label="val")
        plot.refresh()
