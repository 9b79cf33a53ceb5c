"""Server readiness: load phase, shard progress and ETA, then what is served; root cause when failed."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import ProgressBar

from console.snapshot import DrafterInfo, ServerInfo, Snapshot
from console.ui.panes.base import Pane, Text, lines, markup
from console.telemetry.history import WINDOW_S
from console.ui.panes.gauges import duration, num, sparkline

_PHASE_COLOUR = {"ready": "green", "failed": "red", "stopped": "dim", "unknown": "dim"}
_ETA_SOURCES = {"shards": "from shard progress", "gpu_memory": "from GPU memory growth",
                "previous_load": "from the previous load"}


def drafter_lines(d: DrafterInfo) -> list[Content]:
    """That the drafter was really loaded (its log lines) and its acceptance as the server logs it."""
    loaded = "[green]drafter loaded[/]" if d.loaded else "[yellow]drafter load not logged yet[/]"
    aux = ", ".join(str(i) for i in d.aux_layers) if d.aux_layers else "not logged"
    out = [markup(f"server   [b]with drafter[/b] ($unit): {loaded}, auxiliary layers $aux", unit=d.unit, aux=aux)]
    st = d.log_stats
    if st is not None and st.mean_acceptance_length is not None:
        rate = f"{st.acceptance_pct:.1f}%" if st.acceptance_pct is not None else "N/A"
        pos = " ".join(f"{p:.2f}" for p in st.per_position) or "N/A"
        out.append(markup("log      acceptance length $length, $rate [dim](per position $pos; SpecDecoding "
                          "metrics line)[/]", length=f"{st.mean_acceptance_length:.2f}", rate=rate, pos=pos))
    return out


def ready_eta_line(srv: ServerInfo) -> Content:
    """The one ETA to ready, and what it rests on (previous loads of the same model and settings)."""
    if srv.eta_ready_confidence == "previous_loads":
        loads = "load" if srv.eta_ready_basis == 1 else "loads"
        return markup("ready in $eta [dim](each step from $n previous $loads)[/]",
                      eta=duration(srv.eta_ready_s), n=str(srv.eta_ready_basis), loads=loads)
    if srv.eta_ready_s is not None:
        return markup("ready in >$eta [dim](low confidence: no previous load; weights only)[/]",
                      eta=duration(srv.eta_ready_s))
    return markup("ready in [dim]unknown (no previous load of this model and settings)[/]")


RATE_STRIP = 30


def rate_strip(rates: list[float | None]) -> Content | None:
    """Generated tokens per second over the last minutes, scaled to the window's peak."""
    known = [r for r in rates if r is not None]
    if len(known) < 2:
        return None
    peak = max(known)
    return markup(f"rate     [cyan]$strip[/] [dim]generated tok/s, last {int(WINDOW_S // 60)} min, peak $peak[/]",
                  strip=sparkline(rates, RATE_STRIP, top=peak or 1.0), peak=f"{peak:,.0f}")


def readiness_markup(srv: ServerInfo, rates: list[float | None] | None = None) -> Content:
    colour = _PHASE_COLOUR.get(srv.phase, "yellow")
    out = [markup(f"phase    [{colour}][b]$phase[/b][/]", phase=srv.phase)]
    if srv.drafter is not None:
        out.extend(drafter_lines(srv.drafter))
    if srv.eta_ready_confidence is not None:
        out.append(ready_eta_line(srv))
    if srv.phase not in ("ready", "failed", "stopped") and (srv.eta_s is not None or srv.progress) \
            and srv.phase in ("starting", "loading_weights"):
        source = _ETA_SOURCES.get(srv.eta_source or "", srv.eta_source or "source unknown")
        out.append(markup("weights  $eta [dim]($source)[/]", eta=duration(srv.eta_s), source=source))
    if srv.phase == "ready" or srv.model_id:
        out.append(markup("model    [b]$model[/b]  max_model_len $mml", model=srv.model_id or "N/A",
                          mml=num(srv.max_model_len)))
        # the field's own name may be "reasoning": say where it lives, not "reasoning reasoning"
        where = f"in message.{srv.reasoning_field}" if srv.reasoning_field else "N/A"
        out.append(markup("vLLM     $version   reasoning $where", version=srv.version or "N/A", where=where))
    m = srv.metrics
    if srv.phase == "ready" and m is not None:
        kv = f"{m.kv_cache_usage_pct:.0f}%" if m.kv_cache_usage_pct is not None else "N/A"
        tps = f"{m.generation_tps:,.0f} tok/s" if m.generation_tps is not None else "N/A tok/s"
        out.append(markup("load     $running running, $waiting waiting, KV $kv, $tps",
                          running=num(m.requests_running), waiting=num(m.requests_waiting), kv=kv, tps=tps))
        strip = rate_strip(rates or [])
        if strip is not None:
            out.append(strip)
        if m.spec_mean_acceptance_length is not None:
            rate = f"{m.spec_acceptance_rate:.0%}" if m.spec_acceptance_rate is not None else "N/A"
            pos = " ".join(f"{p:.2f}" for p in (m.spec_per_position or []))
            window = f"last {m.spec_window_s:g} s" if m.spec_window_s is not None else "last window"
            out.append(markup("drafter  acceptance length $length, $rate [dim](per position $pos; /metrics, "
                              "$window)[/]", length=f"{m.spec_mean_acceptance_length:.2f}", rate=rate, pos=pos,
                              window=window))
    if srv.deep_check:
        out.append(markup("deep     $deep", deep=srv.deep_check))
    if srv.error:
        out.append(markup("[b red]✖ $error[/]", error=srv.error))
    return lines(*out)


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
        history = getattr(self.app, "history", None)
        rates = history.generation_tps.values() if history is not None else None
        self.query_one("#readiness-body", Text).show(readiness_markup(srv, rates))
        bar = self.query_one("#shards", ProgressBar)
        weights = srv.phase in ("starting", "loading_weights")
        shards = weights and srv.progress is not None and srv.progress.total > 0
        # under systemd the shard counter only arrives at the end: GPU memory / time give the bar then
        estimated = weights and not shards and srv.fraction is not None
        loading = shards or estimated
        label = self.query_one("#shards-label", Text)
        if shards and srv.progress is not None:
            done, total = int(srv.progress.done), int(srv.progress.total)
            if bar.total != total or bar.progress != done:
                bar.update(total=total, progress=done)
            label.show(f"weights  shard {done}/{total}")
        elif estimated and srv.fraction is not None:
            pct = int(round(srv.fraction * 100))
            if bar.total != 100 or bar.progress != pct:
                bar.update(total=100, progress=pct)
            label.show(markup("weights  ~$pct% [dim]($source)[/]", pct=pct,
                              source=_ETA_SOURCES.get(srv.eta_source or "", "estimated")))
        else:
            label.show("")
        label.display = loading
        bar.set_class(loading, "-shown")
