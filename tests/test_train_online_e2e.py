"""Online training from the console on the demo host, for real on CPU: `run train --online` trains on a prepare
run with no extract stage, the train stage itself swapping the stand-in's extraction server in for the
baseline (backend/kit/swap.py) and speculators fetching each batch's hidden states from it; `run verify --online`
fetches the held-out ones the same way. The baseline is back afterwards, each time."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.drafter_support import tiny_verifier
from harness.rig.availability import rig_unavailable

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parent.parent
SWAP_OK = [("stop_baseline", True), ("start_extractor", True), ("stop_extractor", True), ("start_baseline", True)]


def cli(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL)


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tiny_verifier(tmp_path_factory)  # says what is missing where the training stack is not installed
    work = tmp_path_factory.mktemp("online") / "demo"
    started = cli("demo-host", "start", "--dir", str(work), "--speed", "10")
    assert started.returncode == 0, started.stderr
    profile = Path(started.stdout.strip())
    try:
        assert cli("wait-ready", "--profile", str(profile), "--timeout", "120").returncode == 0
        # a few samples, one epoch: the point is the swap and the online data path, not the drafter
        text = profile.read_text()
        text = re.sub(r"(?m)^epochs = \d+$", "epochs = 1", text)
        profile.write_text(re.sub(r"(?m)^samples = \d+$", "samples = 4", text))
        prepared = cli("run", "pipeline", "--profile", str(profile), "--to", "prepare", "--limit", "12",
                       "--run-id", "on", "--wait")
        assert prepared.returncode == 0, prepared.stdout[-2000:] + prepared.stderr[-2000:]
        yield work / "runs", str(profile)
    finally:
        cli("demo-host", "stop", "--dir", str(work))


@pytest.fixture(scope="module")
def online_train(demo):
    """`run train --online` on the demo's prepare run: (its command's result, after a refusal without --yes)."""
    runs, profile = demo
    refused = cli("run", "train", "--online", "--profile", profile, "--input", "on-prepare", "--run-id", "on-train")
    done = cli("run", "train", "--online", "--profile", profile, "--input", "on-prepare", "--run-id", "on-train",
               "--yes", "--wait")
    return refused, done


def test_online_training_swaps_the_extraction_server_in_records_the_loss_and_brings_the_baseline_back(
        demo, online_train):
    runs, profile = demo
    refused, done = online_train
    assert refused.returncode == 2 and "pass --yes" in refused.stderr  # it stops the server: ask first
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "(server swap) stop_baseline:" in done.stderr  # the operator saw the swap's commands
    summary = json.loads((runs / "on-train" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["online"] is True
    assert summary["vllm_endpoint"].endswith("/v1")
    swap = summary["swap"]
    assert [(s["step"], s["ok"]) for s in swap["steps"]] == SWAP_OK and swap["baseline_restarted"] is True
    # trained on the prepare run, no extract run anywhere, the hidden states fetched and not kept
    assert json.loads((runs / "on-train" / "manifest.json").read_text())["identity"]["input_run"] == "on-prepare"
    assert not any(p.name.endswith("-extract") or "extract" in p.name for p in runs.iterdir())
    assert not list((runs / "on-train").rglob("hs_*.safetensors"))
    evs = events(runs / "on-train")
    losses = [e["loss"] for e in evs if e.get("phase") == "train" and "loss" in e]
    assert losses and all(loss > 0 for loss in losses)
    phases = [e.get("phase") for e in evs if e.get("kind") == "progress"]
    order = ["stopping_baseline", "starting_extractor", "training", "train", "stopping_extractor", "starting_baseline"]
    seen = [p for i, p in enumerate(phases) if p in order and (i == 0 or phases[i - 1] != p)]
    assert seen[:3] == order[:3] and "train" in seen and seen[-2:] == order[-2:], seen  # train steps in between
    checkpoint = Path(summary["outputs"]["checkpoint"])
    assert (checkpoint / "config.json").exists() and list(checkpoint.glob("*.safetensors"))
    assert_baseline_back(profile)


def assert_baseline_back(profile: str) -> None:
    """The baseline (not the extraction server) loads again and answers."""
    assert cli("wait-ready", "--profile", profile, "--timeout", "120").returncode == 0
    status = json.loads(cli("status", "--profile", profile, "--json").stdout)
    assert status["server"]["phase"] == "ready", status["server"]
    assert "extract_hidden_states" not in json.dumps(status["server"])


def test_verify_of_an_online_run_fetches_the_heldout_states_under_the_swap(demo, online_train):
    runs, profile = demo
    assert online_train[1].returncode == 0, "the online train run this verifies failed (see the test before)"
    done = cli("run", "verify", "--online", "--profile", profile, "--input", "on-train", "--run-id", "on-verify",
               "--yes", "--wait")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "offline acceptance, k=3" in done.stdout
    report = json.loads((runs / "on-verify" / "verify.json").read_text())
    assert report["acceptance"]["trained"]["mean_acceptance_length"] >= 1.0
    steps = [e["swap"]["step"] for e in events(runs / "on-verify") if e.get("swap")]
    assert steps == [s for s, _ in SWAP_OK]
    assert_baseline_back(profile)


def test_run_stop_on_an_online_verify_in_the_middle_of_its_swap_brings_the_baseline_back(demo, online_train):
    """`run stop verify --wait` while the verify's swap has the baseline down and the extraction server
    loading: exit 0 once stopped, the run ends as stopped, and the switch back still runs."""
    import time

    runs, profile = demo
    assert online_train[1].returncode == 0, "the online train run this verifies failed (see the tests before)"
    started = cli("run", "verify", "--online", "--profile", profile, "--input", "on-train", "--run-id",
                  "on-verify-stop", "--yes")
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    run_dir = runs / "on-verify-stop"
    deadline = time.monotonic() + 180
    while not any(e.get("swap", {}).get("step") == "stop_baseline" and e["swap"].get("ok")
                  for e in (events(run_dir) if (run_dir / "events.jsonl").exists() else [])):
        assert time.monotonic() < deadline, "the verify never took the baseline down"
        time.sleep(0.2)
    stop = cli("run", "stop", "verify", "--profile", profile, "--wait")
    assert stop.returncode == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
    assert "stopped e3-verify-on-verify-stop" in stop.stdout and "stopped" in stop.stdout.splitlines()[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped", summary
    steps = [e["swap"] for e in events(run_dir) if e.get("swap")]
    assert steps[0]["step"] == "stop_baseline"
    assert (steps[-1]["step"], steps[-1]["ok"]) == ("start_baseline", True)  # the switch back, after the stop
    report = json.loads((run_dir / "verify.json").read_text())  # the checks it got through, said as stopped
    assert report["status"] == "stopped" and not report.get("acceptance"), report
    assert_baseline_back(profile)


def test_an_extraction_server_that_dies_during_online_training_fails_it_with_why_and_the_baseline_comes_back(
        tmp_path_factory, tmp_path):
    """The train stage's own swap (python -m backend.train --plan), as the console starts it on a tmux host:
    the extraction stand-in dies after a few hidden-state requests; training stops, the stage says the server
    died and why (the end of its log), and the baseline is started again."""
    import os
    import shutil

    from harness.drafter_support import prepared_work, run_stage, stage_env
    from harness.tmux_host import AUX, Host

    if shutil.which("tmux") is None:
        rig_unavailable("tmux is not installed (scripts/install-system-deps.sh installs it)")
    tiny = tiny_verifier(tmp_path_factory)
    work = prepared_work(tmp_path_factory, tiny)
    sock = tmp_path / "tmux"
    sock.mkdir()
    os.chmod(sock, 0o700)
    env = {**stage_env(tmp_path_factory), "TMUX_TMPDIR": str(sock)}
    host = Host(work, env, "train-die", ["--fault", "die-after:3"])
    host.start_baseline()
    try:
        plan = host.write_plan("tr-die", tmp_path / "plan.json")
        res = run_stage("backend.train", "--work-dir", str(work), "--run-id", "tr-die", "--input-run", "prep",
                        "--verifier", str(tiny), "--plan", str(plan), "--served-model", "tiny", "--epochs", "1",
                        "--gpus", "0", "--seq-length", "512", "--optimizer", "adamw", env=env, timeout=300)
        assert res.returncode == 1, res.stderr[-3000:]
        summary = json.loads((work / "runs/tr-die/summary.json").read_text())
        assert summary["status"] == "failed" and summary["online"] is True and summary["aux_layer_ids"] == AUX
        assert summary["error"].startswith("the extraction server died midway ("), summary["error"]
        assert "EngineCore" in summary["error"] and summary["error"].endswith("resume from the last checkpoint")
        assert [(s["step"], s["ok"]) for s in summary["swap"]["steps"]] == SWAP_OK
        assert summary["swap"]["baseline_restarted"] is True
        assert host.baseline_is_back() and f"{host.unit}-extract" not in host.panes()
        finish = events(work / "runs" / "tr-die")[-1]
        assert finish["kind"] == "finish" and finish["status"] == "failed"
    finally:
        host.stop_all()
        subprocess.run(["tmux", "kill-server"], env=env, capture_output=True)
