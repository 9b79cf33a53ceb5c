"""Pilot tests: keys pressed, widget state checked, and the exact actions the fake controller received.

The fake, because these are states the demo host cannot be put in on cue (a failed load, eight GPUs at
given figures, a stream that breaks, an action that raises); tests/test_app_live.py presses every key on
the real Session against the demo host and checks the host."""
from __future__ import annotations

import dataclasses
import html

import pytest
from textual.widgets import Button, Input

from console.control.stages import STAGES
from console.ui.app import ConsoleApp
from harness.polling import until
from console.session import ActionResult
from harness.fake_controller import (SERVER_UNIT, FakeController, base_snapshot, generation_run,
                                     stage_unit, training_run)
from console.ui.panes.command_log import CommandLogPane
from console.ui.panes.journal import JournalPane
from console.ui.panes.stages import StageList
from console.ui.screens.confirm import ConfirmScreen
from console.ui.screens.help import HelpScreen

pytestmark = pytest.mark.timeout(30)
SIZE = (160, 50)


def make_app(fake: FakeController | None = None, **kwargs) -> tuple[ConsoleApp, FakeController]:
    fake = fake or FakeController([base_snapshot()])
    return ConsoleApp(fake, clock=lambda: 1_700_000_010.0, **kwargs), fake


async def actions_done(app: ConsoleApp, pilot, count: int = 1) -> None:
    """Wait (bounded) until `count` actions have reported back."""
    for _ in range(100):
        if len(app.results) >= count:
            break
        await pilot.pause(0.02)
    await pilot.pause()


async def wait_for(pilot, condition, timeout: float = 3.0) -> None:
    """Pause until `condition()` holds (journal lines arrive in batches every 0.25 s)."""
    await until(condition, timeout=timeout, interval=0.02, pause=pilot.pause)
    await pilot.pause()


async def select(pilot, stage_index: int) -> None:
    for _ in range(stage_index):
        await pilot.press("j")
    await pilot.pause()


async def test_stop_asks_and_enter_means_no():
    app, fake = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.focused is not None and app.screen.focused.id == "no"
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert ("stop_stage", "serve") not in fake.calls


async def test_stop_confirmed_runs_the_command_and_logs_it():
    app, fake = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, STAGES.index("train"))
        assert app.selected_stage == "train"
        await pilot.press("x")
        await pilot.pause()
        app.screen.query_one("#yes", Button).press()
        await actions_done(app, pilot)
        assert fake.calls == [("stop_stage", "train")]
        log = app.query_one(CommandLogPane)
        assert log.entries[-1].result.commands == (f"systemctl --user stop {stage_unit('train')}",)


async def test_escape_cancels_restart():
    app, fake = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert fake.calls == []


async def test_start_and_deep_check_run_directly():
    app, fake = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, 1)
        await pilot.press("s", "d")
        await actions_done(app, pilot, 2)
        assert ("start_stage", "generate") in fake.calls and ("deep_check",) in fake.calls
        assert [name for name, _ in app.results] == ["start generate", "deep check"]


async def test_failed_action_is_shown_not_raised():
    fake = FakeController([base_snapshot()], results={"start_stage": ActionResult(
        False, "unit not found", ("systemctl --user start eagle3-serve.service",))})
    app, _ = make_app(fake)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        await actions_done(app, pilot)
        assert app.results[-1][1].ok is False
        assert app.query_one(CommandLogPane).entries[-1].result.message == "unit not found"


async def test_readonly_has_no_mutating_keys():
    app, fake = make_app(readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("s", "x", "r")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert fake.calls == []
        shown = {b.binding.action for b in app.active_bindings.values() if b.enabled}
        assert not shown & {"start_stage", "stop_stage", "restart_server"}
        screen_text = html.unescape(app.export_screenshot()).replace("\xa0", " ")
        assert "Deep check" in screen_text and "Stop stage" not in screen_text and "Start stage" not in screen_text
        # The methods refuse too, not only the keys.
        app.action_start_stage()
        app.action_stop_stage()
        app.action_restart_server()
        await pilot.pause()
        assert fake.calls == [] and not isinstance(app.screen, ConfirmScreen)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "Stop stage" not in app.screen.text and "Deep check" in app.screen.text


async def test_quit_only_closes_the_controller():
    app, fake = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert fake.calls == [("close",)]


async def test_user_keymap_remaps(tmp_path):
    keymap = tmp_path / "keys.toml"
    keymap.write_text('[keys]\nstop_stage = "X"\n')
    app, fake = make_app(keymap_path=keymap)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("x")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("X")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)


async def test_journal_follows_server_then_selected_stage_log():
    snap = dataclasses.replace(base_snapshot(), runs=(generation_run(),))
    fake = FakeController([snap], journal={SERVER_UNIT: ["a", "b"], stage_unit("generate"): ["g1"]})
    app, _ = make_app(fake)
    async with app.run_test(size=SIZE) as pilot:
        journal = app.query_one(JournalPane)
        await wait_for(pilot, lambda: len(journal.buffer) == 2)
        assert journal.unit == SERVER_UNIT and list(journal.buffer) == ["a", "b"]
        await select(pilot, 1)
        await pilot.press("l")
        await wait_for(pilot, lambda: journal.unit == stage_unit("generate") and len(journal.buffer) == 1)
        assert list(journal.buffer) == ["g1"]
        assert fake.journal_units == [SERVER_UNIT, stage_unit("generate")]


async def test_journal_filter_pause_and_new_lines():
    fake = FakeController([base_snapshot()], journal={SERVER_UNIT: [f"INFO {i}" for i in range(5)] + ["ERROR x"]})
    app, _ = make_app(fake)
    async with app.run_test(size=SIZE) as pilot:
        journal = app.query_one(JournalPane)
        await wait_for(pilot, lambda: len(journal.buffer) == 6)
        await pilot.press("slash")
        await pilot.pause()
        assert isinstance(app.focused, Input)
        await pilot.press(*"error", "enter")
        await pilot.pause()
        assert journal.filter == "error" and journal.shown == 1
        assert isinstance(app.focused, StageList)
        await pilot.press("f")
        await pilot.pause()
        assert journal.paused
        fake.push_line(SERVER_UNIT, "ERROR y")
        fake.push_line(SERVER_UNIT, "INFO z")
        await wait_for(pilot, lambda: len(journal.buffer) == 8)
        assert journal.new_lines == 1 and journal.shown == 1
        await pilot.press("f")
        await pilot.pause()
        assert not journal.paused and journal.new_lines == 0 and journal.shown == 2


async def test_journal_does_not_jump_when_scrolled_up():
    fake = FakeController([base_snapshot()], journal={SERVER_UNIT: [f"line {i}" for i in range(200)]})
    app, _ = make_app(fake)
    async with app.run_test(size=SIZE) as pilot:
        journal = app.query_one(JournalPane)
        await wait_for(pilot, lambda: len(journal.buffer) == 200)
        view = journal.log_view
        assert view.is_vertical_scroll_end and view.scroll_y > 0
        view.scroll_home(animate=False)
        await pilot.pause()
        fake.push_line(SERVER_UNIT, "later")
        await wait_for(pilot, lambda: len(journal.buffer) == 201)
        assert view.scroll_y == 0 and journal.new_lines == 1
        view.scroll_end(animate=False)
        await pilot.pause(0.1)
        assert journal.new_lines == 0


async def test_journal_ring_buffer_is_bounded():
    app, fake = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        journal = app.query_one(JournalPane)
        for i in range(5200):
            fake.push_line(SERVER_UNIT, f"l{i}")
        await wait_for(pilot, lambda: journal.buffer and journal.buffer[-1] == "l5199")
        assert len(journal.buffer) == 5000 and journal.log_view.line_count == 5000


async def test_malformed_snapshots_are_contained():
    good = base_snapshot()
    run = training_run()
    run = dataclasses.replace(run, last_event=dict(run.last_event or {}, loss="nan?"))
    gen = dataclasses.replace(generation_run(), last_event=None, done=None)  # type: ignore[arg-type]
    bad = dataclasses.replace(
        good, service=dataclasses.replace(good.service, unit=None),  # type: ignore[arg-type]
        server=dataclasses.replace(good.server, progress="3 of 8", phase="loading_weights"),  # type: ignore[arg-type]
        gpus=(dataclasses.replace(good.gpus[0], memory_used_mib="lots"), *good.gpus[1:]),  # type: ignore[arg-type]
        runs=(run, gen))
    fake = FakeController([bad, base_snapshot()])
    app, _ = make_app(fake)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        fake.push(bad)
        await pilot.pause(0.2)
        errors = {pid: app.query_one(f"#{pid}").error for pid in ("readiness", "gpus", "training", "generation")}
        assert errors["readiness"] and errors["gpus"], errors
        # stage runs are read through their typed views (console/telemetry/progress.py): a bad value there
        # reads as not given, so those panes keep showing the run instead of an error
        assert errors["training"] is None and errors["generation"] is None, errors
        fake.push(base_snapshot())
        await pilot.pause(0.2)
        assert app.query_one("#readiness").error is None  # recovers on good data
        assert app.is_running


async def test_lost_connection_banner_and_data_age():
    t = 1_700_000_000.0
    fake = FakeController([base_snapshot(taken_at=t)])
    clock = [t]
    app = ConsoleApp(fake, clock=lambda: clock[0])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        banner = app.query_one("#banner")
        assert not banner.has_class("-shown")
        clock[0] = t + 42
        fake.push(base_snapshot(reachable=False, taken_at=t + 42))
        await pilot.pause(0.1)
        assert banner.has_class("-shown") and "Connection refused" in banner.plain
        assert app.query_one("#service").border_subtitle == "data 42s old"
        fake.push(base_snapshot(taken_at=t + 50))
        await pilot.pause(0.1)
        assert not banner.has_class("-shown") and app.query_one("#service").border_subtitle == ""


async def test_state_changes_notify():
    loading = base_snapshot(phase="loading_weights")
    ready = base_snapshot()
    fake = FakeController([loading, ready])
    app, _ = make_app(fake)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        assert any("Server ready" in n.message for n in app._notifications)


class BrokenStream(FakeController):
    """snapshots() fails once, then works: the app must show it and retry, never crash."""

    def __init__(self) -> None:
        super().__init__([base_snapshot()])
        self.attempts = 0

    async def snapshots(self):
        self.attempts += 1
        if self.attempts == 1:
            raise ConnectionError("collector crashed")
        async for snap in super().snapshots():
            yield snap

    async def deep_check(self):
        raise RuntimeError("port forward failed")


async def test_stream_failure_and_action_exception_are_shown(monkeypatch):
    monkeypatch.setattr("console.ui.app.RETRY_S", 0.05)
    app, fake = make_app(BrokenStream())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.last_snapshot is not None)
        assert fake.attempts == 2 and app.is_running
        await pilot.press("d")
        await actions_done(app, pilot)
        name, result = app.results[-1]
        assert name == "deep check" and not result.ok and "port forward failed" in result.message


async def test_log_view_follows_the_newest_run_of_the_stage():
    """`l` follows a stage, not one run of it: when a new run of that stage starts, the view moves to it."""
    old = dataclasses.replace(generation_run(), run_id="old", unit="e3-generate-old", state="done")
    new = dataclasses.replace(generation_run(), run_id="new", unit="e3-generate-new")
    first = dataclasses.replace(base_snapshot(), runs=(old,))
    fake = FakeController([first], journal={SERVER_UNIT: [], "e3-generate-old": ["old run"],
                                            "e3-generate-new": ["new run"]})
    app, _ = make_app(fake)
    async with app.run_test(size=SIZE) as pilot:
        journal = app.query_one(JournalPane)
        await wait_for(pilot, lambda: journal.unit == SERVER_UNIT)
        await select(pilot, 1)
        await pilot.press("l")
        await wait_for(pilot, lambda: journal.unit == "e3-generate-old" and list(journal.buffer) == ["old run"])
        fake.push(dataclasses.replace(base_snapshot(), runs=(old, new)))
        await wait_for(pilot, lambda: journal.unit == "e3-generate-new" and list(journal.buffer) == ["new run"])


async def test_server_switch_and_bench_keys_ask_first_and_no_is_the_default():
    app, fake = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        shown = {b.binding.action for b in app.active_bindings.values() if b.enabled}
        assert {"serve_drafter", "serve_baseline", "bench"} <= shown
        for key in ("v", "b", "m"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen) and app.screen.focused.id == "no"
            # the downtime is said before it is spent: how many loads, how long each on this host
            assert "Downtime: 2 server loads of about 22 min each" in app.screen.detail, app.screen.detail
            await pilot.press("enter")
            await pilot.pause()
        assert fake.calls == []
        for key, count in (("v", 1), ("b", 2), ("m", 3)):
            await pilot.press(key)
            await pilot.pause()
            app.screen.query_one("#yes", Button).press()
            await actions_done(app, pilot, count)
        assert fake.calls == [("serve_drafter",), ("serve_baseline",), ("start_stage", "bench")]
        assert [name for name, _ in app.results] == ["serve drafter", "serve baseline", "start bench"]


async def test_readonly_hides_the_server_switch_and_bench_keys():
    app, fake = make_app(readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("v", "b", "m")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen) and fake.calls == []
        shown = {b.binding.action for b in app.active_bindings.values() if b.enabled}
        assert not shown & {"serve_drafter", "serve_baseline", "bench"}
        app.action_serve_drafter()
        app.action_serve_baseline()
        app.action_bench()
        await pilot.pause()
        assert fake.calls == [] and not isinstance(app.screen, ConfirmScreen)
