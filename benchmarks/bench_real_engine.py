"""The pipeline and the bench on vLLM's own engine, timed phase by phase (the GPU benchmark's CPU twin).

    python benchmarks/bench_real_engine.py --device cpu [--limit 64] [--dir DIR]

On this machine: a demo host with vLLM's CPU build as its baseline (`demo-host start --engine vllm`), then
through the operator's commands only (harness/real_engine.py): `run pipeline --limit N` (generate, prepare,
extract with the real extract_hidden_states server and the CPU connector, train, verify), `run bench` of the
trained drafter (vLLM's EAGLE-3 serving our checkpoint), and an untrained drafter (speculators' dry run)
verified and benched the same way. Prints each phase's wall time and the acceptance figures: the verify
stage's prediction next to what vLLM counted, trained and untrained. Exit 0 when every phase ran; the demo
is stopped whatever happened. `--device cuda` is bench_gpu_speedup.py's business, not this script's.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import real_engine  # noqa: E402
from harness.real_engine import PIPELINE, TRAINED, UNTRAINED, UNTRAINED_VERIFY  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_real_engine.py", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu",), required=True, help="cpu: vLLM's CPU build (the only one here)")
    p.add_argument("--limit", type=int, default=64, help="rows the pipeline generates (default 64)")
    p.add_argument("--dir", type=Path, help="the demo's directory (default: a new temporary one)")
    ns = p.parse_args(argv)
    work = ns.dir or Path(tempfile.mkdtemp(prefix="bench-real-engine-"))
    runs = real_engine.RealRuns(work)
    try:
        real_engine.run_all(runs, limit=ns.limit)
    except real_engine.PhaseFailed as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        real_engine.stop(work)
        for name, seconds in runs.times.items():
            print(f"{name:<20} {seconds:7.1f} s")
    print(runs.output.get("bench trained", ""))
    for label, verify, bench in (("trained", f"{PIPELINE}-verify", TRAINED), ("untrained", UNTRAINED_VERIFY, UNTRAINED)):
        gap = runs.gap(verify, bench)
        if gap is None:
            print(f"{label}: no acceptance figures")
            continue
        print(f"{label}: " + "\n".join(gap.lines(verify)))
    print(f"runs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
