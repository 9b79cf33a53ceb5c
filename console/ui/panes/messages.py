"""Messages the app posts to panes (and panes post back); the only way data moves between widgets."""
from __future__ import annotations

from textual.message import Message

from console.control.stages import ActionResult, JournalLine
from console.telemetry.snapshot import Snapshot


class SnapshotUpdated(Message):
    """A fresh snapshot; `now` is the app clock so panes can say how old their data is."""

    def __init__(self, snapshot: Snapshot, now: float) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.now = now


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
