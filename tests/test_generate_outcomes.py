"""What a generation run reports when its input is bad or it dies: one-line dataset errors, a run with no
usable rows, and a killed run's durable count as the console shows it. Against the stand-in, as
subprocesses; every process started here is killed by its pid at the end of its test.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.kit import dataset as ds
from console.telemetry.probe import RunFile
from console.telemetry.runs import RunBook
from harness.generate_support import REPO, events, gen_argv, records, run_gen, write_dataset


def _corrupt_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    parquet = tmp / "broken.parquet"
    parquet.write_bytes(b"PAR1" + b"\x00garbage, not a parquet footer" * 20)
    lines = tmp / "broken.json"
    lines.write_text('{"conversations": [{"from": "human", "value": "a"}]}\n{"conversations": [,]}\n')
    array = tmp / "array.json"
    array.write_text('[{"messages": [{"role": "user", "content": "a"}]},\n {"messages": [}\n]\n')
    return {"parquet": (parquet, f"{parquet}: not a readable parquet file (Parquet magic bytes not found"),
            "jsonl-in-json": (lines, f"{lines}: line 2 column 20: not valid JSON (Expecting value)"),
            "array": (array, f"{array}: line 2 column 16: not valid JSON (Expecting value)")}


@pytest.mark.parametrize("kind", ["parquet", "jsonl-in-json", "array"])
def test_corrupt_dataset_is_one_clear_line(tmp_path, kind):
    path, expected = _corrupt_files(tmp_path)[kind]
    with pytest.raises(ds.DatasetError) as info:
        ds.describe(str(path))
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)
    # the preflight the console runs prints that line, not a traceback
    result = subprocess.run([sys.executable, "-m", "backend.generate", "--dataset", str(path), "--work-dir",
                             str(tmp_path / "w"), "--model", "m", "--endpoint", "http://127.0.0.1:9",
                             "--preflight-only"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"generate: {info.value}"]


def test_zero_usable_rows_fails_with_the_counts_by_reason(standin, tmp_path):
    server = standin()
    with open(tmp_path / "d.jsonl", "w") as f:
        f.write("{not json\n")
        f.write(json.dumps({"conversations": [{"from": "gpt", "value": "an answer, no question"}]}) + "\n")
    result = run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w"))
    assert result.returncode == 1
    run = tmp_path / "w" / "runs" / "r"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and (summary["done"], summary["total"]) == (0, 2)
    assert "no usable rows" in summary["error"] and "invalid_json: 1, no_user_turn: 1" in summary["error"]
    assert "no usable rows" in result.stderr and "invalid_json: 1" in result.stderr
    assert events(run)[-1]["status"] == "failed"


def test_killed_run_shows_what_is_on_disk_and_counts_total_alike(standin, tmp_path):
    """kill -9 long before the periodic progress event: the console still shows the durable records."""
    first = standin("--fault", "die-after:12", "--latency", "0.01")
    write_dataset(tmp_path / "d.jsonl", 40)  # + 4 bad rows: 44 rows in scope
    run = tmp_path / "w" / "runs" / "r"
    proc = subprocess.Popen(gen_argv(first, tmp_path / "d.jsonl", tmp_path / "w", "--concurrency", "2",
                                     "--progress-interval", "600"),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not ((run / "events.jsonl").exists() and any(e["kind"] == "pause" for e in events(run))):
            assert time.monotonic() < deadline, "the run never paused after the stand-in died"
            assert proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.5)  # nothing is written while paused
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    on_disk = len(records(run))
    assert on_disk >= 4  # a few batches of --flush-every 4 are durable
    data = (run / "events.jsonl").read_bytes()
    book = RunBook("systemd")
    book.apply_listing([RunFile(str(run), "r", size=len(data), mtime=0)])
    book.apply_events(str(run), data)
    book.apply_unit_states("Id=e3-generate-r.service\nActiveState=inactive\n", book.pending_units())
    info = book.infos()[0]
    assert (info.state, info.done, info.total) == ("stale", on_disk, 44)
    assert {e["total"] for e in events(run) if e["kind"] in ("start", "progress", "finish")} == {44}


def test_resumed_run_starts_from_what_is_on_disk():
    """The start event carries the counters found on disk: a resumed run shows them before its first
    progress event, not the previous run's last one."""
    from backend.contract.events import Event

    def line(kind, **data) -> bytes:
        return Event(kind=kind, stage="generate", run_id="r1", ts=1.0, data=data).to_line()

    book = RunBook("tmux")
    data = (line("start", done=0, total=50, skipped=0, manifest={"big": "x"}) + line("progress", done=8, total=50)
            + line("start", done=12, total=50, skipped=1, manifest={"big": "x"}))
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=len(data), mtime=0)])
    book.apply_events("/w/runs/r1", data)
    book.apply_unit_states("e3-generate-r1 0\n", book.pending_units())
    info = book.infos()[0]
    assert (info.state, info.done, info.total) == ("running", 12, 50)
    assert "manifest" not in (info.last_event or {})
