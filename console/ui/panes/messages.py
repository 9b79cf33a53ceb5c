"""Messages between the app and its widgets: journal lines and commands for the log view, and what
panes post up (a stage selected, the filter closed). Snapshots reach panes by data binding instead."""
from __future__ import annotations

from textual.message import Message

from console.session import ActionResult, JournalLine


class JournalLines(Message):
    def __init__(self, lines: list[JournalLine]) -> None:
        super().__init__()
        self.lines = lines


class JournalUnit(Message):
    """The journal pane now follows `unit` (its old lines are cleared)."""

    def __init__(self, unit: str, note: str | None = None) -> None:
        super().__init__()
        self.unit = unit
        self.note = note


class JournalCommand(Message):
    """A key handled by the app on the journal's behalf: "filter" or "toggle_follow"."""

    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command


class ActionDone(Message):
    def __init__(self, action: str, result: ActionResult, at: float) -> None:
        super().__init__()
        self.action = action
        self.result = result
        self.at = at


class StageSelected(Message):
    """Posted by the stages pane; bubbles to the app, which owns the selection."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage


class StreamProblem(Message):
    """The snapshot stream itself failed (not the host): shown in the banner until the next snapshot."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class FilterClosed(Message):
    """The journal filter input closed; the app puts focus back on the stage list."""
