"""Shared pane behaviour: data binding, error containment, data age, and repaint-only-on-change text.

Panes get the app's snapshot through a bound reactive (`data_bind`: attributes down, messages up).
Text from the host or a profile is never parsed as markup: it goes into our own markup templates as
`$variables` (`markup()`), which Textual inserts as plain text whatever brackets or backslashes it holds.
"""
from __future__ import annotations

import time
from typing import ClassVar

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.reactive import var
from textual.widgets import Static

from console.snapshot import Snapshot


def markup(template: str, **values: object) -> Content:
    """Our markup template with `$name` values inserted as plain text (never parsed)."""
    return Content.from_markup(template, **{k: "" if v is None else str(v) for k, v in values.items()})


def lines(*parts: Content | str) -> Content:
    """Lines joined with newlines; a `str` part is our own markup."""
    return Content("\n").join(Content.from_markup(p) if isinstance(p, str) else p for p in parts)


class Text(Static):
    """A Static that repaints only when its content actually changes (keeps idle CPU near zero).
    A `str` is our own markup; remote text must come in a Content made by `markup()`."""

    def __init__(self, content: Content | str = "", **kwargs) -> None:
        content = Content.from_markup(content) if isinstance(content, str) else content
        super().__init__(content, **kwargs)
        self._content = content

    def show(self, content: Content | str) -> None:
        content = Content.from_markup(content) if isinstance(content, str) else content
        if content != self._content:
            # A relayout of the whole screen costs far more than repainting one widget: only ask for
            # one when the height can change (every Text here spans its container's width).
            old = self._content.plain
            layout = content.plain.count("\n") != old.count("\n") or not content.plain or not old
            self._content = content
            self.update(content, layout=layout)

    @property
    def markup_text(self) -> str:
        return self._content.markup

    @property
    def plain(self) -> str:
        return self._content.plain


def app_clock(node) -> float:
    clock = getattr(node.app, "clock", None)
    return clock() if callable(clock) else time.time()


def age_text(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


class Pane(Vertical):
    """A bordered pane bound to the app's snapshot; subclasses implement `compose_body` and
    `render_snapshot`.

    While the host is unreachable the pane keeps its last good data and says how old it is. An
    exception while rendering (bad or missing data) is shown inside the pane instead of reaching the app.
    """

    TITLE: ClassVar[str] = ""
    snapshot = var[Snapshot | None](None, init=False)  # bound to the app's
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

    def watch_snapshot(self, snapshot: Snapshot | None) -> None:
        if snapshot is None:
            return
        now = app_clock(self)
        try:
            reachable = bool(snapshot.host.reachable)
            taken_at = snapshot.taken_at
        except Exception:  # a malformed snapshot: shown as this pane's error below
            reachable, taken_at = True, None
        if reachable or self.last_good_at is None:
            self.guarded(self.render_snapshot, snapshot)
            if reachable:
                self.last_good_at = taken_at if isinstance(taken_at, (int, float)) and taken_at else now
        self.set_subtitle(f"data {age_text(now - self.last_good_at)} old"
                          if self.last_good_at is not None and not reachable else "")

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
        box.show(markup("⚠ $text", text=text) if text else "")
        box.set_class(bool(text), "-shown")

    def set_subtitle(self, text: str) -> None:
        if text != self._subtitle:
            self._subtitle = text
            self.border_subtitle = text
