"""The generate stage end to end against the vLLM stand-in (sim/vllm_server.py), as subprocesses.

Every process started here is killed by its pid at the end of its test.
"""
from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest

from backend.generate.records import model_turn
from harness.generate_support import MODEL, REPO, events, gen_argv, records, run_gen, write_dataset
from harness.rig.availability import rig_unavailable


@pytest.mark.parametrize("field, version", [("reasoning", "0.33.0"), ("reasoning_content", "0.10.0"),
                                            ("both", "0.12.0")])
def test_every_reasoning_field_captured_and_wrapped(standin, tmp_path, field, version):
    server = standin("--reasoning-field", field, "--vllm-version", version)
    good = write_dataset(tmp_path / "d.jsonl", 12)
    result = run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w"))
    assert result.returncode == 0, result.stderr
    run = tmp_path / "w" / "runs" / "r"
    recs = records(run)
    assert len(recs) == good
    for rec in recs:
        turn = rec["conversations"][-1]
        rec_reasoning = turn["reasoning_content"]
        assert rec_reasoning and rec["reasoning_captured"]
        assert turn == {"role": "assistant", "content": turn["content"], "reasoning_content": rec_reasoning}
        assert model_turn(rec) == "<think>" + rec_reasoning + "</think>" + turn["content"]
        assert rec["conversations"][:-1] == [{"role": "user",
                                              "content": rec["source"]["conversations"][0]["value"]}]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["reasoning_captured"] == good
    assert summary["skipped_by_reason"] == {"invalid_json": 1, "empty_conversation": 1, "no_user_turn": 1,
                                            "wrong_types": 1}
    kinds = [e["kind"] for e in events(run)]
    assert kinds[0] == "start" and kinds[-1] == "finish" and "progress" in kinds or len(kinds) >= 2


def test_truncated_samples_flagged(standin, tmp_path):
    server = standin()
    good = write_dataset(tmp_path / "d.jsonl", 6, bad=False)
    result = run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--max-tokens", "12"))
    assert result.returncode == 0, result.stderr
    run = tmp_path / "w" / "runs" / "r"
    recs = records(run)
    assert len(recs) == good and all(r["truncated"] and r["finish_reason"] == "length" for r in recs)
    assert json.loads((run / "summary.json").read_text())["truncated"] == good


def test_token_rows_export_for_prepare_data(standin, tmp_path):
    server = standin()
    write_dataset(tmp_path / "d.jsonl", 5, bad=False)
    assert run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w")).returncode == 0
    run = tmp_path / "w" / "runs" / "r"
    rows = [json.loads(x) for x in (run / "prepare" / "tokens.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in records(run)}
    assert len(rows) == 5
    for row in rows:
        rec = by_id[row["id"]]
        assert row["input_ids"] == rec["prompt_token_ids"] + rec["token_ids"]
        assert sum(row["loss_mask"]) == len(rec["token_ids"]) == rec["completion_tokens"]


def test_kill_9_at_random_points_then_resume_loses_nothing(standin, tmp_path):
    server = standin("--latency", "0.05")
    good = write_dataset(tmp_path / "d.jsonl", 120)
    argv = gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--concurrency", "2", "--flush-every", "3")
    run = tmp_path / "w" / "runs" / "r"
    rng = random.Random(1234)
    log = run / "events.jsonl"

    def starts() -> int:  # raw bytes: a kill can leave a torn last line
        return log.read_bytes().count(b'"kind":"start"') if log.exists() else 0

    for i in range(20):
        before = starts()
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i % 4:
            # most kills land mid-run: counted from the run's own start, so a slow start-up on a loaded
            # machine cannot turn them all into kills during imports
            deadline = time.monotonic() + 30
            while starts() == before and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        try:
            proc.wait(timeout=rng.uniform(0.05, 0.5))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    result = run_gen(argv)
    assert result.returncode == 0, result.stderr
    recs = records(run)
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)) == good
    assert sorted(r["index"] for r in recs) == list(range(good))
    # the kills really landed mid-run: many restarts resumed from a partial file
    resumed_from = [e["already_done"] for e in events(run) if e["kind"] == "start"]
    assert len({n for n in resumed_from if 0 < n < good}) >= 5, resumed_from


def test_server_crash_and_restart_pauses_and_resumes(standin, tmp_path):
    first = standin("--fault", "die-after:10", "--latency", "0.01")
    good = write_dataset(tmp_path / "d.jsonl", 40, bad=False)
    run = tmp_path / "w" / "runs" / "r"
    proc = subprocess.Popen(gen_argv(first, tmp_path / "d.jsonl", tmp_path / "w", "--concurrency", "4"),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (run / "events.jsonl").exists() and any(e["kind"] == "pause" for e in events(run)):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("no pause event after the stand-in died")
        first.proc.wait(timeout=10)
        time.sleep(0.5)  # the run must wait, not fail, while nothing listens
        assert proc.poll() is None
        standin("--latency", "0.01", port=first.port)  # restarted: refuses while loading, then ready
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    kinds = [e["kind"] for e in events(run)]
    assert kinds.index("pause") < kinds.index("resume")
    assert kinds[-1] == "finish" and events(run)[-1]["status"] == "completed"
    ids = [r["id"] for r in records(run)]
    assert len(ids) == len(set(ids)) == good


def test_5xx_burst_is_retried(standin, tmp_path):
    server = standin("--fault", "5xx:6")
    good = write_dataset(tmp_path / "d.jsonl", 10, bad=False)
    result = run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--skip-preflight"))
    assert result.returncode == 0, result.stderr
    assert len(records(tmp_path / "w" / "runs" / "r")) == good


def test_failed_samples_recorded_and_retried_on_resume(standin, tmp_path):
    server = standin("--fault", "5xx:3")
    good = write_dataset(tmp_path / "d.jsonl", 6, bad=False)
    argv = gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--skip-preflight", "--max-retries", "0",
                    "--concurrency", "1")
    result = run_gen(argv)
    run = tmp_path / "w" / "runs" / "r"
    assert result.returncode == 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed"] == 3 and "rerun" in summary["error"]
    failures = [json.loads(x) for x in (run / "failures.jsonl").read_text().splitlines()]
    assert len(failures) == 3 and all("HTTP 500" in f["error"] for f in failures)
    assert run_gen(argv).returncode == 0
    assert len(records(run)) == good


def test_mismatched_manifest_refused_and_fresh_archives(standin, tmp_path):
    server = standin()
    write_dataset(tmp_path / "d.jsonl", 3, bad=False)
    assert run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--max-tokens", "50")).returncode == 0
    result = run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--max-tokens", "60"))
    assert result.returncode == 2
    assert "max_tokens was 50, now 60" in result.stderr and "--fresh" in result.stderr
    result = run_gen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--max-tokens", "60", "--fresh"))
    assert result.returncode == 0, result.stderr
    archived = [p.name for p in (tmp_path / "w" / "runs").iterdir() if ".archived-" in p.name]
    assert len(archived) == 1 and (tmp_path / "w" / "runs" / archived[0] / "output.jsonl").exists()


def test_sigterm_stops_cleanly(standin, tmp_path):
    server = standin("--latency", "0.3")
    write_dataset(tmp_path / "d.jsonl", 200, bad=False)
    run = tmp_path / "w" / "runs" / "r"
    proc = subprocess.Popen(gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--stop-grace-s", "5"),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not ((run / "events.jsonl").exists() and any(e["kind"] == "progress" for e in events(run))):
            assert time.monotonic() < deadline, "the run never reported progress"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    last = events(run)[-1]
    assert last["kind"] == "finish" and last["status"] == "stopped"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "stopped" and 0 < summary["done"] < 200
    assert len(records(run)) == summary["done"]


def test_preflight_only_reports_fixes(standin, tmp_path):
    server = standin()
    write_dataset(tmp_path / "d.jsonl", 3, bad=False)
    base = gen_argv(server, tmp_path / "d.jsonl", tmp_path / "w", "--preflight-only")
    ok = run_gen(base)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["ok"] and report["token_ids"] is True
    assert {c["name"] for c in report["checks"] if not c["warning"]} == {
        "python_modules", "server_ready", "served_model", "smoke_completion", "prompt_fit", "disk_space"}
    # the host's integrity comes as warnings (backend/kit/hostfacts.py): said, never failing the preflight
    assert "vllm_installs" in {c["name"] for c in report["checks"] if c["warning"]}
    assert not (tmp_path / "w" / "runs").exists()  # preflight alone creates nothing
    wrong = json.loads(run_gen([*base, "--model", "other"]).stdout)
    check = next(c for c in wrong["checks"] if c["name"] == "served_model")
    assert not check["ok"] and f"--model {MODEL}" in check["fix"]
    nothink = json.loads(run_gen([*base, "--chat-template-kwargs", '{"thinking": false}']).stdout)
    check = next(c for c in nothink["checks"] if c["name"] == "smoke_completion")
    assert not check["ok"] and "--reasoning-parser" in check["fix"]
    server.kill()
    down = json.loads(run_gen(base).stdout)
    check = next(c for c in down["checks"] if c["name"] == "server_ready")
    assert not down["ok"] and not check["ok"] and "start the server" in check["fix"]


def test_full_disk_stops_cleanly_with_intact_file(standin, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=384k", "tmpfs", str(mnt)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        rig_unavailable(f"cannot mount a small tmpfs for the full-disk test (needs root): {mounted.stderr.strip()}")
    try:
        server = standin("--response-tokens", "600")
        write_dataset(tmp_path / "d.jsonl", 300, bad=False)
        result = run_gen(gen_argv(server, tmp_path / "d.jsonl", mnt, "--skip-preflight", "--no-token-rows"))
        assert result.returncode == 1
        assert "full" in result.stderr and "rerun the same command" in result.stderr
        run = mnt / "runs" / "r"
        recs = records(run)  # every line whole, no torn tail
        assert 0 < len(recs) < 300
        assert len({r["id"] for r in recs}) == len(recs)
        last = events(run)[-1]  # truncating the output back frees room for the finish event
        assert last["kind"] == "finish" and last["status"] == "failed" and "full" in last["summary"]["error"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
