"""The server's systemd (or tmux) unit: state, since, restarts, main PID, memory."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content

from console.snapshot import ServiceInfo, Snapshot
from console.ui.panes.base import Pane, Text, lines, markup
from console.ui.panes.gauges import human_bytes, num

_STATE_COLOUR = {"active": "green", "activating": "yellow", "deactivating": "yellow",
                 "failed": "red", "inactive": "dim"}


def service_markup(svc: ServiceInfo) -> Content:
    colour = _STATE_COLOUR.get(svc.active_state, "white")
    result = svc.result if svc.result and svc.result != "success" else ""
    return lines(
        markup("unit     [b]$unit[/b] [dim]($manager)[/]", unit=svc.unit, manager=svc.manager),
        markup(f"state    [{colour}]$state ($sub)[/]" + ("  result $result" if result else ""),
               state=svc.active_state, sub=svc.sub_state, result=result),
        markup("since    $since", since=svc.since or "N/A"),
        markup("restarts $r   pid $pid   memory $mem", r=num(svc.restarts), pid=num(svc.main_pid),
               mem=human_bytes(svc.memory_bytes)),
    )


class ServicePane(Pane):
    TITLE = "Service"

    def compose_body(self) -> ComposeResult:
        yield Text("[dim]waiting for data…[/]", id="service-body")

    def render_snapshot(self, snapshot: Snapshot) -> None:
        self.query_one("#service-body", Text).show(service_markup(snapshot.service))
