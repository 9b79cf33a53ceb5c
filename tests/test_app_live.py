"""Every key of the footer and of `?` (console/ui/keys.py KEYS) on the real Session against the demo host
(LocalHost, the vLLM stand-in in tmux), and what each key changed checked on the host itself: its
processes, its run directories, its server's counters, its logs. One demo host serves the whole module
(the tests run in the order written: the disk keys first, the server swaps last).

The fake controller is used elsewhere only for what the demo host cannot show (a dead link, a refused key)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import time
from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from backend.contract.events import EventLog
from backend.contract.runs import Manifest, open_run_dir
from backend.kit import disk as host_disk
from console import demo
from console.control.server_argv import server_command
from console.control.units import server_start_command, server_stop_command
from console.naming import server_log_path, stage_log_path
from console.parsers.text import clean
from console.profile import Profile
from console.session import Session
from console.ui.app import ConsoleApp
from console.ui.keys import KEYS
from console.ui.panes.bench import BenchPane
from console.ui.panes.disk import DiskPane
from console.ui.panes.gauges import human_bytes
from console.ui.panes.journal import JournalPane
from console.ui.screens.confirm import ConfirmScreen
from console.ui.screens.help import HelpScreen
from harness.polling import until
from harness.run_dirs import DAY, make_run

pytestmark = pytest.mark.timeout(600)
SIZE = (160, 50)


async def wait(pilot, predicate, what: str, timeout: float = 90.0):
    return await until(predicate, what, timeout=timeout, pause=pilot.pause)


# -- the host, as the host itself says it ------------------------------------------------------------

def work(profile: Profile) -> Path:
    return Path(profile.paths.work_dir)


def run_dirs(profile: Profile) -> set[str]:
    runs = work(profile) / "runs"
    return {p.name for p in runs.iterdir()} if runs.is_dir() else set()


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def pids(*needles: str) -> list[int]:
    """The live Python processes on this machine (the demo host) whose command line holds every needle
    (not the shell or tmux wrappers around them, whose command lines hold theirs)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        line = cmdline(int(proc.name))
        if (os.path.basename(line.split(" ", 1)[0]).startswith("python") and all(n in line for n in needles)
                and alive(int(proc.name))):
            found.append(int(proc.name))
    return found


def drafter_servers(profile: Profile, checkpoint: str) -> list[int]:
    """This demo host's stand-ins serving the checkpoint (other workers' tests serve the same shared drafters
    on their own ports)."""
    return pids("sim.vllm_server", checkpoint, "--port", str(profile.server.port))


def servers(profile: Profile) -> list[int]:
    """The stand-in processes serving this demo host's port (baseline or drafter server)."""
    return pids("sim.vllm_server", "--port", str(profile.server.port))


def metric(profile: Profile, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{profile.server.port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


async def switch_done(pilot, session: Session, timeout: float = 60.0) -> None:
    """Until no program holds the host's server lock (Session.switch_finished)."""
    deadline = time.monotonic() + timeout
    while not await session.switch_finished():
        assert time.monotonic() < deadline, "the server switch still holds the lock"
        await pilot.pause(0.2)


def drafter_log_tail(profile: Profile) -> str:
    logs = sorted(Path(profile.paths.work_dir, "logs").glob("*drafter*.log"))
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)


def answering(profile: Profile) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{profile.server.port}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def write_verified_drafter(profile: Profile, checkpoint: Path) -> str:
    """A completed verify run vouching for `checkpoint` (a drafter trained on the demo's tiny verifier):
    what serve-drafter and the bench look up on the host."""
    rd = open_run_dir(str(work(profile)), "verify-keys", Manifest(stage="verify", run_id="verify-keys",
                                                                    identity={"checkpoint": str(checkpoint)}))
    summary = {"status": "completed", "outputs": {"checkpoint": str(checkpoint)}}
    Path(rd.path, "summary.json").write_text(json.dumps(summary))
    log = EventLog(rd.events_path, "verify", "verify-keys")
    log.emit("start", total=1)
    log.emit("finish", status="completed", summary=summary)
    return "verify-keys"


# -- the shared demo host and one app on it -----------------------------------------------------------

@pytest_asyncio.fixture(scope="module")
async def host(tmp_path_factory) -> AsyncIterator[Profile]:
    where = tmp_path_factory.mktemp("keys") / "demo"
    profile = await demo.start(where, speed=20)
    # one request at a time: the generate run started with `s` lasts while its keys are tried
    profile.generate.concurrency = 1
    # old runs for `u` and `p`: an old generate run, the newest one (kept), a failed verify run
    make_run(work(profile), "gen-old", "generate", age_s=9 * DAY, payload=3 << 20)
    make_run(work(profile), "gen-new", "generate", age_s=2 * DAY, payload=1 << 20)
    make_run(work(profile), "verify-failed", "verify", status="failed", age_s=6 * DAY, payload=2 << 20)
    try:
        yield profile
    finally:
        await demo.stop(where)


@contextlib.asynccontextmanager
async def live(profile: Profile):
    session = Session(profile, interval=0.5)
    app = ConsoleApp(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait(pilot, lambda: app.last_snapshot and app.last_snapshot.server.phase == "ready", "ready")
        yield app, pilot, session


async def confirmation(app, pilot) -> ConfirmScreen:
    """The confirmation once composed: a pushed screen is app.screen before its widgets exist (a loaded run
    read an empty dialog there); its No button has the focus once its on_mount ran."""
    def shown():
        screen = app.screen
        return isinstance(screen, ConfirmScreen) and getattr(screen.focused, "id", None) == "no" and screen

    return await wait(pilot, shown, "a confirmation", 60)


def screen_text(screen) -> str:
    """Every word a screen shows, scrolled out of view or not (not its layout)."""
    texts = []
    for widget in screen.query("*"):
        with contextlib.suppress(Exception):
            rendered = widget.render()
            texts.append(getattr(rendered, "plain", None) or str(rendered))
    return "\n".join(texts)


async def result_of(app, pilot, name: str, timeout: float = 120.0):
    found = await wait(pilot, lambda: next((r for n, r in app.results if n == name), None), f"{name} to finish",
                       timeout)
    return found


# -- u, p ---------------------------------------------------------------------------------------------

async def test_u_shows_the_size_the_host_measures_for_every_run(host):
    async with live(host) as (app, pilot, _):
        await pilot.press("u")
        pane = app.query_one(DiskPane)
        await wait(pilot, lambda: pane.report is not None, "the disk survey", 60)
        _, on_host = host_disk.survey(str(work(host)))
        assert {r.name: r.size for r in pane.report.runs} == {r.name: r.size for r in on_host}
        assert {"gen-old", "gen-new", "verify-failed"} <= {r.name for r in on_host}
        text = app.query_one("#disk-body").plain
        for r in on_host:
            assert re.search(rf"{re.escape(human_bytes(r.size))}\s.*\s{re.escape(r.name)}", text), (r.name, text)
        assert app.results == []  # a survey, nothing changed


async def test_p_deletes_exactly_the_runs_it_listed_and_only_after_yes(host):
    async with live(host) as (app, pilot, session):
        plans = []
        planned = session.prune_plan

        async def recorded():  # the real plan from the host, kept to compare with what went
            plans.append(await planned())
            return plans[-1]
        session.prune_plan = recorded  # type: ignore[method-assign]

        before = run_dirs(host)
        await pilot.press("p")
        screen = await confirmation(app, pilot)
        listed = {r.name for r in plans[-1].delete}
        # the newest completed generate run is kept, and the failed verify run as resumable (`runs prune
        # --resumable` deletes those; the key never does)
        assert listed == {"gen-old"} and plans[-1].keep and "verify-failed" in {r.name for r in plans[-1].keep}
        shown = screen_text(screen)
        assert all(name in shown for name in listed), shown
        await pilot.press("n")
        await wait(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the dialog to close")
        await pilot.pause(1.0)
        assert run_dirs(host) == before and not any(n == "prune" for n, _ in app.results)

        await pilot.press("p")
        screen = await confirmation(app, pilot)
        listed = {r.name for r in plans[-1].delete}
        assert all(name in screen_text(screen) for name in listed)
        await pilot.press("y")
        result = await result_of(app, pilot, "prune")
        assert result.ok, result.message
        assert before - run_dirs(host) == listed and run_dirs(host) == before - listed
        # the survey the prune refreshes says the same
        pane = app.query_one(DiskPane)
        await wait(pilot, lambda: pane.report and not {r.name for r in pane.report.runs} & listed, "the new survey")


# -- the server's keys --------------------------------------------------------------------------------

async def test_x_s_r_stop_start_and_restart_the_server_process(host):
    async with live(host) as (app, pilot, _):
        [first] = servers(host)
        await pilot.press("x")  # serve is selected; the dialog's default is No
        await confirmation(app, pilot)
        await pilot.press("enter")
        await pilot.pause(1.0)
        assert app.results == [] and servers(host) == [first] and answering(host)

        await pilot.press("x")
        await confirmation(app, pilot)
        await pilot.press("tab", "enter")
        result = await result_of(app, pilot, "stop serve")
        assert result.ok, result.message
        assert result.commands == (server_stop_command(host).shown,)
        await wait(pilot, lambda: not alive(first) and not servers(host), "the server process to end", 60)
        assert not answering(host)

        await pilot.press("s")
        result = await result_of(app, pilot, "start serve")
        assert result.ok, result.message
        assert result.commands == (server_start_command(host).shown,)
        # the operator reads the program it started, not the tmux plumbing around it
        assert result.commands[0].endswith(shlex.join(server_command(host)))
        assert "respawn-pane" not in result.commands[0]
        second = (await wait(pilot, lambda: servers(host), "a new server process", 60))[0]
        await wait(pilot, lambda: answering(host), "the new server to answer", 120)
        await wait(pilot, lambda: app.last_snapshot.server.phase == "ready", "ready")

        await pilot.press("r")
        await confirmation(app, pilot)
        await pilot.press("y")
        result = await result_of(app, pilot, "restart server")
        assert result.ok, result.message
        await wait(pilot, lambda: not alive(second), "the old server process to end", 60)
        await wait(pilot, lambda: servers(host) and answering(host), "the restarted server to answer", 120)
        assert second not in servers(host)


async def test_d_asks_the_server_for_a_completion(host):
    async with live(host) as (app, pilot, _):
        before = metric(host, "vllm:request_success_total")
        await pilot.press("d")
        result = await result_of(app, pilot, "deep check")
        assert result.ok, result.message
        assert metric(host, "vllm:request_success_total") >= before + 1


# -- a stage's keys: s on a stage, l, /, f, x --------------------------------------------------------

async def test_a_stage_started_followed_filtered_paused_and_stopped(host):
    async with live(host) as (app, pilot, _):
        await pilot.press("j")  # serve -> generate
        await wait(pilot, lambda: app.selected_stage == "generate", "generate selected", 10)
        before = run_dirs(host)
        await pilot.press("s")
        result = await result_of(app, pilot, "start generate")
        assert result.ok, result.message
        [run] = await wait(pilot, lambda: run_dirs(host) - before, "the run's directory on the host", 30)
        procs = await wait(pilot, lambda: pids("backend.generate", str(work(host))), "the generate process", 30)
        unit = await wait(pilot, lambda: next((r.unit for r in app.last_snapshot.runs
                                                if r.run_id == run and r.state == "running" and r.unit), None),
                          "the run in the snapshot", 30)

        # l: the log view follows the run's unit (its log on the host says nothing until the run ends)
        await pilot.press("l")
        journal = app.query_one(JournalPane)
        assert app.journal_unit == unit and journal.unit == unit
        log = Path(stage_log_path(host, unit))

        # back on serve, l follows the server's log: what the view shows is that log on the host
        await pilot.press("k", "l")
        server_unit = host.server.unit
        await wait(pilot, lambda: journal.unit == server_unit and len(journal.buffer) >= 2, "the server's log", 30)
        on_host = {clean(line) for line in Path(server_log_path(host)).read_text(errors="replace").splitlines()}
        assert set(journal.buffer) <= on_host, (list(journal.buffer)[:5], sorted(on_host)[:5])

        # /: a filter on those lines; the view shows the lines that hold it, the host is not asked
        lines = list(journal.buffer)
        words = {w for line in lines for w in re.findall(r"[a-z]{4,}", line.lower())}
        word = next(w for w in sorted(words) if 0 < sum(w in l.lower() for l in lines) < len(lines))
        asked = len(app.results)
        await pilot.press("slash")
        await pilot.press(*word, "enter")
        await wait(pilot, lambda: journal.filter == word, "the filter")
        assert journal.shown == sum(word in line.lower() for line in journal.buffer)
        await pilot.press("slash", "ctrl+a", "ctrl+k", "enter")  # clear it again
        await wait(pilot, lambda: journal.filter == "", "the filter cleared")

        # f: paused, the lines the server writes meanwhile (the run's requests) wait; resumed, they show
        await pilot.press("f")
        assert journal.paused
        shown = journal.shown
        await wait(pilot, lambda: journal.new_lines > 0, "new lines while paused", 90)
        assert journal.shown == shown
        held = len(journal.buffer)
        await pilot.press("f")
        assert not journal.paused
        # the held lines are drawn on the pane's next turn; on a loaded machine (ci21) the assertion made
        # right after the key saw the count of before (42 > 42), so it waits for them
        await wait(pilot, lambda: journal.shown > shown,
                   f"the held lines shown after resuming ({shown} shown, {held} in the buffer when paused)", 15)
        assert len(app.results) == asked

        # x on the stage: its process ends on the host, its log's last word reaches the view
        await pilot.press("j", "l")
        await wait(pilot, lambda: journal.unit == unit, "the run's log again", 10)
        assert all(alive(p) for p in procs)
        await pilot.press("x")
        await confirmation(app, pilot)
        await pilot.press("y")
        result = await result_of(app, pilot, "stop generate")
        assert result.ok, result.message
        await wait(pilot, lambda: not any(alive(p) for p in procs), "the generate process to end", 60)
        last = await wait(pilot, lambda: log.exists() and log.read_text().strip().splitlines()[-1:],
                          "the run's last log line", 30)
        await wait(pilot, lambda: clean(last[0]) in journal.buffer, "that line in the view", 30)
        assert servers(host) and answering(host)  # the server was not touched


# -- ?, q ---------------------------------------------------------------------------------------------

async def test_help_lists_every_key_and_quit_leaves_the_host_running(host):
    server = servers(host)
    async with live(host) as (app, pilot, session):
        await pilot.press("question_mark")
        screen = await wait(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen, "the help", 10)
        text = screen_text(screen)
        for spec in KEYS:
            assert spec.description in text, spec
        await pilot.press("escape")
        await wait(pilot, lambda: not isinstance(app.screen, HelpScreen), "the help to close", 10)
        assert app.results == []
        await pilot.press("q")
        # `q` closes the session first (up to 5 s), then exits: `_closed` is set before the exit
        await wait(pilot, lambda: app.return_code is not None or not app.is_running, "the console to exit", 15)
        assert app._closed
    assert session.final_error is None
    await asyncio.sleep(1.0)
    assert servers(host) == server and answering(host)  # quitting stops nothing on the host


# -- v, b, m: with a verified drafter on the host ----------------------------------------------------

async def test_v_b_serve_the_drafter_and_the_baseline_and_m_benches_them(host, tiny_drafters, tmp_path):
    verify_run = write_verified_drafter(host, tiny_drafters.trained)
    prompts = work(host) / "data" / "bench-prompts.jsonl"
    from sim.tinycorpus import demo_questions
    prompts.write_text("".join(json.dumps({"conversations": [{"from": "human", "value": q},
                                                            {"from": "gpt", "value": "-"}]}) + "\n"
                               for q in demo_questions(40)[24:]))
    host.bench.dataset, host.bench.num_prompts = str(prompts), 4
    host.bench.concurrency, host.bench.max_tokens, host.bench.client = [1], 24, "ours"
    checkpoint = str(tiny_drafters.trained)
    async with live(host) as (app, pilot, session):
        [baseline] = servers(host)
        for attempt in (1, 2):
            await pilot.press("v")
            await confirmation(app, pilot)
            await pilot.press("y")
            result = await result_of(app, pilot, "serve drafter", 180)
            # Seen once in four full runs (2026-12-03): the drafter stand-in got a SIGTERM the moment it was
            # ready, the switch said "exited while starting" and brought the baseline back; nothing in the
            # switch's events names the sender. One more try, so that flake cannot hide what this test is
            # for (the keys); a second such exit fails, with the drafter's log.
            if result.ok or attempt == 2 or "exited while starting" not in result.message:
                break
            app.results.clear()
            await wait(pilot, lambda: answering(host), "the baseline back after the failed switch", 180)
            await switch_done(pilot, session)
            [baseline] = servers(host)
        assert result.ok, result.message + "\n" + drafter_log_tail(host)
        assert verify_run in result.message
        drafter = await wait(pilot, lambda: drafter_servers(host, checkpoint), "the drafter server", 60)
        await wait(pilot, lambda: not alive(baseline), "the baseline to stop", 60)
        await wait(pilot, lambda: answering(host), "the drafter server to answer", 180)
        assert servers(host) == drafter
        # the detached switch lets go of the server lock a moment after its server answers: a `b` pressed
        # before then is refused ("the servers are being switched"), as it should be
        await switch_done(pilot, session)

        await pilot.press("b")
        await confirmation(app, pilot)
        await pilot.press("y")
        result = await result_of(app, pilot, "serve baseline", 180)
        assert result.ok, result.message
        await wait(pilot, lambda: not any(alive(p) for p in drafter), "the drafter server to stop", 60)
        await wait(pilot, lambda: servers(host) and answering(host), "the baseline to answer", 180)
        assert not drafter_servers(host, checkpoint)
        await wait(pilot, lambda: app.last_snapshot.server.phase == "ready", "ready", 120)
        await switch_done(pilot, session)

        await pilot.press("m")
        await confirmation(app, pilot)
        await pilot.press("y")
        result = await result_of(app, pilot, "start bench")
        assert result.ok, result.message
        bench = re.search(r"run (\S+) started", result.message).group(1)
        done = work(host) / "runs" / bench / "summary.json"
        await wait(pilot, done.exists, "the bench pair's summary on the host", 480)
        summary = json.loads(done.read_text())
        assert summary["status"] == "completed" and "comparison" in summary, summary
        rows = summary["comparison"]["rows"]
        assert {r["label"] for r in rows} >= {"baseline", "drafter"}
        pane = app.query_one(BenchPane)
        body = app.query_one("#bench-body")
        await wait(pilot, lambda: pane.has_class("-shown") and bench in body.plain
                   and len(body.plain.splitlines()) >= len(rows) + 2, "the bench pane with the run", 60)
        shown = body.plain.splitlines()
        for r in rows:
            line = next((l for l in shown if re.match(rf"\s*{r['concurrency']}\s+{re.escape(r['label'])}\s", l)),
                        None)
            assert line is not None, (r, shown)
            assert f"{r['output_tps']:.1f}" in line, (r, line)
            if r["ratio"] is not None:
                assert f"{r['ratio']:.2f}x" in line, (r, line)
        await wait(pilot, lambda: servers(host) and answering(host), "the baseline back after the bench", 120)


async def test_readonly_controller_refuses_even_when_called_directly(tmp_path):
    profile = demo.prepare(tmp_path / "demo")
    controller = Session(profile, readonly=True)
    for call in (controller.start_stage("serve"), controller.stop_stage("generate"), controller.restart_server()):
        result = await call
        assert not result.ok and "read-only" in result.message and result.commands == ()
    await controller.close()
    await asyncio.sleep(0)
