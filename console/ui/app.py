"""The operations console: wires the controller's streams to the panes and keys to controller actions.

Data flows one way: one long-lived worker reads snapshots and posts a SnapshotUpdated to each pane;
another follows the selected unit's journal. Actions run as short workers and report the exact remote
commands to the command log. Quitting only closes the controller: nothing on the host is stopped.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import Awaitable, Callable

from textual import work
from textual.app import App, ComposeResult
from textual.containers import Horizontal, ScrollableContainer, Vertical
from textual.reactive import var
from textual.screen import ModalScreen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from console.control import stages
from console.session import ActionResult, Controller, JournalLine
from console.ui.panes.gauges import human_bytes
from console.parsers.text import clean_block
from console.profile import NotifySection
from console.ui.calls import CallEvent, Caller
from console.ui.keys import KEYS, MUTATING_ACTIONS, app_bindings, load_keymap, visible_keys
from console.snapshot import Snapshot
from console.telemetry.history import History
from console.ui.panes.bench import BenchPane
from console.ui.panes.command_log import CommandLogPane
from console.ui.panes.disk import DiskPane
from console.ui.panes.generation import GenerationPane
from console.ui.panes.gpus import GpusPane
from console.ui.panes.header import ConnectionBanner, HeaderPane
from console.ui.panes.journal import JournalPane, LineBatcher
from console.ui.panes.messages import (ActionDone, FilterClosed, JournalCommand, JournalLines, JournalUnit,
                                    StageSelected, StreamProblem)
from console.ui.panes.notices import transitions
from console.ui.panes.readiness import ReadinessPane
from console.ui.panes.service import ServicePane
from console.ui.panes.stages import StageList, StagesPane, stage_rows
from console.ui.panes.training import TrainingPane
from console.ui.screens.confirm import ConfirmScreen
from console.ui.screens.help import HelpScreen

RETRY_S = 2.0
TABLE_ACTIONS = frozenset(spec.action for spec in KEYS)
JOURNAL_BATCH_S = 0.5  # a busy journal is drawn at most twice a second


class ConsoleApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "eagle3-console"
    BINDINGS = app_bindings()
    ENABLE_COMMAND_PALETTE = False  # its actions would bypass --readonly
    AUTO_FOCUS = None  # on_mount focuses the stage list without scrolling the pane area to it
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]  # sets the screen class app.tcss uses
    # the latest snapshot; every pane's own `snapshot` is bound to it
    snapshot = var[Snapshot | None](None, init=False)

    def __init__(self, controller: Controller, readonly: bool = False,
                 keymap_path: str | os.PathLike[str] | None = None, *,
                 clock: Callable[[], float] | None = None, notify: NotifySection | None = None) -> None:
        # Load the keymap first: a bad file must fail before anything starts (KeymapError names it).
        self.keymap = load_keymap(keymap_path)
        super().__init__()
        self.controller = controller
        self.readonly = readonly or controller.readonly
        self.clock = clock or time.time
        self.selected_stage: str = stages.names()[0]
        self.journal_unit: str | None = None
        self.journal_stage: str | None = None  # the stage whose newest run the log view follows
        self.last_snapshot: Snapshot | None = None
        self.results: list[tuple[str, ActionResult]] = []
        self._prev: Snapshot | None = None
        self._closed = False
        # bell, tmux message, notify command when a load or a stage ends (also read-only)
        self.caller = Caller(notify, bell=self.bell) if notify is not None else None
        self.history: History = controller.history  # the controller feeds it with every snapshot

    def compose(self) -> ComposeResult:
        c = self.controller
        bound = ConsoleApp.snapshot
        with Vertical(id="top"):
            yield HeaderPane(c.profile_name, c.host_name, c.simulated, self.clock, self.readonly,
                             id="header").data_bind(bound)
            yield ConnectionBanner(id="banner").data_bind(bound)
        # Scrollable: many GPUs or a short terminal must not push the journal or header off screen.
        with ScrollableContainer(id="main", can_focus=False):
            with Vertical(id="left"):
                yield ServicePane(id="service").data_bind(bound)
                yield ReadinessPane(id="readiness").data_bind(bound)
                yield StagesPane(id="stages").data_bind(bound)
            with Vertical(id="right"):
                yield GpusPane(id="gpus").data_bind(bound)
                yield GenerationPane(id="generation").data_bind(bound)
                yield TrainingPane(id="training").data_bind(bound)
                yield BenchPane(id="bench").data_bind(bound)
                yield DiskPane(id="disk").data_bind(bound)
        with Horizontal(id="bottom"):
            yield JournalPane(id="journal")
            yield CommandLogPane(id="commands")
        yield Footer()

    def on_mount(self) -> None:
        if self.keymap:
            self.set_keymap(self.keymap)
        self.query_one(StageList).focus(scroll_visible=False)
        self._consume_snapshots()

    # -- streams ---------------------------------------------------------------------------------

    @work(exclusive=True, group="snapshots", exit_on_error=False)
    async def _consume_snapshots(self) -> None:
        while True:
            try:
                async for snapshot in self.controller.snapshots():
                    self.dispatch_snapshot(snapshot)
                if self.controller.final_error:
                    return  # refused for good (a key or host key): the banner says what to do
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the session should reconnect itself; this is the last net
                self.query_one(ConnectionBanner).post_message(StreamProblem(f"{type(exc).__name__}: {exc}"))
            await asyncio.sleep(RETRY_S)

    @work(group="calls", exit_on_error=False)
    async def _call(self, event: CallEvent) -> None:
        assert self.caller is not None
        for problem in await self.caller.call(event):
            self.notify(problem, severity="warning", markup=False)

    def dispatch_snapshot(self, snapshot: Snapshot) -> None:
        self.last_snapshot = snapshot
        self.snapshot = snapshot
        try:
            notices = transitions(self._prev, snapshot)
            unit = snapshot.service.unit
            reachable = bool(snapshot.host.reachable)
        except Exception:  # malformed snapshot: the panes show the error, no toast
            notices, unit, reachable = [], None, False
        for notice in notices:
            self.notify(notice.text, severity=notice.severity, markup=False)  # type: ignore[arg-type]
            if self.caller is not None and notice.event:
                self._call(CallEvent(event=notice.event, text=notice.text, profile=self.controller.profile_name,
                                     host=self.controller.host_name, ts=self.clock(), stage=notice.stage,
                                     run_id=notice.run_id, model=notice.model, error=notice.error))
        if reachable:
            self._prev = snapshot
        if self.journal_unit is None and isinstance(unit, str) and unit:
            self.follow_unit(unit)
        elif self.journal_stage is not None:
            # `l` follows a stage, not one run of it: a new run of that stage takes over the view
            current = self._unit_of(self.journal_stage)
            if current and current != self.journal_unit:
                self.follow_unit(current, stage=self.journal_stage)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Workers catch what they expect; anything else is a bug, shown rather than fatal.
        if event.state == WorkerState.ERROR:
            self.notify(f"{event.worker.name or event.worker.group}: {event.worker.error!r}",
                        title="internal error", severity="error", markup=False)

    def follow_unit(self, unit: str, stage: str | None = None) -> None:
        self.journal_unit, self.journal_stage = unit, stage
        self.query_one(JournalPane).post_message(JournalUnit(unit))
        self._follow_journal(unit)

    @work(exclusive=True, group="journal", exit_on_error=False)
    async def _follow_journal(self, unit: str) -> None:
        pane = self.query_one(JournalPane)
        batcher = LineBatcher(lambda lines: pane.post_message(JournalLines(lines)), JOURNAL_BATCH_S)
        try:
            while True:
                try:
                    async for line in self.controller.journal(unit):
                        batcher.add(line)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    batcher.add(JournalLine(f"[console] log stream failed: {type(exc).__name__}: {exc}; "
                                            "retrying", unit))
                await asyncio.sleep(RETRY_S)
        finally:
            batcher.cancel()  # lines of a unit no longer followed must not reach the pane

    # -- selection and view keys -----------------------------------------------------------------

    def on_stage_selected(self, message: StageSelected) -> None:
        self.selected_stage = message.stage

    def on_filter_closed(self, _message: FilterClosed) -> None:
        self.query_one(StageList).focus(scroll_visible=False)

    def action_filter(self) -> None:
        self.query_one(JournalPane).post_message(JournalCommand("filter"))

    def action_toggle_follow(self) -> None:
        self.query_one(JournalPane).post_message(JournalCommand("toggle_follow"))

    def action_show_log(self) -> None:
        unit = self._unit_of(self.selected_stage)
        if unit is None:
            self.notify(f"Stage {self.selected_stage} has no unit yet (not started?)", severity="warning",
                        markup=False)
            return
        if unit != self.journal_unit:
            self.follow_unit(unit, stage=self.selected_stage)
        else:
            self.journal_stage = self.selected_stage

    def _unit_of(self, stage: str) -> str | None:
        if self.last_snapshot is None:
            return None
        try:
            return next((row.unit for row in stage_rows(self.last_snapshot) if row.stage == stage), None)
        except Exception:
            return None

    def action_help(self) -> None:
        self.push_screen(HelpScreen(visible_keys(self.readonly), self.keymap, self.readonly))

    async def action_quit(self) -> None:
        await self.close_controller()
        self.exit()

    async def close_controller(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                await asyncio.wait_for(self.controller.close(), timeout=5.0)
            except Exception:
                pass  # quitting must not hang or fail on a dead connection

    async def on_unmount(self) -> None:
        await self.close_controller()

    # -- actions on the host ---------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if self.readonly and action in MUTATING_ACTIONS:
            return False  # absent from the footer, and the key does nothing
        if isinstance(self.screen, ModalScreen) and action in TABLE_ACTIONS and action != "help":
            return False  # no second dialog stacked on a confirmation (Tab must still move focus)
        return True

    def _refused(self, action: str) -> bool:
        if self.readonly and action in MUTATING_ACTIONS:
            self.notify(f"read-only console: {action} is not available", severity="warning", markup=False)
            return True
        return False

    def action_start_stage(self) -> None:
        if self._refused("start_stage"):
            return
        stage = self.selected_stage
        if stage == "serve_drafter":
            self.action_serve_drafter()
            return
        if stage == "bench":
            self.action_bench()
            return
        if self.controller.stops_baseline(stage) and stage == "pipeline":
            self._confirm(f"Start {stage}? It stops the vLLM server.",
                          f"On {self.controller.host_name}: {self.controller.downtime(stage)}.", f"start {stage}",
                          lambda: self.controller.start_stage(stage))
            return
        if self.controller.stops_baseline(stage):
            self._confirm(f"Start {stage}? It stops the vLLM server for a while.",
                          f"The extraction server needs the GPUs: it stops the server on {self.controller.host_name}, serves "
                          f"the verifier in extraction mode, and starts the server again when it is done (also "
                          f"after a failure). Downtime: {self.controller.downtime(stage)}.", f"start {stage}",
                          lambda: self.controller.start_stage(stage))
            return
        self._run(f"start {stage}", lambda: self.controller.start_stage(stage))

    def action_stop_stage(self) -> None:
        if self._refused("stop_stage"):
            return
        stage = self.selected_stage
        unit = self._unit_of(stage)
        self._confirm(f"Stop stage {stage}?", f"Stops {unit or 'its unit'} on {self.controller.host_name}.",
                      f"stop {stage}", lambda: self.controller.stop_stage(stage))

    def action_restart_server(self) -> None:
        if self._refused("restart_server"):
            return
        self._confirm("Restart the vLLM server?",
                      f"The model reloads on {self.controller.host_name}; requests fail until it is ready.",
                      "restart server", self.controller.restart_server)

    def action_serve_drafter(self) -> None:
        if self._refused("serve_drafter"):
            return
        self._confirm("Serve the drafter? It stops the baseline vLLM server.",
                      f"Stops the baseline server on {self.controller.host_name} and starts vLLM with the latest "
                      f"verified drafter checkpoint as its own unit (<server unit>-drafter); requests fail until it "
                      f"is ready. `b` serves the baseline again. Downtime: {self.controller.downtime('serve-drafter')}.",
                      "serve drafter", self.controller.serve_drafter)

    def action_serve_baseline(self) -> None:
        if self._refused("serve_baseline"):
            return
        self._confirm("Serve the baseline? It stops the drafter server.",
                      f"Stops the drafter server (when it runs) on {self.controller.host_name} and starts the "
                      f"baseline server again; requests fail until it is ready. Downtime: "
                      f"{self.controller.downtime('serve-baseline')}.", "serve baseline",
                      self.controller.serve_baseline)

    def action_bench(self) -> None:
        if self._refused("bench"):
            return
        self._confirm("Bench baseline against drafter? It swaps the servers.",
                      f"One detached program on {self.controller.host_name} benches the baseline server, stops it, "
                      f"serves the verified drafter, benches that, and serves the baseline again at the end (also "
                      f"after a failure). It survives closing the console. Downtime: "
                      f"{self.controller.downtime('bench')}.", "start bench",
                      lambda: self.controller.start_stage("bench"))

    def action_deep_check(self) -> None:
        self._run("deep check", self.controller.deep_check)

    def action_disk(self) -> None:
        self.run_worker(self._survey_disk(), group="disk", exclusive=True, exit_on_error=False)

    async def _survey_disk(self) -> None:
        pane = self.query_one(DiskPane)
        pane.set_subtitle("sizing runs…")
        try:
            pane.show_report(await self.controller.disk_report())
        except Exception as exc:  # DiskError, HostError: said in the pane
            pane.show_problem(f"{type(exc).__name__}: {exc}")
        finally:
            pane.set_subtitle("")
        pane.scroll_visible()

    def action_prune(self) -> None:
        if self._refused("prune"):
            return
        self.run_worker(self._ask_to_prune(), group="disk", exclusive=True, exit_on_error=False)

    async def _ask_to_prune(self) -> None:
        try:
            plan = await self.controller.prune_plan()
        except Exception as exc:
            self.notify(f"prune: {type(exc).__name__}: {exc}", severity="error", markup=False)
            return
        kept = "\n".join(f"kept: {r.name} ({r.reason})" for r in plan.keep)
        left = "\n".join(f"left out: {s}" for s in plan.skipped)
        if not plan.delete:
            short = "\n".join(kept.splitlines()[:6] + left.splitlines()[:3])
            self.notify(clean_block(f"nothing to prune\n{short}".strip()), markup=False)
            return
        # every run the Yes deletes, each with its size and what it breaks: the list is the agreement
        names = [r.name for r in plan.delete]
        shown = "\n".join(f"{human_bytes(r.size):>10}  {r.stage or '?'} {r.state}  {r.name}"
                          f"  ({r.breaks or 'breaks nothing'})" for r in plan.delete)
        self._confirm(f"Delete these {len(names)} run(s), {human_bytes(plan.total_bytes)} on "
                      f"{self.controller.host_name}?", clean_block(f"{shown}\n{kept}\n{left}".strip()), "prune",
                      lambda: self._prune_then_refresh(names))

    async def _prune_then_refresh(self, names: list[str]) -> ActionResult:
        result = await self.controller.prune_runs(names)
        self.action_disk()
        return result

    def _confirm(self, question: str, detail: str, name: str,
                 call: Callable[[], Awaitable[ActionResult]]) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self._run(name, call)
            else:
                self.notify(f"{name}: cancelled", timeout=2, markup=False)
        self.push_screen(ConfirmScreen(question, detail), answered)

    def _run(self, name: str, call: Callable[[], Awaitable[ActionResult]]) -> None:
        self.run_worker(self._perform(name, call), group="actions", exit_on_error=False)

    async def _perform(self, name: str, call: Callable[[], Awaitable[ActionResult]]) -> None:
        try:
            result = await call()
        except Exception as exc:
            result = ActionResult(False, f"{type(exc).__name__}: {exc}")
        self.results.append((name, result))
        self.query_one(CommandLogPane).post_message(ActionDone(name, result, self.clock()))
        commands = "\n".join(f"$ {c}" for c in result.commands)
        self.notify(clean_block(f"{result.message}\n{commands}".strip()),
                    title=f"{name}: {'ok' if result.ok else 'failed'}",
                    severity="information" if result.ok else "error", markup=False)
