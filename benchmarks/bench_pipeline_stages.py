"""The tiny drafter pipeline on the demo host, end to end on CPU: wall time per stage, and the acceptance it
reaches next to stock speculators trained on the same data.

1. A demo host (the stand-in serving the tiny verifier) in a temporary directory, and one detached
   `run pipeline --limit N --yes --wait` through the console's CLI, as an operator starts it: generate ->
   prepare -> extract (with the server swap) -> train -> verify. Each stage's wall time comes from the
   chain's own events (the stage started / completed progress records); the total is the command's wall
   time, launching and following included. Target: the whole chain under 3 minutes on a 2-core machine.
2. Stock speculators on the same data: its own `Trainer` (on a machine without an accelerator, with only the
   device handling that lets it run: benchmarks/bench_train_overhead.py's pieces) given exactly the
   `speculators train` flags the pipeline's train stage used (its train_plan.json), on the same extract run.
   Its checkpoint is verified by the same verify stage on the same held-out rows (`--checkpoint`), so the
   two mean accepted lengths are measured the same way. Target: >= 2.5 at k=3, and no worse than stock.

    python3 benchmarks/bench_pipeline_stages.py [--limit 300] [--speed 10]

Figures are printed, never asserted.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

RUN_ID = "bench"


def cli(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


def stage_times(runs: Path) -> list[tuple[str, float]]:
    """(stage, wall seconds) from the chain's events: each stage's start record to its completion record."""
    started: dict[str, float] = {}
    out: list[tuple[str, float]] = []
    for e in events(runs / RUN_ID):
        if e.get("kind") != "progress" or not e.get("current"):
            continue
        stage = e["current"]
        if e.get("done") == e.get("total") or stage in started:
            if stage in started:
                out.append((stage, e["ts"] - started.pop(stage)))
        else:
            started[stage] = e["ts"]
    return out


def stock_checkpoint(runs: Path, work: Path) -> tuple[str, float, int]:
    """Stock speculators' Trainer with the pipeline train stage's own speculators flags (same data, hidden
    states, seed, epochs, lr): its last checkpoint, wall seconds and steps."""
    import torch

    import bench_train_overhead as bto
    from backend.drafter import adapters
    from backend.drafter.verifier import inspect_verifier
    from backend.train.plan import PLAN_FILE
    from speculators.train.logger import setup_metric_logger, setup_root_logger

    plan = json.loads((runs / f"{RUN_ID}-train" / PLAN_FILE).read_text())
    save = work / "stock-checkpoints"
    argv = list(plan["argv"])
    for flag, value in (("--save-path", str(save)), ("--log-dir", str(work / "stock-logs"))):
        argv[argv.index(flag) + 1] = value
    info = inspect_verifier(plan["verifier"])
    # speculators' rich console output is the same for both sides and not a figure: keep it off stdout
    with contextlib.redirect_stdout(io.StringIO()), adapters.verifier_adapters(info), adapters.no_accelerator():
        setup_root_logger()
        setup_metric_logger(loggers="", run_name=None, output_dir=str(work / "stock-logs"))
        draft, train_loader, val_loader, config = bto.build(argv)
        trainer = bto.stock_trainer_class()(draft, config, train_loader, val_loader)
        start = time.perf_counter()
        trainer.run_training()
        elapsed = time.perf_counter() - start
    del torch
    epochs = sorted((p for p in save.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not epochs:
        raise SystemExit(f"stock speculators left no checkpoint in {save}")
    return str(epochs[-1]), elapsed, trainer.global_step


def verify(profile: str, work_dir: Path, checkpoint: str | None, run_id: str) -> dict:
    """The verify stage on the pipeline's train run (its held-out rows and hidden states), optionally on
    another checkpoint; run directly on this host (the demo host is this machine)."""
    from console.profile import load_profile

    p = load_profile(profile)
    argv = [sys.executable, "-m", "backend.verify", "--work-dir", str(work_dir), "--run-id", run_id,
            "--input-run", f"{RUN_ID}-train", "--speculative-tokens", str(p.drafter.num_speculative_tokens),
            "--samples", str(p.verify.samples)]
    if checkpoint:
        argv += ["--checkpoint", checkpoint]
    res = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if res.returncode != 0:
        raise SystemExit(f"verify of {checkpoint} failed: {res.stderr[-2000:]}")
    return json.loads((work_dir / "runs" / run_id / "verify.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=300, help="samples generated")
    parser.add_argument("--speed", type=float, default=10.0, help="the demo host's speed-up")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sim import tinylm

    tinylm.ensure_model()  # built once per machine; not part of any stage's time
    work = Path(tempfile.mkdtemp(prefix="bench-pipeline-")) / "demo"
    started = cli("demo-host", "start", "--dir", str(work), "--speed", f"{args.speed:g}")
    if started.returncode != 0:
        raise SystemExit(f"the demo host did not start: {started.stderr}")
    profile = started.stdout.strip()
    try:
        if cli("wait-ready", "--profile", profile, "--timeout", "300").returncode != 0:
            raise SystemExit("the demo server did not become ready")
        t0 = time.perf_counter()
        done = cli("run", "pipeline", "--profile", profile, "--limit", str(args.limit), "--run-id", RUN_ID,
                   "--yes", "--wait")
        total = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"the pipeline failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        runs = work / "runs"
        times = stage_times(runs)
        ours = json.loads((runs / f"{RUN_ID}-verify" / "verify.json").read_text())
        train_summary = json.loads((runs / f"{RUN_ID}-train" / "summary.json").read_text())
        load = os.getloadavg()[0]  # a shared machine's neighbours show in every figure: say how busy it was
        print(f"demo pipeline, {args.limit} samples generated, speed {args.speed:g}, {os.cpu_count()} CPUs, "
              f"load average {load:.1f} at the end:")
        for stage, seconds in times:
            print(f"  {stage:<9} {seconds:7.1f} s")
        print(f"  {'stages':<9} {sum(s for _, s in times):7.1f} s")
        print(f"  {'total':<9} {total:7.1f} s (the `run pipeline --wait` command: launch, chain, follow; "
              f"target < 180 s)")
        ckpt, stock_s, stock_steps = stock_checkpoint(runs, work)
        stock = verify(profile, work, ckpt, f"{RUN_ID}-stock-verify")
        k = ours["k"]
        a, s = ours["acceptance"], stock["acceptance"]
        print(f"offline acceptance, k={k}, on {a['trained'].get('samples', '?')} held-out samples "
              f"(mean accepted length; target >= 2.5 and no worse than stock):")
        print(f"  pipeline (train stage, {train_summary.get('steps')} steps): "
              f"{a['trained']['mean_acceptance_length']:.3f}")
        print(f"  stock speculators Trainer, same flags and data ({stock_steps} steps, {stock_s:.1f} s): "
              f"{s['trained']['mean_acceptance_length']:.3f}")
        print(f"  untrained draft of the same shape: {a['untrained']['mean_acceptance_length']:.3f}")
        ratio = a["trained"]["mean_acceptance_length"] / s["trained"]["mean_acceptance_length"]
        print(f"  ratio pipeline/stock: {ratio:.3f}")
    finally:
        cli("demo-host", "stop", "--dir", str(work))
        if not args.keep:
            import shutil

            shutil.rmtree(work.parent, ignore_errors=True)
        else:
            print(f"work directory kept: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
