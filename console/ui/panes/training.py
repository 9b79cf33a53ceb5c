"""Training progress: loss curve (train per step, validation per epoch), accuracy per draft position, epoch
and step, lr, rate and ETA, last and best checkpoint; and verify's table once it finishes.

A real run's RunInfo carries its accumulated curves (`series`, console/telemetry/train_view.py); without
one (an older console feed) the pane accumulates points from successive snapshots' latest events.
Text from the host (run ids, paths, errors) goes into the markup as `$variables`, never parsed.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from textual.app import ComposeResult
from textual.content import Content
from textual_plotext import PlotextPlot

from backend.verify.report import draft_positions
from console.telemetry.snapshot import RunInfo, Snapshot
from console.ui.panes.base import Pane, Text, lines, markup
from console.ui.panes.gauges import bar, duration, num
from console.ui.panes.generation import pick_run

PLOT_INTERVAL_S = 5.0  # redrawing the curve is the costliest repaint here; a loss curve needs no 1 Hz
MAX_POINTS = 2000  # bounded history; at one step a second that is over half an hour of curve
_ACC_KEY = re.compile(r"acc_(\d+)")


@dataclass
class TrainPoint:
    step: int
    epoch: float | None
    loss: float | None
    val_loss: float | None
    lr: float | None
    acc: list[float]
    checkpoint: str | None


def _opt_float(event: dict[str, Any], key: str) -> float | None:
    value = event.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} is {value!r}, expected a number")
    return float(value)


def train_point(event: dict[str, Any]) -> TrainPoint | None:
    """Read a train progress event; None if it has no step (e.g. a start event). Bad types raise."""
    if event.get("step") is None:
        return None
    step = _opt_float(event, "step")
    acc_list = event.get("acc_k", event.get("acc"))
    if isinstance(acc_list, list):
        acc = [float(a) for a in acc_list]
    else:  # acc_0, acc_1, ... as separate keys
        found = sorted((int(m.group(1)), k) for k in event if (m := _ACC_KEY.fullmatch(k)))
        acc = [float(_opt_float(event, k) or 0.0) for _, k in found]
    ckpt = event.get("checkpoint")
    return TrainPoint(step=int(step or 0), epoch=_opt_float(event, "epoch"), loss=_opt_float(event, "loss"),
                      val_loss=_opt_float(event, "val_loss"), lr=_opt_float(event, "lr"), acc=acc,
                      checkpoint=str(ckpt) if ckpt else None)


class TrainHistory:
    """Points accumulated across snapshots (each snapshot carries only the latest event)."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.steps: deque[tuple[int, float]] = deque(maxlen=MAX_POINTS)
        self.val: dict[float, tuple[int, float]] = {}  # epoch -> (step first seen, validation loss)
        self.last: TrainPoint | None = None
        self.last_checkpoint: str | None = None
        self.best: tuple[float, str] | None = None  # (val_loss, checkpoint)
        self.series: dict[str, Any] | None = None  # the run's accumulated series, when the console sent one

    def feed(self, run_id: str, point: TrainPoint) -> bool:
        """Add a point; True if the curve changed."""
        if run_id != self.run_id:
            self.__init__()
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


    def load_series(self, run_id: str, series: dict[str, Any]) -> bool:
        """Replace the curve with a run's accumulated series (RunInfo.series); True if it changed."""
        if run_id != self.run_id:
            self.__init__()
            self.run_id = run_id
        steps = [(int(s), float(v)) for s, v in series.get("loss") or [] if _is_num(s) and _is_num(v)]
        val = {}
        for item in series.get("val") or []:
            if len(item) == 3 and _is_num(item[0]) and _is_num(item[2]):
                val[item[1] if item[1] is not None else float(item[0])] = (int(item[0]), float(item[2]))
        changed = list(self.steps) != steps or self.val != val
        self.steps = deque(steps, maxlen=MAX_POINTS)
        self.val = val
        last = series.get("last_checkpoint") or {}
        self.last_checkpoint = str(last["path"]) if isinstance(last.get("path"), str) else None
        best = series.get("best") or {}
        self.best = ((float(best["val_loss"]), str(best["path"]))
                     if isinstance(best.get("path"), str) and _is_num(best.get("val_loss")) else None)
        acc = [float(a) if _is_num(a) else 0.0 for a in series.get("acc_k") or []]
        step = series.get("step")
        self.last = TrainPoint(step=int(step) if _is_num(step) else (steps[-1][0] if steps else 0),
                               epoch=float(series["epoch"]) if _is_num(series.get("epoch")) else None,
                               loss=steps[-1][1] if steps else None,
                               val_loss=max(val.values())[1] if val else None,
                               lr=float(series["lr"]) if _is_num(series.get("lr")) else None, acc=acc,
                               checkpoint=self.last_checkpoint)
        self.series = series
        return changed


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positions(values: list[Any] | None, with_bars: bool = True) -> str:
    """Our own markup: numbers only."""
    cells = []
    for i, a in enumerate(values or []):
        if _is_num(a):
            cells.append(f"{i + 1}:{a:.2f}" + (f"[green]{bar(a, 4)}[/]" if with_bars else ""))
    return "  ".join(cells) or "N/A"


def training_markup(run_id: str, state: str, eta_s: float | None, h: TrainHistory,
                    rate: float | None = None) -> Content:
    p = h.last
    if p is None:
        return markup("run      [b]$run[/b]  [dim]$state (no progress yet)[/]", run=run_id, state=state)
    series = h.series or {}
    total, epochs = series.get("total"), series.get("epochs")
    if h.series is not None:  # the stage counts epochs and steps from 0; people count from 1
        epoch = num(p.epoch + 1 if p.epoch is not None else None, "{:g}") + (f"/{epochs}" if _is_num(epochs) else "")
        step = f"{p.step + 1}" + (f"/{total}" if _is_num(total) else "")
    else:
        epoch = num(p.epoch, "{:g}") + (f"/{epochs}" if _is_num(epochs) else "")
        step = f"{p.step}" + (f"/{total}" if _is_num(total) else "")
    rate = rate if rate is not None else (series.get("rate") if _is_num(series.get("rate")) else None)
    eta = eta_s if eta_s is not None else (series.get("eta_s") if _is_num(series.get("eta_s")) else None)
    eta = eta if state == "running" else None
    resumed = f"   [dim]resumed at step {series['resumed_from']}[/]" if _is_num(series.get("resumed_from")) else ""
    best = f"{h.best[1]} (val {h.best[0]:.4f})" if h.best else "N/A"
    val_acc = series.get("val_acc_k")
    return lines(
        markup(f"run      [b]$run[/b]  [dim]$state[/]   epoch {epoch}  step {step}   "
               f"rate {num(rate, '{:.2f} step/s')}   ETA {duration(eta)}{resumed}", run=run_id, state=state),
        f"loss     {num(p.loss, '{:.4f}')}   val {num(p.val_loss, '{:.4f}')}   lr {num(p.lr, '{:.2e}')}",
        f"acc/pos  {_positions(p.acc)}" + (f"   [dim]val {_positions(val_acc, False)}[/]" if val_acc else ""),
        markup("ckpt     last $last   best $best", last=h.last_checkpoint or "N/A", best=best),
    )


def verify_markup(run: RunInfo) -> Content:
    """verify's table once it has finished (its finish summary carries the report)."""
    if run.state not in ("done", "failed", "stopped"):
        return markup("verify   [b]$run[/b]  [dim]$state[/]", run=run.run_id, state=run.state)
    report = run.last_event or {}
    checks = [c for c in report.get("checks") or [] if isinstance(c, dict)]
    failed = [str(c.get("name")) for c in checks if not c.get("ok")]
    head = markup("verify   [b]$run[/b]  [dim]$state[/]   checks "
                  + ("[red]failed: $failed[/]" if failed else f"[green]{len(checks)} ok[/]"),
                  run=run.run_id, state=run.state, failed=", ".join(failed))
    acc = report.get("acceptance")
    if not isinstance(acc, dict):
        error = report.get("error")
        return lines(head, markup("         [red]$error[/]", error=str(error)[:200])) if error else head
    k = draft_positions(acc)  # capped: a finish saying k=10**9 must not build a gigabyte line
    rows: list[Content | str] = [head + Content(f"   k={k}"),
                                 "         draft      " + "".join(f"pos{j + 1:<4}" for j in range(k))
                                 + "accepted  length"]
    for name in ("trained", "untrained"):
        a = acc.get(name) if isinstance(acc.get(name), dict) else {}
        cells = "".join(f"{v:<7.2f}" if _is_num(v) else "N/A    " for v in (a.get("per_position") or [])[:k])
        rows.append(f"         {name:<10} {cells}{num(a.get('mean_accepted'), '{:<9.2f}')} "
                    f"{num(a.get('mean_acceptance_length'), '{:.2f}')}")
    return lines(*rows)


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
        verify_text = verify_markup(verify) if verify is not None else None
        if run is None:
            body.show(lines("[dim]no training run[/]", verify_text) if verify_text else "[dim]no training run[/]")
            plot.set_class(False, "-shown")
            return
        if run.run_id != self.history.run_id:  # a new run: fresh curve, drawn at once
            self.history = TrainHistory()
            self.history.run_id = run.run_id
            self._plotted_at = None
        if run.series is not None:
            changed = self.history.load_series(run.run_id, run.series)
        else:
            point = train_point(run.last_event or {})
            changed = self.history.feed(run.run_id, point) if point else False
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
