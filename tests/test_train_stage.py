"""The train and verify stages for real: speculators training on CPU with the tiny verifier.

One training run is driven through its faults once per module and every test reads what it left:
start -> SIGTERM mid-epoch (a resumable checkpoint) -> restart (resumes, no step twice) -> kill -9 after
a mid-epoch checkpoint -> restart to completion (resumes from that checkpoint; the console's view drops
the redone steps). Then verify measures the checkpoint. Bad inputs each fail fast with one line.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness import train_support as ts

pytestmark = pytest.mark.timeout(600)

EPOCHS = 3  # the demo verifier's varied answers (issue 13) need a third epoch for the loss to halve
# lr 0.006: at 0.003 the loss fell to 0.65 of its start, not under 0.6, with the transformers and datasets
# releases a fresh install takes today (5.19, 5.1), for the previous tiny verifier recipe too
TRAIN_ARGS = ("--epochs", str(EPOCHS), "--seq-length", "256", "--lr", "0.006", "--optimizer", "adamw",
              "--draft-vocab-size", "512", "--checkpoint-freq", "0.25", "--run-id", "train-1")


def _train_steps(events: list[dict]) -> list[int]:
    return [e["step"] for e in events if e.get("kind") == "progress" and e.get("phase") == "train"]


def _wait_for(run_dir: Path, proc: subprocess.Popen, pred, timeout: float = 240) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = ts.read_events(run_dir)
        if pred(events):
            return events
        if proc.poll() is not None:
            raise AssertionError(f"the stage exited {proc.returncode} early:\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("timed out waiting for the stage's events")


@pytest.fixture(scope="module")
def verifier(tmp_path_factory) -> Path:
    return ts.tiny_verifier(tmp_path_factory)


@pytest.fixture(scope="module")
def data(tmp_path_factory, verifier) -> ts.Dataset:
    return ts.Dataset(tmp_path_factory.mktemp("train-data"), verifier, train=32, heldout=10)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return ts.stage_env(tmp_path_factory)


@pytest.fixture(scope="module")
def faulted_run(tmp_path_factory, verifier, data, env):
    """The training run driven through SIGTERM, restart, kill -9 and restart (see the module docstring)."""
    work = tmp_path_factory.mktemp("work")
    data.extract_run(work)
    run_dir = work / "runs" / "train-1"
    args = ("--work-dir", str(work), "--verifier", str(verifier), *TRAIN_ARGS)
    started = time.monotonic()
    record: dict = {"work": work, "run_dir": run_dir}

    def launch() -> subprocess.Popen:
        return subprocess.Popen(ts.stage_cmd("backend.train", *args), env=env, cwd=ts.REPO, text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    # 1. SIGTERM once a few steps are done
    proc = launch()
    _wait_for(run_dir, proc, lambda ev: len(_train_steps(ev)) >= 3)
    proc.send_signal(signal.SIGTERM)
    record["rc_sigterm"] = proc.wait(timeout=120)
    record["stderr_sigterm"] = proc.stderr.read()
    record["after_sigterm"] = ts.read_events(run_dir)
    state = next((run_dir / "checkpoints").glob("*/training_state.json"))
    record["state_after_sigterm"] = json.loads(state.read_text())
    # 2. restart; kill -9 one step after its first checkpoint
    proc = launch()
    seen = len(record["after_sigterm"])

    def checkpoint_then_step(ev: list[dict]) -> bool:
        new = ev[seen:]
        marks = [i for i, e in enumerate(new) if e.get("phase") == "checkpoint"]
        return bool(marks) and any(e.get("phase") == "train" for e in new[marks[-1]:])

    record["before_kill"] = _wait_for(run_dir, proc, checkpoint_then_step)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    record["after_kill"] = ts.read_events(run_dir)
    # 3. restart to completion
    proc = launch()
    _, err = proc.communicate(timeout=480)
    record["rc_final"], record["stderr_final"] = proc.returncode, err
    record["events"] = ts.read_events(run_dir)
    record["seconds"] = time.monotonic() - started
    return record


def test_sigterm_leaves_a_resumable_checkpoint(faulted_run):
    r = faulted_run
    assert r["rc_sigterm"] == 0, r["stderr_sigterm"][-2000:]
    finish = [e for e in r["after_sigterm"] if e["kind"] == "finish"]
    assert finish[-1]["status"] == "stopped"
    interrupts = [e for e in r["after_sigterm"] if e.get("checkpoint_kind") == "interrupt"]
    assert len(interrupts) == 1
    last_step = _train_steps(r["after_sigterm"])[-1]
    assert interrupts[0]["step"] == last_step  # saved right after the step in flight
    state = r["state_after_sigterm"]  # speculators' own mid-epoch resume format
    assert state["global_step"] == last_step + 1 and state["local_step"] > 0


def test_restart_after_sigterm_resumes_with_no_step_twice(faulted_run):
    r = faulted_run
    resumes = [e for e in r["before_kill"] if e["kind"] == "resume"]
    assert resumes and resumes[0]["step"] == _train_steps(r["after_sigterm"])[-1] + 1
    steps = _train_steps(r["before_kill"])
    assert len(steps) == len(set(steps)) and steps == list(range(len(steps)))  # literally once in the file


def test_kill9_restart_resumes_from_the_last_checkpoint(faulted_run):
    from console.telemetry.runs import RunBook
    from console.telemetry.probe import RunFile

    r = faulted_run
    checkpoints = [e for e in r["after_kill"] if e.get("phase") == "checkpoint"]
    last_ckpt_step = checkpoints[-1]["step"]
    trained_before_kill = _train_steps(r["after_kill"])[-1]
    assert trained_before_kill > last_ckpt_step  # a step was lost with the kill
    resumes = [e for e in r["events"] if e["kind"] == "resume"]
    assert resumes[-1]["step"] == last_ckpt_step + 1
    # the file now holds the redone steps twice; the console's reader honours the resume event
    raw = (r["run_dir"] / "events.jsonl").read_bytes()
    book = RunBook("systemd")
    book.apply_listing([RunFile(str(r["run_dir"]), "train-1", len(raw), 0.0)])
    book.apply_events(str(r["run_dir"]), raw)
    series = book.tracks[str(r["run_dir"])].series
    steps = [s for s, _ in series.loss]
    assert len(steps) == len(set(steps)) and steps == list(range(len(steps)))
    assert series.resumed_from == last_ckpt_step + 1
    info = book.infos()[0]
    assert info.state == "done" and info.series["step"] == steps[-1]


def test_training_completes_loss_falls_and_checkpoint_reloads(faulted_run, verifier):
    r = faulted_run
    assert r["rc_final"] == 0, r["stderr_final"][-3000:]
    summary = json.loads((r["run_dir"] / "summary.json").read_text())
    assert summary["status"] == "completed"
    losses = [e["loss"] for e in r["events"] if e.get("phase") == "train"]
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
    vals = [e["val_loss"] for e in r["events"] if e.get("phase") == "val"]
    assert len(vals) >= EPOCHS and vals[-1] < vals[0]
    ckpt = summary["outputs"]["checkpoint"]
    # held-out acceptance was measured at every epoch's checkpoint (once each, the kill -9 notwithstanding)
    # and the best one is handed on; speculators' own checkpoint_best (lowest val loss) stays beside it
    measured = {e["epoch"]: e["mean_acceptance_length"] for e in r["events"] if e.get("phase") == "acceptance"}
    assert sorted(measured) == list(range(EPOCHS)) and all(v > 1.0 for v in measured.values())
    recorded = json.loads((r["run_dir"] / "checkpoints" / "acceptance.json").read_text())
    best_epoch = max(sorted(measured), key=lambda e: measured[e])
    assert recorded["chosen_epoch"] == summary["selection"]["epoch"]
    assert measured[summary["selection"]["epoch"]] >= measured[best_epoch] - 0.01
    assert ckpt == str(r["run_dir"] / "checkpoints" / str(summary["selection"]["epoch"]))
    assert summary["selection"]["by"] == "acceptance" and "best held-out mean acceptance" in summary["selection"]["why"]
    assert os.path.islink(r["run_dir"] / "checkpoints" / "checkpoint_best")
    for name in ("checkpoints", "heldout_data", "heldout_hidden_states", "token_freq"):
        assert os.path.exists(summary["outputs"][name]), name
    from backend.drafter.draft import load_draft
    from backend.drafter.verifier import inspect_verifier

    model = load_draft(ckpt, inspect_verifier(str(verifier)))
    assert model.config.eagle_aux_hidden_state_layer_ids == ts.LAYERS and model.lm_head.weight.shape[0] == 512
    print(f"\nfaulted training sequence took {r['seconds']:.1f} s")


def test_verify_reports_acceptance_above_the_untrained_draft(faulted_run, env):
    r = faulted_run
    # served at a longer context than the drafter was built for (the console passes the baseline's
    # --max-model-len): a warning, not a failure (vLLM issue 58080)
    done = ts.run_stage("backend.verify", "--work-dir", str(r["work"]), "--input-run", "train-1",
                        "--run-id", "verify-1", "--samples", "8", "--served-context", "1000000", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((r["work"] / "runs" / "verify-1" / "verify.json").read_text())
    built_for = report["context"]["drafter"]
    assert isinstance(built_for, int) and report["context"]["served"] == 1000000
    [warning] = report["warnings"]
    assert "vLLM issue 58080" in warning and f"({built_for}, max_position_embeddings" in warning
    assert "verify: warning: the served context (1000000 tokens" in done.stderr
    assert "warning: the served context (1000000 tokens" in done.stdout  # the report's table
    assert report["ok"] and {c["name"] for c in report["checks"]} == {
        "speculators_format", "aux_layer_ids", "draft_vocab", "verifier", "weights_load"}
    trained, untrained = report["acceptance"]["trained"], report["acceptance"]["untrained"]
    assert trained["samples"] == 8 and trained["anchors"] > 100
    assert trained["mean_acceptance_length"] > untrained["mean_acceptance_length"] + 0.1
    assert trained["per_position"][0] > untrained["per_position"][0]
    assert "offline acceptance, k=3" in done.stdout and "untrained" in done.stdout
    # the K table: expected length per K from the measured per-position acceptance, and a recommendation
    rows = report["k_table"]["rows"]
    assert [r["k"] for r in rows] == [1, 2, 3]
    assert rows[-1]["expected_length"] == pytest.approx(1 + sum(trained["per_position"]), abs=1e-3)
    assert "K from evidence" in done.stdout and "assumed" in report["k_table"]["cost_source"]
    finish = [e for e in ts.read_events(r["work"] / "runs" / "verify-1") if e["kind"] == "finish"][-1]
    assert finish["status"] == "completed" and finish["summary"]["acceptance"] == report["acceptance"]


# ---- bad input: one line, exit 2, nothing written -------------------------------------------------------
def _refused(capsys, work: Path, *args: str) -> str:
    """Run the stage in this process (the same main() the command runs): exit 2, one line, nothing created."""
    from backend.train.__main__ import main

    before = sorted(p.name for p in (work / "runs").iterdir())
    capsys.readouterr()
    assert main(["--work-dir", str(work), *args]) == 2
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("train: "), err
    assert sorted(p.name for p in (work / "runs").iterdir()) == before  # nothing created
    return lines[0]


def test_bad_inputs_are_one_line_errors(tmp_path, data, verifier, capsys):
    work = tmp_path / "work"
    ts.completed_run(work, "extract", "running", data.outputs(), status=None)
    ts.completed_run(work, "extract", "broken", data.outputs(), status="failed")
    data.extract_run(work, run_id="wide")
    # a recorded layer id beyond the 4-layer verifier
    ts.completed_run(work, "extract", "deep", data.outputs(), aux_layer_ids=[1, 2, 7])
    v = ("--verifier", str(verifier))
    assert "has not finished" in _refused(capsys, work, *v, "--input-run", "running")
    assert "failed" in _refused(capsys, work, *v, "--input-run", "broken")
    assert "does not exist on this host" in _refused(capsys, work, "--verifier", str(tmp_path / "nope"),
                                                     "--input-run", "wide")
    assert "out of range" in _refused(capsys, work, *v, "--input-run", "deep")
    assert "differ from the ids" in _refused(capsys, work, *v, "--input-run", "wide", "--aux-layer-ids", "0,1,2")
    assert "may not set --lr" in _refused(capsys, work, *v, "--input-run", "wide", "--extra-args", "--lr 1")
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    assert "no completed extract run" in _refused(capsys, tmp_path / "empty", *v)


def test_checkpoints_of_another_verifier_are_refused_and_kept(faulted_run, tmp_path, verifier, env, capsys):
    from backend.contract.runs import Manifest, read_manifest, write_json_atomic
    from backend.drafter.verifier import inspect_verifier

    other = tmp_path / "other-verifier"
    shutil.copytree(verifier, other)
    config = json.loads((other / "config.json").read_text())
    config["architectures"] = ["OtherLlamaForCausalLM"]
    (other / "config.json").write_text(json.dumps(config))
    work = faulted_run["work"]
    copy = work / "runs" / "train-copy"
    shutil.copytree(faulted_run["run_dir"], copy, symlinks=True)
    old = read_manifest(str(copy))
    info = inspect_verifier(str(other))
    identity = dict(old.identity, verifier=info.path, verifier_fingerprint=info.fingerprint)
    write_json_atomic(str(copy / "manifest.json"), Manifest(stage="train", run_id="train-copy",
                                                            identity=identity).to_dict())
    before = {p: p.stat().st_mtime_ns for p in copy.rglob("*") if p.is_file()}
    args = [a if a != "train-1" else "train-copy" for a in TRAIN_ARGS]
    line = _refused(capsys, work, "--verifier", str(other), *args)
    assert "another verifier" in line and "--fresh" in line
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*") if p.is_file()} == before
    # and verify names the mismatch as a failed check rather than measuring
    done = ts.run_stage("backend.verify", "--work-dir", str(work), "--input-run", "train-1", "--run-id", "v-other",
                        "--verifier", str(other), env=env, timeout=120)
    assert done.returncode == 1 and "trained for another verifier" in done.stdout
