"""A scrolling view of plain log lines that grows without relayouting the screen.

Textual's Log/RichLog change `virtual_size`, a layout reactive, on every write: each batch of journal
lines then costs a full screen reflow (~8 ms here, most of the console's idle CPU). The view's outer
size never changes when lines arrive, so only a scrollbar appearing or disappearing needs a layout;
every other append updates the scroll extent quietly and repaints this widget alone.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from console.parsers.text import clean

# A log line must never drive the terminal: one sanitizer for all remote text (console/parsers/text.py).
clean_line = clean


class TailView(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    TailView { background: $surface; }
    """

    def __init__(self, max_lines: int = 5000, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lines: deque[str] = deque(maxlen=max_lines)
        self._width = 0
        self._first = 0  # absolute number of the line at lines[0] (keys the cache across pruning)
        self._style: Style | None = None  # resolved once: looking it up per line cost more than drawing the line
        self._cache: dict[tuple[int, int, int], Strip] = {}

    @property
    def line_count(self) -> int:
        return len(self.lines)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._style = None
        self._cache.clear()

    def clear(self) -> None:
        self._first += len(self.lines)
        self._cache.clear()
        self.lines.clear()
        self._width = 0
        self._set_extent()
        self.scroll_to(0, 0, animate=False, immediate=True)
        self.refresh()

    def append(self, texts: Iterable[str], follow: bool) -> None:
        """Add lines; scroll to the new end only if `follow` (the caller knows if we were at the end)."""
        for text in texts:
            line = clean_line(text)
            if len(self.lines) == self.lines.maxlen:
                self._first += 1
            self.lines.append(line)
            self._width = max(self._width, cell_len(line))
        relayout = self._set_extent()
        if follow:
            # After a relayout the end is only known once it has happened.
            self.scroll_end(animate=False, immediate=not relayout, x_axis=False)
        self.refresh()

    def _set_extent(self) -> bool:
        """Set the scrollable size; True if that needed a layout (which happens later)."""
        new = Size(self._width, len(self.lines))
        if new == self.virtual_size:
            return False
        region = self.scrollable_content_region
        if (new.height > region.height) != self.show_vertical_scrollbar or \
                (new.width > region.width) != self.show_horizontal_scrollbar:
            self.virtual_size = new  # a scrollbar comes or goes: a real layout is needed
            return True
        self.set_reactive(ScrollView.virtual_size, new)
        if self.show_vertical_scrollbar:
            self.vertical_scrollbar.window_virtual_size = new.height
        if self.show_horizontal_scrollbar:
            self.horizontal_scrollbar.window_virtual_size = new.width
        return False

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        if self._style is None:
            self._style = self.rich_style
        style = self._style
        if index >= len(self.lines):
            return Strip.blank(width, style)
        # Following a log scrolls every line each batch: the same line is drawn again one row up.
        key = (self._first + index, scroll_x, width)
        strip = self._cache.get(key)
        if strip is None:
            if len(self._cache) > 4 * max(self.size.height, 50):
                self._cache.clear()
            text = self.lines[index]
            strip = Strip([Segment(text, style)], cell_len(text)).crop_extend(scroll_x, scroll_x + width, style)
            self._cache[key] = strip
        return strip
