"""The pipeline as a selectable list: each stage's state and the unit/session it runs in (the rows and
their labels are the stage table's, console/control/stages.py)."""
from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from console.control import stages
from console.snapshot import Snapshot
from console.ui.panes.base import Pane, markup
from console.ui.panes.messages import StageSelected

# "?" is kept for what the console cannot tell (stale: no finish and no unit); a stop is a known end
_STATE_STYLE = {"running": ("▶", "yellow"), "done": ("✔", "green"), "failed": ("✖", "red"),
                "stopped": ("■", "blue"), "stale": ("?", "magenta"), "idle": ("·", "dim")}


@dataclass(frozen=True)
class StageRow:
    stage: str
    state: str
    unit: str | None
    detail: str = ""


def stage_rows(snapshot: Snapshot) -> list[StageRow]:
    svc, srv = snapshot.service, snapshot.server
    rows = []
    for spec in stages.table():
        stage = spec.name
        if spec.kind == "server":
            if (stage == "serve_drafter") != (srv.drafter is not None):  # the other server is the one followed
                rows.append(StageRow(stage, "idle", None))
                continue
            if srv.phase == "failed" or svc.active_state == "failed":
                state = "failed"
            elif svc.active_state in ("active", "activating", "reloading"):
                state = "running"
            else:
                state = "idle"
            rows.append(StageRow(stage, state, svc.unit, str(srv.phase)))
            continue
        run = stages.pick_run(snapshot.runs, stage)
        if run is None:
            rows.append(StageRow(stage, "idle", None))
        else:
            # A percentage, not done/total: it changes rarely, and each change redraws the list.
            detail = f"{100 * run.done // run.total}%" if run.total else ""
            rows.append(StageRow(stage, run.state, run.unit, detail))
    return rows


_FIXED = 36  # cells before the unit column


def row_markup(row: StageRow, width: int = 80) -> Content:
    """One line per stage even in a narrow pane: the unit name is cut rather than the row wrapped."""
    icon, colour = _STATE_STYLE.get(row.state, ("?", "white"))
    room = max(1, width - _FIXED)
    unit = row.unit or "—"
    unit = unit if len(unit) <= room else unit[: room - 1] + "…"
    return markup(f"[{colour}]$icon $label$state[/]$detail[dim]$unit[/]", icon=icon,
                  label=f"{_label(row.stage):<14}", state=f"{row.state:<8}",
                  detail=f"{row.detail[:11]:<12}", unit=unit)


def _label(stage: str) -> str:
    try:
        return stages.get(stage).label
    except stages.UnknownStage:
        return stage


class StageList(OptionList):
    BINDINGS = [Binding("j", "cursor_down", "Down", show=False),
                Binding("k", "cursor_up", "Up", show=False)]


class StagesPane(Pane):
    TITLE = "Stages"
    DEFAULT_CSS = """
    StagesPane > StageList { height: auto; border: none; padding: 0; background: transparent; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._names = stages.names()
        self._prompts = {stage: row_markup(StageRow(stage, "idle", None)) for stage in self._names}

    def compose_body(self) -> ComposeResult:
        yield StageList(*[Option(self._prompts[s], id=s) for s in self._names], id="stage-list")

    def on_mount(self) -> None:
        self.query_one(StageList).highlighted = 0

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option.id:
            self.post_message(StageSelected(event.option.id))

    def render_snapshot(self, snapshot: Snapshot) -> None:
        self._rows = stage_rows(snapshot)
        self._draw()

    def on_resize(self) -> None:
        if getattr(self, "_rows", None):
            self.guarded(self._draw)

    def _draw(self) -> None:
        stage_list = self.query_one(StageList)
        width = stage_list.scrollable_content_region.width or 80
        for row in self._rows:
            prompt = row_markup(row, width)
            if self._prompts.get(row.stage) != prompt:
                self._prompts[row.stage] = prompt
                stage_list.replace_option_prompt(row.stage, prompt)
