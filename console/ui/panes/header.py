"""Top line (profile, host, connection, RTT, SIMULATED badge, clock) and the connection-lost banner."""
from __future__ import annotations

import time
from typing import Callable

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.reactive import var

from console.snapshot import Snapshot
from console.ui.panes.base import Text, age_text, app_clock, markup
from console.ui.panes.messages import StreamProblem


def connection_markup(reachable: bool | None, rtt_ms: float | None, error: str | None,
                      not_answering: bool = False) -> str:
    if reachable is None:
        return "[yellow]◌ connecting…[/]"
    if reachable:
        rtt = f" {rtt_ms:.0f} ms" if rtt_ms is not None else ""
        return f"[green]● connected{rtt}[/]"
    if not_answering:
        return "[red]✖ not answering[/] [dim]waiting…[/]"
    return "[red]✖ disconnected[/]" + (" [dim]reconnecting…[/]" if error else "")


class HeaderPane(Horizontal):
    snapshot = var[Snapshot | None](None, init=False)  # bound to the app's
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
        self._not_answering = False
        self._sim_text: str | None = None
        self._sim_engine = False

    def compose(self) -> ComposeResult:
        yield Text(self._left(), id="header-left")
        yield Text(self._clock_text(), id="header-clock")

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)

    def _tick(self) -> None:
        self.query_one("#header-clock", Text).show(self._clock_text())

    def _clock_text(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.clock()))

    def _left(self) -> Content:
        template = " │ ".join(
            ["[b]eagle3-console[/b]", "profile [b]$profile[/b]", "host [b]$host[/b]",
             connection_markup(self.reachable, self._rtt, self._error, self._not_answering)]
            # the real engine on simulated GPUs: the text says both (http_checks.demo_engine_text)
            + (["[reverse yellow] $engine [/]" if self._sim_engine else "[reverse yellow] SIMULATED$what [/]"]
               if self.simulated else [])
            + (["[reverse cyan] READ-ONLY [/]"] if self.readonly else []))
        return markup(template, profile=self.profile, host=self.host,
                      what=f": {self._sim_text}" if self._sim_text else "", engine=self._sim_text or "")

    def watch_snapshot(self, snapshot: Snapshot | None) -> None:
        if snapshot is None:
            return
        host = snapshot.host
        self.reachable, self._rtt, self._error = host.reachable, host.rtt_ms, host.error
        self._not_answering = getattr(host, "not_answering_since", None) is not None
        self.simulated = self.simulated or host.simulated
        self._sim_text = getattr(host, "sim_text", None) or self._sim_text
        self._sim_engine = bool(getattr(host, "sim_engine", False)) or self._sim_engine
        self.query_one("#header-left", Text).show(self._left())


class ConnectionBanner(Text):
    """Visible only while the host is unreachable or not answering, or the snapshot stream failed."""

    snapshot = var[Snapshot | None](None, init=False)  # bound to the app's

    DEFAULT_CSS = """
    ConnectionBanner { display: none; background: $error; color: $text; padding: 0 1; height: auto; }
    ConnectionBanner.-shown { display: block; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.down_since: float | None = None

    def watch_snapshot(self, snapshot: Snapshot | None) -> None:
        if snapshot is None:
            return
        host = snapshot.host
        now = app_clock(self)
        if host.reachable:
            self.down_since = None
            self._set(None)
            return
        since = getattr(host, "not_answering_since", None)
        if self.down_since is None:
            self.down_since = since if since is not None else now
        if since is not None:
            self._set(markup("$name is not answering (for $age); the panes show the last known state",
                             name=host.name, age=age_text(now - since)))
            return
        self._set(markup("Connection to $name lost: $why — reconnecting automatically (down $age)",
                         name=host.name, why=host.error or "no answer", age=age_text(now - self.down_since)))

    def on_stream_problem(self, message: StreamProblem) -> None:
        self._set(markup("Status stream failed: $text — retrying", text=message.text))

    def _set(self, content: Content | None) -> None:
        self.show(content or "")
        self.set_class(content is not None, "-shown")
