"""One row per GPU: memory bar (1/8 blocks, coloured by threshold), numbers and a utilisation history."""
from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.content import Content

from console.snapshot import GpuInfo, Snapshot
from console.ui.panes.base import Pane, Text, lines, markup
from console.ui.panes.gauges import bar, level_colour, num, sparkline

HISTORY = 30  # samples kept per GPU for the sparkline (about 30 s)


def _mem_fraction(gpu: GpuInfo) -> float | None:
    if gpu.memory_used_mib is None or not gpu.memory_total_mib:
        return None
    return gpu.memory_used_mib / gpu.memory_total_mib


def _gib(mib: int | None) -> str:
    return "N/A" if mib is None else f"{mib / 1024:.1f}"


def gpu_row(gpu: GpuInfo, history: list[float | None], width: int) -> Content:
    """One GPU as one line of markup fitted to `width` cells; narrow widths drop the extras first."""
    frac = _mem_fraction(gpu)
    mem = f"{_gib(gpu.memory_used_mib)}/{_gib(gpu.memory_total_mib)}G"
    util = f"{num(gpu.utilization_pct, '{}%'):>4}"
    temp = num(gpu.temperature_c, "{}°C")
    power = num(gpu.power_w, "{:.0f}W")
    head = f"{gpu.index:>2} "
    tail_full = f" {mem:>13} {util} {temp:>5} {power:>5} "
    spark_w = 12 if width >= 70 else 0
    name_w = 12 if width >= 90 else 0
    tail = tail_full if width >= 50 else f" {mem:>13} {util}"
    bar_w = width - len(head) - name_w - len(tail) - spark_w - 2
    if bar_w < 4:  # very narrow: numbers only
        return markup("$head$mem $util", head=head, mem=mem, util=util)
    name = f"{gpu.name[:name_w - 1]:<{name_w - 1}} " if name_w else ""
    colour = level_colour(frac)
    mem_bar = f"[{colour}]{bar(frac, bar_w)}[/]" if frac is not None else f"[dim]{'N/A'.center(bar_w)}[/]"
    spark = f"[cyan]{sparkline(history, spark_w)}[/]" if spark_w else ""
    return markup(f"$head$name▕{mem_bar}▏$tail{spark}", head=head, name=name, tail=tail)


class GpusPane(Pane):
    TITLE = "GPUs"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.history: dict[int, deque[float | None]] = {}
        self._last: Snapshot | None = None

    def compose_body(self) -> ComposeResult:
        yield Text("[dim]waiting for data…[/]", id="gpus-body")

    def render_snapshot(self, snapshot: Snapshot) -> None:
        for gpu in snapshot.gpus:
            self.history.setdefault(gpu.index, deque(maxlen=HISTORY)).append(gpu.utilization_pct)
        self._last = snapshot
        self._draw()

    def on_resize(self) -> None:
        if self._last is not None:
            self.guarded(self._draw)

    def _draw(self) -> None:
        snapshot = self._last
        assert snapshot is not None
        width = max(20, self.content_size.width or 80)
        if snapshot.gpu_error:
            body = markup("[red]GPU query failed: $error[/]", error=snapshot.gpu_error)
        elif not snapshot.gpus:
            body = markup("[dim]no GPUs reported[/]")
        else:
            body = lines(*(gpu_row(g, list(self.history.get(g.index, ())), width) for g in snapshot.gpus))
        self.query_one("#gpus-body", Text).show(body)
