"""Top line (profile, host, connection, RTT, SIMULATED badge, clock) and the connection-lost banner."""
from __future__ import annotations

import time
from typing import Callable

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.markup import escape

from console.ui.panes.base import Text, age_text
from console.ui.panes.messages import SnapshotUpdated, StreamProblem


def connection_markup(reachable: bool | None, rtt_ms: float | None, error: str | None) -> str:
    if reachable is None:
        return "[yellow]◌ connecting…[/]"
    if reachable:
        rtt = f" {rtt_ms:.0f} ms" if rtt_ms is not None else ""
        return f"[green]● connected{rtt}[/]"
    return "[red]✖ disconnected[/]" + (" [dim]reconnecting…[/]" if error else "")


class HeaderPane(Horizontal):
    DEFAULT_CSS = """
    HeaderPane { height: 1; background: $panel; }
    HeaderPane > #header-left { width: 1fr; }
    HeaderPane > #header-clock { width: auto; padding: 0 1; }
    """

    def __init__(self, profile: str, host: str, simulated: bool, clock: Callable[[], float],
                 readonly: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.profile = profile
        self.host = host
        self.simulated = simulated
        self.readonly = readonly
        self.clock = clock
        self.reachable: bool | None = None
        self._rtt: float | None = None
        self._error: str | None = None
        self._sim_text: str | None = None

    def compose(self) -> ComposeResult:
        yield Text(self._left(), id="header-left")
        yield Text(self._clock_text(), id="header-clock")

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)

    def _tick(self) -> None:
        self.query_one("#header-clock", Text).show(self._clock_text())

    def _clock_text(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.clock()))

    def _left(self) -> str:
        parts = [f"[b]eagle3-console[/b]", f"profile [b]{escape(self.profile)}[/b]",
                 f"host [b]{escape(self.host)}[/b]", connection_markup(self.reachable, self._rtt, self._error)]
        if self.simulated:
            what = f": {escape(self._sim_text)}" if self._sim_text else ""
            parts.append(f"[reverse yellow] SIMULATED{what} [/]")
        if self.readonly:
            parts.append("[reverse cyan] READ-ONLY [/]")
        return " │ ".join(parts)

    def on_snapshot_updated(self, message: SnapshotUpdated) -> None:
        host = message.snapshot.host
        self.reachable, self._rtt, self._error = host.reachable, host.rtt_ms, host.error
        self.simulated = self.simulated or host.simulated
        self._sim_text = getattr(host, "sim_text", None) or self._sim_text
        self.query_one("#header-left", Text).show(self._left())


class ConnectionBanner(Text):
    """Visible only while the host is unreachable or the snapshot stream failed."""

    DEFAULT_CSS = """
    ConnectionBanner { display: none; background: $error; color: $text; padding: 0 1; height: auto; }
    ConnectionBanner.-shown { display: block; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.down_since: float | None = None

    def on_snapshot_updated(self, message: SnapshotUpdated) -> None:
        host = message.snapshot.host
        if host.reachable:
            self.down_since = None
            self._set(None)
            return
        if self.down_since is None:
            self.down_since = message.now
        why = escape(host.error or "no answer")
        self._set(f"Connection to {escape(host.name)} lost: {why} — reconnecting automatically "
                  f"(down {age_text(message.now - self.down_since)})")

    def on_stream_problem(self, message: StreamProblem) -> None:
        self._set(f"Status stream failed: {escape(message.text)} — retrying")

    def _set(self, text: str | None) -> None:
        self.show(text or "")
        self.set_class(bool(text), "-shown")
