"""The server's systemd (or tmux) unit: state, since, restarts, main PID, memory."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.markup import escape

from console.telemetry.snapshot import ServiceInfo, Snapshot
from console.ui.panes.base import Pane, Text
from console.ui.panes.gauges import human_bytes, num

_STATE_COLOUR = {"active": "green", "activating": "yellow", "deactivating": "yellow",
                 "failed": "red", "inactive": "dim"}


def service_markup(svc: ServiceInfo) -> str:
    colour = _STATE_COLOUR.get(svc.active_state, "white")
    result = f"  result {escape(svc.result)}" if svc.result and svc.result != "success" else ""
    return "\n".join([
        f"unit     [b]{escape(svc.unit)}[/b] [dim]({escape(svc.manager)})[/]",
        f"state    [{colour}]{escape(svc.active_state)} ({escape(svc.sub_state)})[/]{result}",
        f"since    {escape(svc.since or 'N/A')}",
        f"restarts {num(svc.restarts)}   pid {num(svc.main_pid)}   memory {human_bytes(svc.memory_bytes)}",
    ])


class ServicePane(Pane):
    TITLE = "Service"

    def compose_body(self) -> ComposeResult:
        yield Text("[dim]waiting for data…[/]", id="service-body")

    def render_snapshot(self, snapshot: Snapshot) -> None:
        self.query_one("#service-body", Text).show(service_markup(snapshot.service))
