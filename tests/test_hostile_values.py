"""One wrong-typed or non-finite value from the host never blinds the console: the line or the reading
is skipped and counted, the rest goes on (issue 23). Through the run book, the metrics window, the
verify report, `status --json` and the live app."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.contract.events import Event, read_events
from backend.verify.report import K_MAX, table
from console import demo
from console.session import Session
from console.telemetry.metrics_window import MetricsWindow
from console.telemetry.probe import RunFile
from console.telemetry.runs import RunBook
from console.telemetry.sanitize import sanitized
from console.telemetry.snapshot import HostInfo, RunInfo, ServerMetrics, ServiceInfo, Snapshot
from console.ui.app import ConsoleApp
from console.ui.panes.training import verify_markup
from harness.polling import until

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parent.parent
SAMPLES = Path(__file__).parent / "samples" / "metrics"

POISON = [
    b'{"ts":"x","kind":"progress","stage":"generate","run_id":"r1","done":1}',
    b'{"ts":null,"kind":"progress","stage":"generate","run_id":"r1","done":1}',
    b'{"ts":NaN,"kind":"progress","stage":"generate","run_id":"r1","done":1}',
    b'{"ts":1e999,"kind":"progress","stage":"generate","run_id":"r1","done":1}',
    b'{"ts":1,"kind":["progress"],"stage":"generate","run_id":"r1"}',
    b"[" * 100_000 + b"]" * 100_000,  # RecursionError in json
    b'{"ts":1,"kind":"progress","stage":"generate","run_id":"r1","done":' + b"9" * 5000 + b"}",
]
# lines that are events but whose values are nonsense: read, with the nonsense as no reading
NONSENSE = [
    b'{"ts":2,"kind":"progress","stage":"generate","run_id":"r1","total":"many","done":"1"}',
    b'{"ts":3,"kind":"progress","stage":"generate","run_id":"r1","total":1e999,"done":NaN,"rate":Infinity}',
    b'{"ts":4,"kind":"progress","stage":"generate","run_id":"r1","total":1' + b"0" * 400 + b',"rate":1e-300}',
]


def line(kind, stage="generate", run_id="r1", **data) -> bytes:
    return Event(kind=kind, stage=stage, run_id=run_id, ts=1.0, data=data).to_line()


def strict_json(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_each_bad_line_is_skipped_and_counted():
    chunk = line("start", total=10) + b"\n".join(POISON) + b"\n" + line("progress", done=4, total=10)
    parsed = read_events(chunk)
    assert parsed.skipped == len(POISON) and parsed.consumed == len(chunk)
    assert [e.kind for e in parsed.events] == ["start", "progress"]
    nonsense = read_events(b"\n".join(NONSENSE) + b"\n")
    assert nonsense.skipped == 0
    for ev in nonsense.events:  # no non-finite float gets past the reader
        assert all(not (isinstance(v, float) and not math.isfinite(v)) for v in ev.data.values())


def test_the_run_book_reads_on_past_poison():
    book = RunBook("systemd")
    chunk = (line("start", total=10) + b"\n".join(POISON + NONSENSE) + b"\n"
             + line("progress", done=4, total=10, rate=2.0))
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=len(chunk), mtime=0)])
    book.apply_events("/w/runs/r1", chunk, limit=len(chunk) + 1)
    book.apply_unit_states("Id=e3-generate-r1.service\nActiveState=active\n", book.pending_units())
    info = book.infos()[0]
    assert (info.state, info.done, info.total, info.eta_s) == ("running", 4, 10, 3.0)
    assert info.skipped_lines == len(POISON)
    # a finish whose summary is all nonsense still ends the run, with no counts
    book.apply_events("/w/runs/r1", line("finish", status="completed",
                                         summary={"done": "many", "total": [1], "failed": 10**400}))
    info = book.infos()[0]
    assert (info.state, info.done, info.total, info.failed) == ("done", 0, 10, 0)


def test_an_old_runs_poison_leaves_the_others_alone():
    book = RunBook("tmux")
    old = POISON[0] + b"\n"
    new = line("start", run_id="r2", total=3) + line("progress", run_id="r2", done=2, total=3)
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=len(old), mtime=0),
                        RunFile("/w/runs/r2", "r2", size=len(new), mtime=1)])
    for read in book.reads_wanted():
        book.apply_events(read.run_dir, old if read.run_dir.endswith("r1") else new, read.limit)
    assert [(i.run_id, i.done) for i in book.infos()] == [("r2", 2)]
    assert book.tracks["/w/runs/r1"].skipped_lines == 1


def test_infinite_metrics_are_no_reading():
    text = (SAMPLES / "v0_33_dp2_spec_a.prom").read_text()
    poisoned = text.replace('vllm:num_requests_running{engine="0",model_name="kimi-k2.5"} 3.0',
                            'vllm:num_requests_running{engine="0",model_name="kimi-k2.5"} +Inf')
    assert poisoned != text
    w = MetricsWindow()
    out = w.feed(poisoned, 100.0, None)
    assert out.requests_running == 2  # the other engine's reading; the infinite one is none
    out = w.feed(poisoned.replace("} 2.0", "} 1e308").replace("} +Inf", "} 1e308"), 110.0, None)
    assert out.requests_running is None or isinstance(out.requests_running, int)
    json.dumps(sanitized(out).__dict__, allow_nan=False)


def test_snapshot_json_is_json_whatever_the_floats():
    nan, inf = float("nan"), float("inf")
    snap = Snapshot(host=HostInfo(name="h", rtt_ms=nan), service=ServiceInfo(manager="tmux", unit="u"),
                    runs=(RunInfo(stage="generate", run_id="r", state="running", rate=inf,
                                  last_event={"loss": nan, "nested": [inf, {"x": -inf}]}),))
    doc = json.dumps(sanitized(snap).to_json(), allow_nan=False)
    back = strict_json(doc)
    assert back["host"]["rtt_ms"] is None and back["runs"][0]["rate"] is None
    assert back["runs"][0]["last_event"] == {"loss": None, "nested": [None, {"x": None}]}
    assert ServerMetrics(requests_running=None).requests_running is None


def test_a_verify_report_asking_a_billion_positions_is_capped():
    report = {"checkpoint": "/c", "checks": [{"name": "x", "ok": True, "detail": "d"}, "junk"],
              "acceptance": {"k": 1_000_000_000, "trained": {"per_position": [0.5] * 3 + ["x"],
                                                              "mean_accepted": NAN_FREE},
                             "untrained": "nope"}}
    started = time.monotonic()
    text = table(report)
    assert time.monotonic() - started < 1 and len(text) < 10_000
    assert f"k={K_MAX}" in text and "pos32" in text and "pos33" not in text
    run = RunInfo(stage="verify", run_id="v", state="done", last_event=report)
    started = time.monotonic()
    shown = str(verify_markup(run))
    assert time.monotonic() - started < 1 and len(shown) < 10_000 and f"k={K_MAX}" in shown


NAN_FREE = "1.5"  # a string where a number belongs


def poison_run(work_dir: str) -> None:
    run = Path(work_dir) / "runs" / "old"
    run.mkdir(parents=True)
    run.joinpath("events.jsonl").write_bytes(
        line("start", run_id="old", total=5) + b"\n".join(POISON + NONSENSE) + b"\n"
        + line("finish", run_id="old", status="completed", summary={"done": NAN_FREE, "k": 10**9}))


def poison_train_and_verify(work_dir: str) -> None:
    """A train run and a verify run as a hostile writer would leave them: every value of the wrong kind."""
    train = Path(work_dir) / "runs" / "t1"
    train.mkdir(parents=True)
    train.joinpath("events.jsonl").write_bytes(
        line("start", stage="train", run_id="t1", total="many")
        + b'{"ts":2,"kind":"progress","stage":"train","run_id":"t1","phase":"plan","total":1e999,'
          b'"steps_per_epoch":"x","epochs":NaN}\n'
        + b'{"ts":3,"kind":"progress","stage":"train","run_id":"t1","phase":"train","step":' + b"9" * 400
        + b',"loss":"x","acc_k":[NaN,"a",1e999],"lr":Infinity,"epoch":"e","rate":-1e999,"eta_s":[]}\n'
        + b'{"ts":4,"kind":"progress","stage":"train","run_id":"t1","phase":"val","step":1,"val_loss":1e308,'
          b'"val_acc_k":{"a":1}}\n'
        + b'{"ts":5,"kind":"resume","stage":"train","run_id":"t1","step":-' + b"9" * 400 + b'}\n')
    verify = Path(work_dir) / "runs" / "v1"
    verify.mkdir(parents=True)
    verify.joinpath("events.jsonl").write_bytes(
        line("start", stage="verify", run_id="v1", total=1)
        + line("finish", stage="verify", run_id="v1", status="completed",
               summary={"checks": [{"name": ["x"], "ok": "yes"}, 7], "checkpoint": {"a": 1},
                        "acceptance": {"k": 1_000_000_000, "trained": {"per_position": "x", "mean_accepted": "1"},
                                       "untrained": []}}))


def good_run(work_dir: str, done: int) -> Path:
    path = Path(work_dir) / "runs" / "good" / "events.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        if done == 0:
            f.write(line("start", run_id="good", total=9))
        f.write(line("progress", run_id="good", done=done, total=9))
    return path


def test_status_json_with_a_poisoned_events_file(tmp_path):
    profile = demo.prepare(tmp_path / "d")
    poison_run(profile.paths.work_dir)
    res = subprocess.run([sys.executable, "-m", "console.cli", "status", "--profile", profile.source, "--json"],
                         capture_output=True, text=True, timeout=60, cwd=REPO, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    doc = strict_json(res.stdout)
    [old] = [r for r in doc["runs"] if r["run_id"] == "old"]
    assert old["state"] == "done" and old["skipped_lines"] == len(POISON) and old["done"] == 0


async def test_the_console_keeps_refreshing_beside_a_poisoned_run(tmp_path):
    profile = demo.prepare(tmp_path / "d")
    poison_run(profile.paths.work_dir)
    poison_train_and_verify(profile.paths.work_dir)
    good_run(profile.paths.work_dir, 0)
    app = ConsoleApp(Session(profile, interval=0.2))
    async with app.run_test(size=(160, 50)) as pilot:
        def good_done():
            snap = app.last_snapshot
            return next((r.done for r in snap.runs if r.run_id == "good"), None) if snap else None

        await until(lambda: good_done() == 0, "the good run shown", timeout=30, pause=pilot.pause)
        for done in (3, 7):
            good_run(profile.paths.work_dir, done)
            await until(lambda: good_done() == done, f"progress {done} shown", timeout=30, pause=pilot.pause)
        assert app.last_snapshot.host.reachable
        old = next(r for r in app.last_snapshot.runs if r.run_id == "old")
        assert old.skipped_lines == len(POISON)
        assert {"t1", "v1"} <= {r.run_id for r in app.last_snapshot.runs}
        for _ in range(8):  # walk the stage list: each stage's pane and row draws its runs
            await pilot.press("j")
            await pilot.pause(0.1)
        good_run(profile.paths.work_dir, 8)
        await until(lambda: good_done() == 8, "progress 8 shown", timeout=30, pause=pilot.pause)


def probe_loop(book: RunBook, files: dict[str, bytes], probes: int) -> None:
    """What the probe does each tick: list the runs, then read each asked range (`tail -c +N | head -c L`)."""
    for tick in range(probes):
        book.apply_listing([RunFile(d, d.rsplit("/", 1)[-1], size=len(b), mtime=i) for i, (d, b) in
                            enumerate(files.items())])
        for read in book.reads_wanted():
            data = files[read.run_dir][read.offset:read.offset + read.limit]
            book.apply_events(read.run_dir, data, read.limit, offset=read.offset)


def test_a_start_event_larger_than_the_probe_budget_is_read():
    from console.telemetry.runs import PROBE_EVENTS_BUDGET
    manifest = {f"file{i}": "x" * 100 for i in range(30_000)}  # ~3.3 MiB: a large dataset's manifest
    start = line("start", total=9, unit="e3-pipeline-p1", manifest=manifest)
    assert len(start) > PROBE_EVENTS_BUDGET
    files = {"/w/runs/r1": start + line("progress", done=2, total=9)}
    book = RunBook("systemd")
    probe_loop(book, files, 6)
    book.apply_unit_states("Id=e3-pipeline-p1.service\nActiveState=active\n", book.pending_units())
    [info] = book.infos()
    assert (info.state, info.unit, info.done, info.total) == ("running", "e3-pipeline-p1", 2, 9)
    assert book.tracks["/w/runs/r1"].offset == len(files["/w/runs/r1"])


async def test_wait_ready_and_status_shrug_off_infinite_metrics(tmp_path):
    """A server whose /metrics says +Inf requests are running is ready all the same: wait-ready exits 0
    (not 1, "load failed") and status --json stays JSON."""
    from console.commands.server_cmd import wait_ready
    from console.profile import write_profile

    work = tmp_path / "d"
    profile = demo.prepare(work, speed=10)
    profile.server.command = [*profile.server.command, "--fault", "inf-metrics"]
    write_profile(profile, profile.source, overwrite=True)
    res = subprocess.run([sys.executable, "-m", "console.cli", "start-server", "--profile", profile.source],
                         capture_output=True, text=True, timeout=60, cwd=REPO, stdin=subprocess.DEVNULL)
    try:
        assert res.returncode == 0, res.stderr
        rc, snap = await wait_ready(profile, timeout=90, interval=0.2)
        assert rc == 0, snap and snap.server
        out = subprocess.run([sys.executable, "-m", "console.cli", "wait-ready", "--profile", profile.source,
                              "--timeout", "30"], capture_output=True, text=True, timeout=60, cwd=REPO,
                             stdin=subprocess.DEVNULL)
        assert out.returncode == 0, out.stderr
        status = subprocess.run([sys.executable, "-m", "console.cli", "status", "--profile", profile.source,
                                 "--json"], capture_output=True, text=True, timeout=60, cwd=REPO,
                                stdin=subprocess.DEVNULL)
        doc = strict_json(status.stdout)
        assert doc["server"]["phase"] == "ready"
        metrics = doc["server"]["metrics"]
        assert metrics is None or metrics["requests_running"] is None
    finally:
        await demo.stop(work)
