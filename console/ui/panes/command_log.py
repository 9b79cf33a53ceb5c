"""Every action the operator took, the exact remote command(s) behind it, and the outcome."""
from __future__ import annotations

import time

from rich.text import Text as RichText
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import RichLog

from console.parsers.text import clean, clean_block
from console.ui.panes.messages import ActionDone


def action_lines(message: ActionDone) -> list[RichText]:
    result = message.result
    stamp = time.strftime("%H:%M:%S", time.localtime(message.at))
    mark, style = ("✔", "green") if result.ok else ("✖", "bold red")
    # plain Text (never markup), and cleaned again: an action's message can quote the host
    lines = [RichText.assemble((f"{stamp} ", "dim"), (f"{mark} {message.action}: ", style),
                               clean_block(result.message))]
    lines += [RichText.assemble(("  $ ", "dim"), (clean(cmd), "cyan")) for cmd in result.commands]
    return lines


class CommandLogPane(Vertical):
    DEFAULT_CSS = """
    CommandLogPane { border: round $primary 50%; height: 8; }
    CommandLogPane > RichLog { height: 1fr; background: transparent; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "Commands"
        self.entries: list[ActionDone] = []

    def compose(self) -> ComposeResult:
        yield RichLog(max_lines=500, wrap=True, markup=False, highlight=False, id="command-log")

    def on_action_done(self, message: ActionDone) -> None:
        self.entries = (self.entries + [message])[-100:]
        log = self.query_one(RichLog)
        for line in action_lines(message):
            log.write(line)
