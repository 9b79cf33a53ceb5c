"""Server readiness: load phase, shard progress and ETA, then what is served; root cause when failed."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.markup import escape
from textual.widgets import ProgressBar

from console.model import ServerInfo, Snapshot
from console.panes.base import Pane, Text
from console.panes.gauges import duration, num

_PHASE_COLOUR = {"ready": "green", "failed": "red", "stopped": "dim", "unknown": "dim"}
_ETA_SOURCES = {"shards": "from shard progress", "gpu_memory": "from GPU memory growth",
                "previous_load": "from the previous load"}


def readiness_markup(srv: ServerInfo) -> str:
    colour = _PHASE_COLOUR.get(srv.phase, "yellow")
    lines = [f"phase    [{colour}][b]{escape(str(srv.phase))}[/b][/]"]
    if srv.phase not in ("ready", "failed", "stopped") and (srv.eta_s is not None or srv.progress):
        source = _ETA_SOURCES.get(srv.eta_source or "", srv.eta_source or "source unknown")
        lines.append(f"ETA      {duration(srv.eta_s)} [dim]({escape(source)})[/]")
    if srv.phase == "ready" or srv.model_id:
        lines.append(f"model    [b]{escape(srv.model_id or 'N/A')}[/b]  max_model_len {num(srv.max_model_len)}")
        lines.append(f"vLLM     {escape(srv.version or 'N/A')}   reasoning "
                     f"{escape(srv.reasoning_field or 'N/A')}")
    if srv.deep_check:
        lines.append(f"deep     {escape(srv.deep_check)}")
    if srv.error:
        lines.append(f"[b red]✖ {escape(srv.error)}[/]")
    return "\n".join(lines)


class ReadinessPane(Pane):
    TITLE = "Readiness"
    DEFAULT_CSS = """
    ReadinessPane > #shards { height: 1; display: none; }
    ReadinessPane > #shards.-shown { display: block; }
    ReadinessPane > #shards Bar { width: 1fr; }
    """

    def compose_body(self) -> ComposeResult:
        yield Text("[dim]waiting for data…[/]", id="readiness-body")
        yield Text("", id="shards-label")
        # A known total: an indeterminate bar animates (and costs CPU) even while hidden.
        yield ProgressBar(total=1, show_eta=False, id="shards")

    def render_snapshot(self, snapshot: Snapshot) -> None:
        srv = snapshot.server
        self.query_one("#readiness-body", Text).show(readiness_markup(srv))
        bar = self.query_one("#shards", ProgressBar)
        loading = srv.phase == "loading_weights" and srv.progress is not None and srv.progress.total > 0
        label = self.query_one("#shards-label", Text)
        if loading:
            done, total = int(srv.progress.done), int(srv.progress.total)
            if bar.total != total or bar.progress != done:
                bar.update(total=total, progress=done)
            label.show(f"weights  shard {done}/{total}")
        else:
            label.show("")
        label.display = loading
        bar.set_class(loading, "-shown")
