"""Yes/No confirmation for destructive actions; "No" has focus so Enter (or Escape) is the safe answer.

`y` answers Yes and `n` No, and the dialog says so: a Yes needs a deliberate key (or Tab to it, then Enter).
A long detail scrolls (arrows, Page Up/Down): it is shown whole, never cut, since the Yes answers all of it."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from console.ui.panes.base import markup
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 100; max-width: 95%; height: auto; max-height: 95%; border: thick $error;
                               background: $surface; padding: 1 2; }
    ConfirmScreen #confirm-scroll { height: auto; max-height: 24; margin-top: 1; }
    ConfirmScreen #confirm-detail { color: $text-muted; }
    ConfirmScreen #confirm-keys { color: $text-muted; margin-top: 1; }
    ConfirmScreen Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    ConfirmScreen Button { margin-left: 2; }
    """
    BINDINGS = [Binding("escape", "answer(False)", "No", show=False),
                Binding("n", "answer(False)", "No", show=False),
                Binding("y", "answer(True)", "Yes", show=False),
                # a long detail (prune lists every run it deletes) scrolls, whichever button has the focus
                Binding("up", "scroll(-1)", show=False), Binding("down", "scroll(1)", show=False),
                Binding("pageup", "scroll(-10)", show=False), Binding("pagedown", "scroll(10)", show=False)]

    def __init__(self, question: str, detail: str = "") -> None:
        super().__init__()
        self.question = question
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(markup("[b]$q[/b]", q=self.question), id="confirm-question")
            if self.detail:
                with VerticalScroll(id="confirm-scroll", can_focus=False):
                    yield Static(markup("$d", d=self.detail), id="confirm-detail")
            yield Static("[b]y[/b] yes    [b]n[/b], [b]Esc[/b] or [b]Enter[/b] no    [b]Tab[/b] moves between "
                         "the buttons", id="confirm-keys")
            with Horizontal():
                yield Button("Yes", variant="error", id="yes")
                yield Button("No", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_scroll(self, lines: int) -> None:
        for scroll in self.query("#confirm-scroll").results(VerticalScroll):
            scroll.scroll_relative(y=lines, animate=False)

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
