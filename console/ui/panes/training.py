"""Training progress: loss curve kept from successive progress events, accuracy per position, checkpoints."""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from textual.app import ComposeResult
from textual.markup import escape
from textual_plotext import PlotextPlot

from console.telemetry.snapshot import Snapshot
from console.ui.panes.base import Pane, Text
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


def training_markup(run_id: str, state: str, eta_s: float | None, h: TrainHistory) -> str:
    p = h.last
    if p is None:
        return f"run      [b]{escape(run_id)}[/b]  [dim]{escape(state)} (no progress yet)[/]"
    acc = "  ".join(f"{i}:{a:.2f}[green]{bar(a, 4)}[/]" for i, a in enumerate(p.acc)) or "N/A"
    best = f"{escape(h.best[1])} (val {h.best[0]:.4f})" if h.best else "N/A"
    return "\n".join([
        f"run      [b]{escape(run_id)}[/b]  [dim]{escape(state)}[/]   epoch {num(p.epoch, '{:g}')}  "
        f"step {p.step}   ETA {duration(eta_s)}",
        f"loss     {num(p.loss, '{:.4f}')}   val {num(p.val_loss, '{:.4f}')}   lr {num(p.lr, '{:.2e}')}",
        f"acc/pos  {acc}",
        f"ckpt     last {escape(h.last_checkpoint or 'N/A')}   best {best}",
    ])


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
        body = self.query_one("#training-body", Text)
        plot = self.query_one("#loss-plot", PlotextPlot)
        if run is None:
            body.show("[dim]no training run[/]")
            plot.set_class(False, "-shown")
            return
        if run.run_id != self.history.run_id:  # a new run: fresh curve, drawn at once
            self.history = TrainHistory()
            self.history.run_id = run.run_id
            self._plotted_at = None
        point = train_point(run.last_event or {})
        changed = self.history.feed(run.run_id, point) if point else False
        body.show(training_markup(run.run_id, run.state, run.eta_s, self.history))
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
