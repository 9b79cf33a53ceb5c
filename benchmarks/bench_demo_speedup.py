"""The demo host's end-to-end figure: what the trained tiny drafter is worth, measured, side by side.

    python benchmarks/bench_demo_speedup.py [--prompts 12] [--max-tokens 192] [--concurrency 1,4]
                                            [--gpu-step-ms 0,10]

On this machine (CPU): the tiny verifier (sim/tinylm.py), an untrained EAGLE-3 draft (`speculators train
--dry-run`) and the same draft trained for a few seconds (tests/specdec_support.py, speculators' model and
loss), each served by the stand-in with vLLM's --speculative-config and benched with `python -m
backend.bench` on the same prompts (the demo's questions, greedy, fixed output length and seed): the
baseline first, then the untrained drafter, then the trained one compared with both. Prints the bench's
three-way table and the headline: acceptance length of trained and untrained, and the trained drafter's
speed-up against the baseline and against the untrained drafter, per concurrency level.

`--gpu-step-ms`: each value is one round of the three servers with `--latency-per-token` set to it, the
simulated GPU's cost of one verifier forward pass (spent once per step whatever it verifies, as a
memory-bound decode step is); 0 is the CPU alone, where the verifier and the draft cost about the same
per call and only the work saved by accepted tokens can pay.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend.bench.compare import comparison_from_dict, format_table  # noqa: E402
from sim import tinylm  # noqa: E402
from sim.tinycorpus import DEMO_ASKS, DEMO_TOPICS  # noqa: E402
from tests.sim_support import SimServer  # noqa: E402
from tests.specdec_support import dry_run, train  # noqa: E402

MODEL = "tiny"


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def serve(work: Path, step_s: float, drafter: Path | None) -> SimServer:
    args = ["--text-backend", "tinylm", "--served-model-name", MODEL, "--stats-interval", "60",
            "--latency-per-token", f"{step_s:g}"]
    if drafter is not None:
        args += ["--speculative-config", json.dumps({"method": "eagle3", "model": str(drafter),
                                                     "num_speculative_tokens": 3})]
    return SimServer(work, *args, env={"HF_HUB_OFFLINE": "1"}).start().wait_ready(timeout=180)


def bench(work: Path, sim: SimServer, run_id: str, label: str, a: argparse.Namespace, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "backend.bench", "--work-dir", str(work), "--run-id", run_id, "--endpoint", sim.url,
           "--model", MODEL, "--prompts", str(work / "prompts.jsonl"), "--label", label, "--concurrency",
           a.concurrency, "--num-prompts", str(a.prompts), "--max-tokens", str(a.max_tokens), "--temperature", "0",
           "--client", "ours", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=1800)
    if proc.returncode not in (0, 3):
        raise SystemExit(f"bench {label} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads((work / "runs" / run_id / "summary.json").read_text())


def round_of(work: Path, step_ms: float, drafters: dict[str, Path], a: argparse.Namespace) -> None:
    tag = f"{step_ms:g}ms"
    step_s = step_ms / 1000
    for label, drafter, extra in (("baseline", None, ()),
                                  ("untrained", drafters["untrained"], ("--baseline-run", f"base-{tag}")),
                                  ("trained", drafters["trained"], ("--baseline-run", f"base-{tag}",
                                                                    "--third-run", f"untrained-{tag}"))):
        run_id = f"base-{tag}" if label == "baseline" else f"{label}-{tag}"
        sim = serve(work, step_s, drafter)
        try:
            summary = bench(work, sim, run_id, label, a, *extra)
        finally:
            sim.terminate()
    cmp = comparison_from_dict(summary["comparison"])
    print(f"\n== simulated GPU step {tag} per verifier forward pass"
          f"{' (CPU alone)' if step_ms == 0 else ''} ==")
    print(format_table(cmp))
    by = {(r.concurrency, r.label): r for r in cmp.rows}
    for c in sorted({r.concurrency for r in cmp.rows}):
        t, u, b = by.get((c, "trained")), by.get((c, "untrained")), by.get((c, "baseline"))
        if not (t and u and b):
            continue
        print(f"concurrency {c}: acceptance length trained {t.acceptance_length:.2f} vs untrained "
              f"{u.acceptance_length:.2f}; trained speed-up {t.ratio:.2f}x vs baseline, "
              f"{t.output_tps / u.output_tps:.2f}x vs untrained (untrained {u.ratio:.2f}x vs baseline)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--gpu-step-ms", default="0,10", help="comma-separated; 0 = the CPU alone")
    a = p.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="e3-demo-speedup-") as tmp:
        work = Path(tmp)
        verifier = tinylm.ensure_model()
        rows = [{"conversations": [{"from": "human", "value": ask.format(t=t)}, {"from": "gpt", "value": "-"}]}
                for t in DEMO_TOPICS for ask in DEMO_ASKS]
        (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        t0 = time.monotonic()
        untrained = dry_run(verifier, work / "untrained", env())
        trained, losses = train(verifier, untrained, work / "trained")
        print(f"verifier {verifier}\ndrafters built in {time.monotonic() - t0:.1f} s (training loss per epoch: "
              f"{', '.join(f'{x:.3f}' for x in losses)})")
        for step in a.gpu_step_ms.split(","):
            round_of(work, float(step), {"untrained": untrained, "trained": trained}, a)
    print(f"\ntotal {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
