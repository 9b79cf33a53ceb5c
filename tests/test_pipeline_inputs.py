"""How a stage finds its input run (backend/contract/lookup.py): only a completed run of the right stage."""
from __future__ import annotations

import pytest

from backend.contract.events import EventLog
from backend.contract.lookup import InputError, completed_run, latest_completed
from backend.contract.runs import Manifest, open_run_dir


def make_run(work, stage, run_id, *, finish=None, summary=None):
    rd = open_run_dir(str(work), run_id, Manifest(stage=stage, run_id=run_id, identity={"x": run_id}))
    log = EventLog(rd.events_path, stage, run_id)
    log.emit("start", total=1)
    if finish:
        rd.write_summary(summary or {"status": finish})
        log.emit("finish", status=finish, summary=summary or {"status": finish})
    log.close()
    return rd


def test_completed_run_exposes_outputs(tmp_path):
    make_run(tmp_path, "prepare", "p1", finish="completed",
             summary={"status": "completed", "outputs": {"train_data": "/x/train"}})
    run = completed_run(str(tmp_path), "p1", "prepare")
    assert run.output("train_data") == "/x/train"
    with pytest.raises(InputError, match="has no output 'token_freq'"):
        run.output("token_freq")


def test_generation_summary_shape_is_read(tmp_path):
    make_run(tmp_path, "generate", "g1", finish="completed",
             summary={"status": "completed", "output": "/w/out.jsonl", "token_rows": {"path": "/w/t.jsonl"}})
    assert completed_run(str(tmp_path), "g1", "generate").outputs == {"records": "/w/out.jsonl",
                                                                       "token_rows": "/w/t.jsonl"}


@pytest.mark.parametrize("finish, message", [(None, "has not finished"), ("failed", "failed: boom"),
                                             ("stopped", "stopped")])
def test_unfinished_or_failed_runs_are_refused(tmp_path, finish, message):
    make_run(tmp_path, "generate", "g1", finish=finish, summary={"status": finish, "error": "boom"})
    with pytest.raises(InputError, match=message):
        completed_run(str(tmp_path), "g1", "generate")


def test_wrong_stage_and_missing_runs_are_named(tmp_path):
    make_run(tmp_path, "generate", "g1", finish="completed")
    with pytest.raises(InputError, match="not a prepare run"):
        completed_run(str(tmp_path), "g1", "prepare")
    with pytest.raises(InputError, match="no run 'nope'"):
        completed_run(str(tmp_path), "nope", "prepare")


def test_latest_completed_skips_failed_and_running(tmp_path):
    make_run(tmp_path, "generate", "old", finish="completed")
    make_run(tmp_path, "generate", "bad", finish="failed")
    make_run(tmp_path, "generate", "live")
    assert latest_completed(str(tmp_path), "generate").run_id == "old"
    with pytest.raises(InputError, match="no completed prepare run"):
        latest_completed(str(tmp_path), "prepare")
