"""Small things an operator trips over, pressed through the real app with Pilot: the confirmation's
y/n keys and its hint, a stopped stage's icon, the readiness line's reasoning field."""
from __future__ import annotations

import dataclasses

import pytest

from console.ui.app import ConsoleApp
from console.ui.panes.stages import StageList
from console.ui.screens.confirm import ConfirmScreen
from harness.fake_controller import FakeController, base_snapshot, generation_run

pytestmark = pytest.mark.timeout(30)
SIZE = (160, 50)


def make_app(*snapshots) -> tuple[ConsoleApp, FakeController]:
    fake = FakeController(list(snapshots) or [base_snapshot()])
    return ConsoleApp(fake, clock=lambda: 1_700_000_010.0), fake


async def settled(app: ConsoleApp, pilot) -> None:
    for _ in range(100):
        if app.last_snapshot is not None:
            break
        await pilot.pause(0.02)
    await pilot.pause(0.1)


async def test_confirmation_says_how_to_answer_and_takes_y_and_n():
    app, fake = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settled(app, pilot)
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.focused is not None and app.screen.focused.id == "no"  # still the default
        hint = str(app.screen.query_one("#confirm-keys").render())
        assert "y yes" in hint and "Esc" in hint and "Enter" in hint
        await pilot.press("n")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen) and fake.calls == []

        await pilot.press("x")
        await pilot.pause()
        await pilot.press("y")
        for _ in range(100):
            if fake.calls:
                break
            await pilot.pause(0.02)
        assert fake.calls == [("stop_stage", "serve")]


async def test_a_stopped_stage_has_its_own_icon_not_a_question_mark():
    run = generation_run(done=300, total=1000)
    snap = dataclasses.replace(base_snapshot(), runs=(dataclasses.replace(run, state="stopped"),))
    app, _ = make_app(snap)
    async with app.run_test(size=SIZE) as pilot:
        await settled(app, pilot)
        prompt = str(app.query_one(StageList).get_option("generate").prompt)
        assert "stopped" in prompt and "■" in prompt and "?" not in prompt


async def test_readiness_does_not_read_reasoning_reasoning():
    snap = base_snapshot()
    snap = dataclasses.replace(snap, server=dataclasses.replace(snap.server, reasoning_field="reasoning"))
    app, _ = make_app(snap)
    async with app.run_test(size=SIZE) as pilot:
        await settled(app, pilot)
        body = str(app.query_one("#readiness-body").render())
        assert "reasoning reasoning" not in body and "reasoning in message.reasoning" in body
