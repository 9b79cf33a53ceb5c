"""Shared pane behaviour: error containment, data age, and repaint-only-on-change text."""
from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.markup import escape
from textual.widgets import Static

from console.telemetry.snapshot import Snapshot
from console.ui.panes.messages import SnapshotUpdated


class Text(Static):
    """A Static that repaints only when its markup actually changes (keeps idle CPU near zero)."""

    def __init__(self, markup: str = "", **kwargs) -> None:
        super().__init__(markup, **kwargs)
        self._markup = markup

    def show(self, markup: str) -> None:
        if markup != self._markup:
            # A relayout of the whole screen costs far more than repainting one widget: only ask for
            # one when the height can change (every Text here spans its container's width).
            layout = markup.count("\n") != self._markup.count("\n") or not markup or not self._markup
            self._markup = markup
            self.update(markup, layout=layout)

    @property
    def markup_text(self) -> str:
        return self._markup


def age_text(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


class Pane(Vertical):
    """A bordered pane fed by SnapshotUpdated; subclasses implement `compose_body` and `render_snapshot`.

    While the host is unreachable the pane keeps its last good data and says how old it is. An
    exception while rendering (bad or missing data) is shown inside the pane instead of reaching the app.
    """

    TITLE: ClassVar[str] = ""
    DEFAULT_CSS = """
    Pane { border: round $primary 50%; height: auto; padding: 0 1; }
    Pane:focus-within { border: round $accent; }
    Pane > .pane-error { color: $error; display: none; }
    Pane > .pane-error.-shown { display: block; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = self.TITLE
        self.last_good_at: float | None = None
        self.error: str | None = None
        self._subtitle = ""

    def compose(self) -> ComposeResult:
        yield from self.compose_body()
        yield Text(classes="pane-error")

    def compose_body(self) -> ComposeResult:
        return iter(())

    def render_snapshot(self, snapshot: Snapshot) -> None:
        raise NotImplementedError

    def on_snapshot_updated(self, message: SnapshotUpdated) -> None:
        snapshot = message.snapshot
        if snapshot.host.reachable or self.last_good_at is None:
            self.guarded(self.render_snapshot, snapshot)
            if snapshot.host.reachable:
                self.last_good_at = snapshot.taken_at or message.now
        stale = not snapshot.host.reachable and self.last_good_at is not None
        self.set_subtitle(f"data {age_text(message.now - self.last_good_at)} old" if stale else "")

    def guarded(self, draw, *args) -> None:
        """Run a drawing step; any exception becomes the pane's error line."""
        try:
            draw(*args)
        except Exception as exc:  # one pane's bad data must never take the app down
            self.show_error(f"cannot show this data: {type(exc).__name__}: {exc}")
        else:
            self.show_error(None)

    def show_error(self, text: str | None) -> None:
        self.error = text
        box = self.query_one(".pane-error", Text)
        box.show(f"⚠ {escape(text)}" if text else "")
        box.set_class(bool(text), "-shown")

    def set_subtitle(self, text: str) -> None:
        if text != self._subtitle:
            self._subtitle = text
            self.border_subtitle = text
