"""Warm start (`--from-pretrained`): a drafter that does not fit is refused with the reason, one that fits
trains on, and a warm-started run killed with -9 resumes from its own checkpoint.

One cold run (reduced draft vocabulary, so the d2t/t2d mapping is exercised) is the checkpoint the warm
runs start from; the refusals read copies of it with one fact changed.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness import train_support as ts

pytestmark = pytest.mark.timeout(600)

VOCAB = 256  # of the tiny verifier's 512: the checkpoint carries a d2t/t2d mapping
BASE = ("--seq-length", "256", "--lr", "0.003", "--optimizer", "adamw")


@pytest.fixture(scope="module")
def verifier(tmp_path_factory) -> Path:
    return ts.tiny_verifier(tmp_path_factory)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return ts.stage_env(tmp_path_factory)


@pytest.fixture(scope="module")
def cold(tmp_path_factory, verifier, env) -> dict:
    """A work dir with an extract run and a completed cold train run `cold` (1 epoch)."""
    data = ts.Dataset(tmp_path_factory.mktemp("warm-data"), verifier, train=16, heldout=4)
    work = tmp_path_factory.mktemp("warm-work")
    data.extract_run(work)
    done = ts.run_stage("backend.train", "--work-dir", str(work), "--verifier", str(verifier), "--run-id", "cold",
                        "--epochs", "1", "--draft-vocab-size", str(VOCAB), *BASE, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((work / "runs" / "cold" / "summary.json").read_text())
    return {"work": work, "data": data, "checkpoint": Path(summary["outputs"]["checkpoint"])}


def _copy(cold: dict, tmp_path: Path, edit) -> Path:
    out = tmp_path / "ckpt"
    shutil.copytree(cold["checkpoint"], out)
    config = json.loads((out / "config.json").read_text())
    edit(config)
    (out / "config.json").write_text(json.dumps(config))
    return out


def _refusal(cold: dict, verifier: Path, source: str, draft_vocab: int | None = None) -> str:
    from backend.drafter.verifier import inspect_verifier
    from backend.train import warm_start

    info = inspect_verifier(str(verifier))
    with pytest.raises(warm_start.WarmStartError) as err:
        warm_start.check_fit(source, warm_start.resolve(str(cold["work"]), source), info, ts.LAYERS, draft_vocab)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"warm start {source}")
    return line


def test_a_checkpoint_of_another_shape_or_vocabulary_is_refused_with_the_reason(cold, verifier, tmp_path):
    def hidden(c):
        c["transformer_layer_config"]["hidden_size"] = 128

    line = _refusal(cold, verifier, str(_copy(cold, tmp_path / "h", hidden)))
    assert "hidden size is 128" in line and "64" in line

    def layers(c):
        c["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]

    line = _refusal(cold, verifier, str(_copy(cold, tmp_path / "l", layers)))
    assert "aux layers [0, 1, 2]" in line and "[1, 2, 3]" in line

    def verifier_vocab(c):
        c["transformer_layer_config"]["vocab_size"] = 1024

    assert "vocabulary of 1024 tokens" in _refusal(cold, verifier, str(_copy(cold, tmp_path / "v", verifier_vocab)))
    # the run asks for another draft vocabulary than the checkpoint's own
    line = _refusal(cold, verifier, "cold", draft_vocab=128)
    assert f"draft vocabulary is {VOCAB} tokens" in line and "128" in line
    # a d2t/t2d mapping that does not match the draft vocabulary size
    line = _refusal(cold, verifier, str(_copy(cold, tmp_path / "d", lambda c: c.update(draft_vocab_size=200))))
    assert "lm_head has 256 rows but draft_vocab_size is 200" in line


def test_a_refused_warm_start_is_one_line_and_writes_nothing(cold, verifier, capsys):
    from backend.train.__main__ import main

    work = cold["work"]
    before = sorted(p.name for p in (work / "runs").iterdir())
    capsys.readouterr()
    assert main(["--work-dir", str(work), "--verifier", str(verifier), "--run-id", "warm-bad", "--from-pretrained",
                 "cold", "--draft-vocab-size", "128", *BASE]) == 2
    lines = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(lines) == 1 and "draft vocabulary is 256 tokens" in lines[0]
    assert sorted(p.name for p in (work / "runs").iterdir()) == before
    assert main(["--work-dir", str(work), "--verifier", str(verifier), "--run-id", "warm-bad", "--from-pretrained",
                 "extract-1"]) == 2
    assert "is a extract run" in capsys.readouterr().err


def test_the_plan_passes_from_pretrained_without_the_shaping_flags(cold, verifier):
    from backend.train.config import ConfigError, parse_config
    from backend.train.plan import speculators_argv

    c = parse_config(["--verifier", str(verifier), "--from-pretrained", "cold"])
    argv = speculators_argv(c, train_data="d", hidden_states="h", save_path="s", layer_ids=[1, 2, 3],
                            vocab=(VOCAB, "d2t", "t2d"), remote_code=False, cpu=True, num_workers=0, log_dir="l",
                            cache_dir="c", warm_start="/run/warm-start")
    assert argv[argv.index("--from-pretrained") + 1] == "/run/warm-start"
    for flag in ("--num-layers", "--target-layer-ids", "--draft-vocab-size", "--d2t-path", "--t2d-path"):
        assert flag not in argv
    # speculators' own resolver accepts exactly these flags (it refuses --num-layers beside --from-pretrained)
    from speculators.train.config import TrainConfig

    TrainConfig.resolve(argv)
    with pytest.raises(SystemExit):
        TrainConfig.resolve([*argv, "--num-layers", "1"])
    with pytest.raises(ConfigError, match="decoder-shaping"):
        parse_config(["--verifier", str(verifier), "--from-pretrained", "cold", "--extra-args", "--draft-arch llama"])


def _events(run_dir: Path) -> list[dict]:
    return ts.read_events(run_dir)


def test_a_warm_started_run_trains_from_the_checkpoint_and_resumes_after_kill9(cold, verifier, env):
    work = cold["work"]
    run_dir = work / "runs" / "warm"
    args = ts.stage_cmd("backend.train", "--work-dir", str(work), "--verifier", str(verifier), "--run-id", "warm",
                        "--from-pretrained", "cold", "--epochs", "2", "--checkpoint-freq", "0.5", *BASE)

    proc = subprocess.Popen(args, env=env, cwd=ts.REPO, text=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ev = _events(run_dir)
        marks = [i for i, e in enumerate(ev) if e.get("phase") == "checkpoint"]
        if marks and any(e.get("phase") == "train" for e in ev[marks[0]:]):
            break
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    ckpt_step = [e for e in _events(run_dir) if e.get("phase") == "checkpoint"][-1]["step"]
    done = subprocess.run(args, env=env, cwd=ts.REPO, text=True, capture_output=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    events = _events(run_dir)
    assert [e for e in events if e["kind"] == "resume"][-1]["step"] == ckpt_step + 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["draft_vocab_size"] == VOCAB
    assert summary["warm_start"]["checkpoint"] == str(cold["checkpoint"])
    # held-out acceptance was measured at both epochs' checkpoints, across the kill, and chose the one handed on
    measured = {e["epoch"]: e["mean_acceptance_length"] for e in events if e.get("phase") == "acceptance"}
    assert sorted(measured) == [0, 1] and summary["selection"]["by"] == "acceptance"
    assert summary["outputs"]["checkpoint"] == str(run_dir / "checkpoints" / str(summary["selection"]["epoch"]))
    assert summary["draft_vocab"]["chosen_by"] == "warm start"
    plan = json.loads((run_dir / "train_plan.json").read_text())
    assert "--from-pretrained" in plan["argv"] and "--num-layers" not in plan["argv"]
    # the staged copy names this host's verifier; the checkpoint itself is untouched
    staged = json.loads((run_dir / "warm-start" / "config.json").read_text())
    assert staged["speculators_config"]["verifier"]["name_or_path"] == str(verifier)
    # it started from the cold drafter's weights: its first steps are far better than the cold run's first
    cold_first = [e["loss"] for e in _events(work / "runs" / "cold") if e.get("phase") == "train"][:3]
    warm_first = [e["loss"] for e in events if e.get("phase") == "train"][:3]
    assert sum(warm_first) < 0.8 * sum(cold_first), (warm_first, cold_first)
    # and its checkpoint keeps the cold drafter's vocabulary mapping (verify checks it as vLLM will)
    from backend.drafter.draft import load_draft
    from backend.drafter.verifier import inspect_verifier

    model = load_draft(summary["outputs"]["checkpoint"], inspect_verifier(str(verifier)))
    assert model.lm_head.weight.shape[0] == VOCAB
