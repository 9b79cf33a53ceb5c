"""The app on the real session (demo host, LocalHost): keys in, the host commands out, shown readably."""
from __future__ import annotations

import asyncio
import shlex

import pytest

from console import demo
from tests.polling import until
from console.ui.app import ConsoleApp
from console.control.units import server_command, server_start_command, server_stop_command
from console.session import Session

pytestmark = pytest.mark.timeout(240)


async def wait(pilot, predicate, what: str, timeout: float = 90.0) -> None:
    await until(predicate, what, timeout=timeout, pause=pilot.pause)


async def test_keys_send_the_exact_commands_to_the_host(tmp_path):
    profile = await demo.start(tmp_path / "demo", speed=10)
    controller = Session(profile, interval=0.5)
    app = ConsoleApp(controller)
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await wait(pilot, lambda: app.last_snapshot and app.last_snapshot.server.phase == "ready", "ready")

            await pilot.press("x")  # serve is selected; the dialog's default is No
            await pilot.press("enter")
            await pilot.pause(0.5)
            assert app.results == []

            await pilot.press("x", "tab", "enter")
            await wait(pilot, lambda: app.results, "the stop to finish")
            name, result = app.results[-1]
            assert name == "stop serve" and result.ok, result.message
            assert result.commands == (server_stop_command(profile).shown,)
            await wait(pilot, lambda: app.last_snapshot.server.phase == "stopped", "stopped")

            await pilot.press("s")
            await wait(pilot, lambda: len(app.results) == 2, "the start to finish")
            name, result = app.results[-1]
            assert name == "start serve" and result.ok, result.message
            assert result.commands == (server_start_command(profile).shown,)
            # the operator reads the program it started, not the tmux plumbing around it
            assert result.commands[0].endswith(shlex.join(server_command(profile)))
            assert "respawn-pane" not in result.commands[0]
            await wait(pilot, lambda: app.last_snapshot.server.phase not in ("stopped", "unknown"), "a new load")
    finally:
        await demo.stop(tmp_path / "demo")


async def test_readonly_controller_refuses_even_when_called_directly(tmp_path):
    profile = demo.prepare(tmp_path / "demo")
    controller = Session(profile, readonly=True)
    for call in (controller.start_stage("serve"), controller.stop_stage("generate"), controller.restart_server()):
        result = await call
        assert not result.ok and "read-only" in result.message and result.commands == ()
    await controller.close()
    await asyncio.sleep(0)
