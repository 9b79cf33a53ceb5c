"""One row per GPU: memory bar (1/8 blocks, coloured by threshold), numbers, and history strips of memory
and utilisation over the last few minutes (the session's History: a stalled load is a flat memory strip,
a throttled GPU a sagging utilisation one)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content

from console.snapshot import GpuInfo, Snapshot
from console.ui.panes.base import Pane, Text, lines, markup
from console.telemetry.history import POINTS, WINDOW_S, Series
from console.ui.panes.gauges import bar, level_colour, num, sparkline



def _values(series: dict[int, Series], index: int) -> list[float | None]:
    found = series.get(index)
    return found.values() if found is not None else []


def _mem_fraction(gpu: GpuInfo) -> float | None:
    if gpu.memory_used_mib is None or not gpu.memory_total_mib:
        return None
    return gpu.memory_used_mib / gpu.memory_total_mib


def _gib(mib: int | None) -> str:
    return "N/A" if mib is None else f"{mib / 1024:.1f}"


def gpu_row(gpu: GpuInfo, history: list[float | None], width: int,
            memory: list[float | None] | None = None) -> Content:
    """One GPU as one line of markup fitted to `width` cells; narrow widths drop the extras first.
    `history`: utilisation per history bucket; `memory`: percent of memory in use per bucket."""
    frac = _mem_fraction(gpu)
    mem = f"{_gib(gpu.memory_used_mib)}/{_gib(gpu.memory_total_mib)}G"
    util = f"{num(gpu.utilization_pct, '{}%'):>4}"
    temp = num(gpu.temperature_c, "{}°C")
    power = num(gpu.power_w, "{:.0f}W")
    head = f"{gpu.index:>2} "
    tail_full = f" {mem:>13} {util} {temp:>5} {power:>5} "
    # the whole window when there is room, the last two minutes otherwise
    spark_w = POINTS if width >= 130 and memory is not None else 12 if width >= 70 else 0
    mem_w = spark_w if width >= 110 and memory is not None else 0
    name_w = 12 if width >= 90 else 0
    tail = tail_full if width >= 50 else f" {mem:>13} {util}"
    bar_w = width - len(head) - name_w - len(tail) - spark_w - (mem_w + 1 if mem_w else 0) - 2
    if bar_w < 4:  # very narrow: numbers only
        return markup("$head$mem $util", head=head, mem=mem, util=util)
    name = f"{gpu.name[:name_w - 1]:<{name_w - 1}} " if name_w else ""
    colour = level_colour(frac)
    mem_bar = f"[{colour}]{bar(frac, bar_w)}[/]" if frac is not None else f"[dim]{'N/A'.center(bar_w)}[/]"
    spark = f"[cyan]{sparkline(history, spark_w)}[/]" if spark_w else ""
    if mem_w:
        spark = f"[magenta]{sparkline(memory or [], mem_w)}[/] " + spark
    return markup(f"$head$name▕{mem_bar}▏$tail{spark}", head=head, name=name, tail=tail)


class GpusPane(Pane):
    TITLE = "GPUs"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._last: Snapshot | None = None

    def compose_body(self) -> ComposeResult:
        yield Text("[dim]waiting for data…[/]", id="gpus-body")

    def render_snapshot(self, snapshot: Snapshot) -> None:
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
            history = self.app.history  # type: ignore[attr-defined]
            body = lines(*(gpu_row(g, _values(history.gpu_util, g.index), width, _values(history.gpu_memory, g.index))
                           for g in snapshot.gpus))
            if width >= 110:  # under the two strips: what each is, and over how long
                strip = POINTS if width >= 130 else 12
                span = f"last {int(WINDOW_S // 60) if width >= 130 else 2} min: "
                caption = span + "memory".ljust(strip + 1) + "utilisation".ljust(strip)
                body = lines(body, markup("[dim]$caption[/]", caption=caption.rjust(width - 2)))
        self.query_one("#gpus-body", Text).show(body)
