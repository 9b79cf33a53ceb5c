"""Live tail of one unit's log: follows only at the bottom, `/` filter, pause, bounded ring buffer."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Input

from console.session import JournalLine
from console.ui.panes.base import Text, markup
from console.ui.panes.tail_view import TailView, clean_line
from console.ui.panes.messages import FilterClosed, JournalCommand, JournalLines, JournalUnit

MAX_LINES = 5000


class LineBatcher:
    """Hands lines on in batches: the first line after a quiet spell at once, then at most one batch
    per `delay` seconds while the log stays busy.

    A busy log (vLLM at startup) would otherwise cost one message and one repaint per line; a plain
    event-loop timer, armed only while lines wait, keeps a quiet log free.
    """

    def __init__(self, deliver: Callable[[list[JournalLine]], object], delay: float) -> None:
        self._deliver = deliver
        self._delay = delay
        self._lines: list[JournalLine] = []
        self._timer: asyncio.TimerHandle | None = None
        self._last = float("-inf")  # loop time of the last delivery

    def add(self, line: JournalLine) -> None:
        self._lines.append(line)
        if self._timer is None:
            loop = asyncio.get_running_loop()
            wait = max(0.0, self._last + self._delay - loop.time())
            self._timer = loop.call_later(wait, self.flush)

    def flush(self) -> None:
        self._timer = None
        lines, self._lines = self._lines, []
        if lines:
            self._last = asyncio.get_running_loop().time()
            self._deliver(lines)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._lines = []


class JournalPane(Vertical):
    DEFAULT_CSS = """
    JournalPane { border: round $primary 50%; height: 1fr; min-height: 6; }
    JournalPane:focus-within { border: round $accent; }
    JournalPane > #journal-status { height: 1; color: $text-muted; padding: 0 1; }
    JournalPane > #journal-filter { display: none; }
    JournalPane > #journal-filter.-shown { display: block; }
    JournalPane > TailView { height: 1fr; background: transparent; }
    """
    BINDINGS = [Binding("escape", "close_filter", "Close filter", show=False)]

    def __init__(self, max_lines: int = MAX_LINES, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "Journal"
        self.unit: str | None = None
        self.note: str | None = None
        # Cleaned text only (the unit is the pane's): a JournalLine object per line would cost more
        # memory than the text, and the view shares these very strings.
        self.buffer: deque[str] = deque(maxlen=max_lines)
        self.filter = ""
        self.paused = False
        self.new_lines = 0  # matching lines not yet seen (scrolled up or paused)
        self.shown = 0  # lines written to the view (for tests and the status line)

    def compose(self) -> ComposeResult:
        yield Text(self._status(), id="journal-status")
        yield Input(placeholder="filter (substring, case-insensitive; empty clears)", id="journal-filter")
        yield TailView(max_lines=self.buffer.maxlen or MAX_LINES, id="journal-log")

    def on_mount(self) -> None:
        self.watch(self.log_view, "scroll_y", self._scrolled, init=False)

    @property
    def log_view(self) -> TailView:
        return self.query_one("#journal-log", TailView)

    def _matches(self, text: str) -> bool:
        return not self.filter or self.filter in text.lower()

    def _status(self):
        parts = ["unit [b]$unit[/b]"]
        parts.append("[yellow]paused[/] (f resumes)" if self.paused else "[green]following[/]")
        if self.filter:
            parts.append("filter [b]$filter[/b]")
        if self.new_lines:
            parts.append(f"[reverse] {self.new_lines} new lines [/]")
        if self.note:
            parts.append("[dim]$note[/]")
        return markup(" │ ".join(parts), unit=self.unit or "—", filter=self.filter, note=self.note)

    def _refresh_status(self) -> None:
        self.query_one("#journal-status", Text).show(self._status())

    def on_journal_lines(self, message: JournalLines) -> None:
        lines = [clean_line(line.text) for line in message.lines]  # batched by the app's worker
        self.buffer.extend(lines)
        visible = [text for text in lines if self._matches(text)]
        if self.paused:
            self.new_lines += len(visible)
        elif visible:
            log = self.log_view
            at_end = log.is_vertical_scroll_end
            log.append(visible, follow=at_end)
            self.shown += len(visible)
            if not at_end:
                self.new_lines += len(visible)
        self._refresh_status()

    def on_journal_unit(self, message: JournalUnit) -> None:
        self.unit, self.note = message.unit, message.note
        self.buffer.clear()
        self.new_lines = 0
        self._rebuild()

    def on_journal_command(self, message: JournalCommand) -> None:
        if message.command == "toggle_follow":
            self.paused = not self.paused
            if not self.paused:
                self._rebuild()
            self._refresh_status()
        elif message.command == "filter":
            box = self.query_one("#journal-filter", Input)
            box.value = self.filter
            box.add_class("-shown")
            box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.filter = event.value.strip().lower()
        self._close_filter()
        self._rebuild()

    def action_close_filter(self) -> None:
        self._close_filter()

    def _close_filter(self) -> None:
        self.query_one("#journal-filter", Input).remove_class("-shown")
        self.post_message(FilterClosed())

    def _rebuild(self) -> None:
        """Redraw the view from the buffer (filter changed, unit changed, or resumed) and follow."""
        log = self.log_view
        log.clear()
        visible = [text for text in self.buffer if self._matches(text)]
        log.append(visible, follow=True)
        self.shown = len(visible)
        self.new_lines = 0
        self._refresh_status()

    def _scrolled(self, _old: float, _new: float) -> None:
        if self.new_lines and not self.paused and self.log_view.is_vertical_scroll_end:
            self.new_lines = 0
            self._refresh_status()
