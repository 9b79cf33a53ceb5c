"""The demo host's end-to-end figure: what the trained tiny drafter is worth, measured, side by side.

    python benchmarks/bench_demo_speedup.py [--prompts 8] [--max-tokens 128] [--concurrency 1,4]
                                            [--repeats 3] [--gpu-step-ms 0,10]

On this machine (CPU): the tiny verifier (sim/tinylm.py), an untrained EAGLE-3 draft (`speculators train
--dry-run`) and a draft trained for a few seconds by the train stage (python -m backend.train on an
extract run of the verifier's hidden states, harness/specdec_support.stage_drafter), each served by the
stand-in with vLLM's --speculative-config and benched with `python -m backend.bench` on the same prompts (the demo's questions, greedy, fixed output length and seed): the
three servers are up at once and benched in turn, level by level, several times (the baseline, then the
untrained drafter, then the trained one compared with both), so the shared machine's other load falls on
all three alike. Prints per level the medians: output tokens/s of each, the trained drafter's speed-up
against the baseline and against the untrained drafter, the untrained one's against the baseline, and
both acceptance lengths; then the bench's own three-way table of the last repeat.

`--gpu-step-ms`: each value is one round of the three servers with `--latency-per-token` set to it, the
simulated GPU's cost of one verifier forward pass (spent once per step whatever it verifies, as a
memory-bound decode step is); 0 is the CPU alone, where the verifier and the draft cost about the same
per call and only the work saved by accepted tokens can pay.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend.bench.compare import comparison_from_dict, format_table  # noqa: E402
from sim import tinylm  # noqa: E402
from sim.tinycorpus import demo_questions  # noqa: E402
from harness.sim_support import SimServer  # noqa: E402
from harness.specdec_support import dry_run, stage_drafter  # noqa: E402

MODEL = "tiny"


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def serve(work: Path, step_s: float, drafter: Path | None) -> SimServer:
    args = ["--text-backend", "tinylm", "--served-model-name", MODEL, "--stats-interval", "600",
            "--latency-per-token", f"{step_s:g}"]
    if drafter is not None:
        args += ["--speculative-config", json.dumps({"method": "eagle3", "model": str(drafter),
                                                     "num_speculative_tokens": 3})]
    return SimServer(work, *args, env={"HF_HUB_OFFLINE": "1"}).start()


def bench(work: Path, sim: SimServer, run_id: str, label: str, level: int, a: argparse.Namespace,
          *extra: str) -> dict:
    cmd = [sys.executable, "-m", "backend.bench", "--work-dir", str(work), "--run-id", run_id, "--endpoint", sim.url,
           "--model", MODEL, "--prompts", str(work / "prompts.jsonl"), "--label", label, "--concurrency",
           str(level), "--num-prompts", str(a.prompts), "--max-tokens", str(a.max_tokens), "--temperature", "0",
           "--client", "ours", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=1800)
    if proc.returncode not in (0, 3):
        raise SystemExit(f"bench {label} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads((work / "runs" / run_id / "summary.json").read_text())


def round_of(work: Path, step_ms: float, drafters: dict[str, Path], a: argparse.Namespace) -> None:
    """The three servers up at once (idle ones cost nothing), benched in turn, level by level, `--repeats`
    times: the contenders are measured minutes apart at most, so the machine's other load falls on all."""
    tag = f"{step_ms:g}ms"
    servers = {"baseline": serve(work, step_ms / 1000, None),
               "untrained": serve(work, step_ms / 1000, drafters["untrained"]),
               "trained": serve(work, step_ms / 1000, drafters["trained"])}
    tables: dict[int, list] = {}
    try:
        for sim in servers.values():
            sim.wait_ready(timeout=180)
        for r in range(a.repeats):
            for level in (int(c) for c in a.concurrency.split(",")):
                base = f"base-{tag}-c{level}-r{r}"
                bench(work, servers["baseline"], base, "baseline", level, a)
                bench(work, servers["untrained"], f"untrained-{tag}-c{level}-r{r}", "untrained", level, a,
                      "--baseline-run", base)
                s = bench(work, servers["trained"], f"trained-{tag}-c{level}-r{r}", "trained", level, a,
                          "--baseline-run", base, "--third-run", f"untrained-{tag}-c{level}-r{r}")
                tables.setdefault(level, []).append(comparison_from_dict(s["comparison"]))
    finally:
        for sim in servers.values():
            sim.kill()
    print(f"\n== simulated GPU step {tag} per verifier forward pass{' (CPU alone)' if step_ms == 0 else ''}; "
          f"median of {a.repeats} interleaved repeats ==")
    print(f"{'conc':>4}  {'baseline tok/s':>14} {'trained tok/s':>13} {'untrained tok/s':>15}  {'trained vs base':>15} "
          f"{'trained vs untrained':>20} {'untrained vs base':>17}  accept len trained / untrained")
    for level, cmps in sorted(tables.items()):
        rows = [{r.label: r for r in c.rows} for c in cmps]
        med = statistics.median
        b = med(x["baseline"].output_tps for x in rows)
        t = med(x["trained"].output_tps for x in rows)
        u = med(x["untrained"].output_tps for x in rows)
        tr = med(x["trained"].ratio for x in rows)
        tu = med(x["trained"].output_tps / x["untrained"].output_tps for x in rows)
        ur = med(x["untrained"].ratio for x in rows)
        lt = med(x["trained"].acceptance_length for x in rows)
        lu = med(x["untrained"].acceptance_length for x in rows)
        print(f"{level:>4}  {b:>14.1f} {t:>13.1f} {u:>15.1f}  {tr:>14.2f}x {tu:>19.2f}x {ur:>16.2f}x  "
              f"{lt:.2f} / {lu:.2f}")
    print("last repeat's bench table:")
    for level, cmps in sorted(tables.items()):
        print(format_table(cmps[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--gpu-step-ms", default="0,10", help="comma-separated; 0 = the CPU alone")
    a = p.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="e3-demo-speedup-") as tmp:
        work = Path(tmp)
        verifier = tinylm.ensure_model()
        rows = [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": "-"}]}
                for q in demo_questions(48)]
        (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        t0 = time.monotonic()
        untrained = dry_run(verifier, work / "untrained", env())
        trained, losses = stage_drafter(verifier, work / "trained", env())
        print(f"verifier {verifier}\ndrafters built in {time.monotonic() - t0:.1f} s (train stage loss "
              f"{' -> '.join(f'{x:.3f}' for x in losses)})")
        for step in a.gpu_step_ms.split(","):
            round_of(work, float(step), {"untrained": untrained, "trained": trained}, a)
    print(f"\ntotal {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
