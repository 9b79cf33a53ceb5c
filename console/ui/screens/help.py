"""`?`: every binding from the one table, with the keys in effect after the user keymap."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from console.ui.keys import KeySpec, display_key, effective_keys
from console.ui.panes.base import lines as join_lines
from console.ui.panes.base import markup
from console.version import DISTRIBUTION, package_version


def help_markup(specs: tuple[KeySpec, ...], keymap: dict[str, str], readonly: bool) -> Content:
    out: list[Content | str] = [markup("[b]$name[/b] $version", name=DISTRIBUTION, version=package_version()), "",
                                "[b]Keys[/b]" + ("  [cyan](read-only: mutating actions removed)[/]" if readonly else ""),
                                ""]
    for spec in specs:
        keys = ", ".join(display_key(k) for k in effective_keys(spec, keymap))
        out.append(markup("  [b]$keys[/b] $desc [dim]$id[/]", keys=f"{keys:<12}", desc=f"{spec.description:<16}",
                          id=spec.id))
    out += ["", "  [b]↑/↓ j/k[/b]      select a stage", "  [b]esc[/b]          close this help", "",
            markup("[dim]$text[/]", text='Remap in $XDG_CONFIG_HOME/eagle3-console/keys.toml, e.g.  [keys] stop_stage = "X"')]
    return join_lines(*out)


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 80; max-height: 90%; height: auto; border: round $accent;
                                  background: $surface; padding: 1 2; }
    """
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close", show=False)]

    def __init__(self, specs: tuple[KeySpec, ...], keymap: dict[str, str], readonly: bool) -> None:
        super().__init__()
        self.content = help_markup(specs, keymap, readonly)
        self.text = self.content.plain

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self.content, id="help-text")
