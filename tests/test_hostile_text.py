"""Text from the host, its server or a profile is data: through every pane, toast and headless output it
is shown literally, never parsed as markup, and never reaches the terminal as a control sequence."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from console import demo
from console.commands.server_cmd import human
from console.parsers.text import clean
from console.profile import write_profile
from console.session import ActionResult
from console.telemetry.sanitize import sanitized
from console.ui.app import ConsoleApp
from harness.fake_controller import FakeController, base_snapshot, generation_run, training_run
from harness.polling import until

REPO = Path(__file__).resolve().parent.parent
OSC_CLIPBOARD = "\x1b]52;c;aGFja2Vk\x07"
HOSTILE = [
    "[/tmp/x]", "x[/b]", "[@click=app.quit]click me[/]", "[/INST] answer", "trailing\\", "a\\[b]",
    f"clip{OSC_CLIPBOARD}board", "title\x1b]0;pwned\x07", "\x1b[31mred\x1b[0m", "bidi\u202eevil", "nul\x00x",
    "$variable", "[b][i]open", "\udcff-undecodable",
]


def hostile_snapshot(text: str):
    """The demo's usual states with `text` in every string field the host or server can fill."""
    def fill(value):
        if isinstance(value, str):
            return f"{value} {text}"
        if dataclasses.is_dataclass(value):
            return dataclasses.replace(value, **{f.name: fill(getattr(value, f.name)) for f in dataclasses.fields(value)
                                                 if f.name not in ("phase", "state", "stage", "manager")})
        if isinstance(value, tuple):
            return tuple(fill(v) for v in value)
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        return value
    snap = dataclasses.replace(base_snapshot(phase="failed"), runs=(generation_run(), training_run()))
    return fill(snap)


def no_control(text: str) -> bool:
    return not any(ord(c) < 32 and c not in "\n" or 0x7f <= ord(c) <= 0x9f or 0xd800 <= ord(c) <= 0xdfff
                   for c in text)


@pytest.mark.parametrize("text", HOSTILE)
def test_headless_output_is_clean(text):
    snap = sanitized(hostile_snapshot(text))
    out = human(snap) + json.dumps(snap.to_json(), ensure_ascii=False)
    assert no_control(out) and OSC_CLIPBOARD not in out
    assert clean(text) in human(snap)  # shown, literally


@pytest.mark.parametrize("text", HOSTILE)
async def test_every_pane_and_toast_shows_it_literally(text):
    bad = sanitized(hostile_snapshot(text))
    ready = sanitized(dataclasses.replace(hostile_snapshot(text), server=dataclasses.replace(
        base_snapshot(phase="ready").server, model_id=f"model {text}")))
    results = {name: ActionResult(False, f"{name} failed: {text}", (f"cmd {text}",))
               for name in ("start_stage", "stop_stage", "restart_server", "deep_check")}
    fake = FakeController([ready, bad], journal={"eagle3-vllm.service": [f"log {text}"]}, results=results)
    app = ConsoleApp(fake)
    async with app.run_test(size=(160, 60)) as pilot:
        await until(lambda: app.last_snapshot is bad, "the hostile snapshot", timeout=10, pause=pilot.pause)
        await pilot.pause(0.3)
        for pane in ("service", "readiness", "stages", "gpus", "generation", "training"):
            assert app.query_one(f"#{pane}").error is None, (pane, app.query_one(f"#{pane}").error)
        await pilot.press("d")  # a deep check whose answer carries the text (a toast)
        await until(lambda: app.results, "the deep check's result", timeout=10, pause=pilot.pause)
        await pilot.pause(0.3)
        screen = app.export_screenshot()
        assert app.is_running  # `[@click=app.quit]` is not a live link, nothing crashed
        assert OSC_CLIPBOARD not in screen and "\x1b]0;" not in screen
        toasts = [n.message for n in app._notifications]
        assert any(clean(text) in m for m in toasts), toasts  # the toast shows the text as it is


def test_status_of_a_server_serving_a_hostile_model_id(tmp_path):
    """End to end: the stand-in serves a model id full of markup (a profile cannot carry control
    characters, so none here); `status` and `wait-ready` say it is the wrong model and show the id
    literally."""
    work = tmp_path / "d"
    profile = demo.prepare(work, speed=20)
    hostile = "x[/b][@click=app.quit]\\"
    argv = list(profile.server.command)
    argv[argv.index("--served-model-name") + 1] = hostile
    profile.server.command = argv
    write_profile(profile, profile.source, overwrite=True)
    run = lambda *a: subprocess.run([sys.executable, "-m", "console.cli", *a], capture_output=True, text=True,
                                    timeout=90, cwd=REPO, stdin=subprocess.DEVNULL)
    try:
        assert run("start-server", "--profile", profile.source).returncode == 0
        waited = run("wait-ready", "--profile", profile.source, "--timeout", "60")
        assert waited.returncode == 1 and "wrong model served" in waited.stderr
        status = run("status", "--profile", profile.source)
        for out in (waited.stderr, status.stdout):
            assert no_control(out) and hostile in out
        doc = json.loads(run("status", "--profile", profile.source, "--json").stdout)
        assert doc["server"]["model_id"] == hostile
    finally:
        subprocess.run([sys.executable, "-m", "console.cli", "demo-host", "stop", "--dir", str(work)],
                       capture_output=True, timeout=90, cwd=REPO)
