"""Online training from the console on the demo host, for real on CPU: `run train --online` trains on a prepare
run with no extract stage, the train stage itself swapping the stand-in's extraction server in for the
baseline (backend/swap.py) and speculators fetching each batch's hidden states from it; `run verify --online`
fetches the held-out ones the same way. The baseline is back afterwards, each time."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.drafter_support import tiny_verifier

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


def test_online_training_swaps_the_extraction_server_in_records_the_loss_and_brings_the_baseline_back(demo):
    runs, profile = demo
    refused = cli("run", "train", "--online", "--profile", profile, "--input", "on-prepare", "--run-id", "on-train")
    assert refused.returncode == 2 and "pass --yes" in refused.stderr  # it stops the server: ask first
    done = cli("run", "train", "--online", "--profile", profile, "--input", "on-prepare", "--run-id", "on-train",
               "--yes", "--wait")
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


def test_verify_of_an_online_run_fetches_the_heldout_states_under_the_swap(demo):
    runs, profile = demo
    if not (runs / "on-train" / "summary.json").exists():
        pytest.skip("needs the online train run of the test before")
    done = cli("run", "verify", "--online", "--profile", profile, "--input", "on-train", "--run-id", "on-verify",
               "--yes", "--wait")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "offline acceptance, k=3" in done.stdout
    report = json.loads((runs / "on-verify" / "verify.json").read_text())
    assert report["acceptance"]["trained"]["mean_acceptance_length"] >= 1.0
    steps = [e["swap"]["step"] for e in events(runs / "on-verify") if e.get("swap")]
    assert steps == [s for s, _ in SWAP_OK]
    assert_baseline_back(profile)
