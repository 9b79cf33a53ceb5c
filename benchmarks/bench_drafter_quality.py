"""How the drafter is made, measured on the demo's tiny verifier: warm start, acceptance-stopped training and
the draft vocabulary, each side by side on the same data (held-out mean acceptance length, k=3).

- cold vs warm: a drafter trained on other demo questions (the donor) warm-starts a run on the target data;
  both target runs train the same epochs, and every epoch's held-out acceptance is printed side by side
  (the warm one must be better at equal epochs).
- stopped vs fixed: the stage's default acceptance patience against speculators' fixed epoch budget: wall
  time and the acceptance of the checkpoint each hands on (aim: half the time, no worse acceptance).
- vocabulary: the coverage-chosen draft vocabulary (floor lowered to the tiny model's scale) against the
  full one at equal epochs: acceptance, draft lm_head rows.

Every run is the train stage itself (`python -m backend.train`, subprocesses), one thread each.

    python3 benchmarks/bench_drafter_quality.py [--train 32] [--heldout 12] [--epochs 4] [--budget 12]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import train_support as ts  # noqa: E402  (the tiny datasets, as the train tests build them)

COMMON = ("--seq-length", "256", "--lr", "0.003", "--optimizer", "adamw", "--acceptance-samples", "12")


def dataset(root: Path, verifier: Path, train: int, heldout: int, seed: int) -> dict[str, str]:
    """Prepared rows of demo questions (seeded), their hidden states and token frequencies."""
    rows = ts.token_rows(verifier, train, seed=seed)
    held = ts.token_rows(verifier, heldout, seed=12)  # the same held-out rows for every run
    out = {"train_data": ts.write_prepared(root / "train", rows), "heldout_data": ts.write_prepared(root / "held", held),
           "token_freq": ts.write_token_freq(root / "token_freq.pt", rows),
           "train_hidden_states": ts.write_hidden_states(root / "train_hs", verifier, rows),
           "heldout_hidden_states": ts.write_hidden_states(root / "held_hs", verifier, held)}
    return {k: str(v) for k, v in out.items()}


def train(work: Path, verifier: Path, run_id: str, input_run: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    started, cpu = time.monotonic(), _child_cpu()
    done = subprocess.run([sys.executable, "-m", "backend.train", "--work-dir", str(work), "--verifier", str(verifier),
                           "--run-id", run_id, "--input-run", input_run, *COMMON, *args],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{run_id} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((work / "runs" / run_id / "summary.json").read_text())
    history = json.loads((work / "runs" / run_id / "checkpoints" / "acceptance.json").read_text())["history"]
    return {"wall_s": time.monotonic() - started, "cpu_s": _child_cpu() - cpu, "summary": summary,
            "by_epoch": {h["epoch"]: h["mean_acceptance_length"] for h in history}}


def _child_cpu() -> float:
    """CPU seconds of finished child processes: on a shared machine wall time mostly measures the neighbours."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def chosen(run: dict) -> float:
    return run["by_epoch"][run["summary"]["selection"]["epoch"]]


FIXED = ("--acceptance-patience", "0")


def warm_start(work: Path, verifier: Path, a: argparse.Namespace) -> None:
    donor = train(work, verifier, "donor", "extract-b", "--epochs", str(a.epochs), *FIXED)
    cold = train(work, verifier, "cold", "extract-a", "--epochs", str(a.epochs), *FIXED)
    warm = train(work, verifier, "warm", "extract-a", "--epochs", str(a.epochs), "--from-pretrained", "donor", *FIXED)
    print(f"cold vs warm start (warm from a drafter of {a.train} other demo questions), held-out mean acceptance "
          f"length, k=3:")
    print("  epoch   cold    warm")
    for e in range(a.epochs):
        print(f"  {e + 1:<7} {cold['by_epoch'].get(e, float('nan')):<7.3f} {warm['by_epoch'].get(e, float('nan')):.3f}")
    print(f"  donor alone (no target data): {chosen(donor):.3f}")


def stop(work: Path, verifier: Path, a: argparse.Namespace) -> None:
    budget = train(work, verifier, "budget", "extract-a", "--epochs", str(a.budget), *FIXED)
    stopped = train(work, verifier, "stopped", "extract-a", "--epochs", str(a.budget))
    sel = stopped["summary"]["selection"]
    print(f"\nacceptance-stopped (patience 3) vs a fixed {a.budget}-epoch budget:")
    for name, run in (("fixed", budget), ("stopped", stopped)):
        print(f"  {name:<8} {run['cpu_s']:7.1f} CPU s  {len(run['by_epoch'])} epochs  chosen acceptance "
              f"{chosen(run):.3f} (epoch {run['summary']['selection']['epoch'] + 1})")
    print(f"  stopped early: {sel['stopped_early']}; CPU time ratio stopped/fixed "
          f"{stopped['cpu_s'] / budget['cpu_s']:.2f}, acceptance difference {chosen(stopped) - chosen(budget):+.3f}")


def vocabulary(work: Path, verifier: Path, a: argparse.Namespace) -> None:
    small = train(work, verifier, "vocab", "extract-a", "--epochs", str(a.epochs), "--vocab-floor", "16", *FIXED)
    full = train(work, verifier, "full", "extract-a", "--epochs", str(a.epochs), "--draft-vocab-size", "512", *FIXED)
    v = small["summary"]["draft_vocab"]
    print(f"\ndraft vocabulary at {a.epochs} epochs ({v['text']}):")
    for name, run in (("full", full), ("chosen", small)):
        print(f"  {name:<7} {run['summary']['draft_vocab_size']:>5} tokens  acceptance {chosen(run):.3f}  "
              f"{run['cpu_s']:.1f} CPU s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", type=int, default=32)
    p.add_argument("--heldout", type=int, default=12)
    p.add_argument("--epochs", type=int, default=4, help="epochs of the cold/warm and vocabulary runs")
    p.add_argument("--budget", type=int, default=12, help="the fixed epoch budget the stopped run is held against")
    p.add_argument("--only", choices=("warm", "stop", "vocab"), help="run one comparison")
    a = p.parse_args()
    from sim import tinylm

    verifier = tinylm.ensure_model()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "work"
        target, other = (dataset(Path(tmp) / "a", verifier, a.train, a.heldout, 11),
                         dataset(Path(tmp) / "b", verifier, a.train, a.heldout, 21))
        for run_id, outputs in (("extract-a", target), ("extract-b", other)):
            ts.completed_run(work, "extract", run_id, outputs, aux_layer_ids=ts.LAYERS)
        for name, part in (("warm", warm_start), ("stop", stop), ("vocab", vocabulary)):
            if a.only in (None, name):
                part(work, verifier, a)


if __name__ == "__main__":
    main()
