"""The pipeline and the bench on vLLM's own engine, through the operator's commands only (the engine test
tier, tests/test_engine_pipeline.py, and benchmarks/bench_real_engine.py share it).

One demo host with vLLM's CPU build as its baseline (`demo-host start --engine vllm` + `wait-ready`), then:
`run pipeline --limit N --run-id real` (generate -> prepare -> extract with the real extract_hidden_states
server and the CPU connector -> train -> verify), `run bench --run-id bench-trained` of the verified drafter
(its drafter server is vLLM's EAGLE-3 loading our checkpoint), an untrained drafter (speculators'
`train --dry-run`, specdec_support.dry_run) verified with `run verify --checkpoint` and benched the same way;
the trained checkpoint is verified again after its bench (`run verify --run-id verify-after-bench`), so its
report carries vLLM's count beside the prediction.
Each phase's wall time is kept. The caller stops the demo (`stop`) whatever happened.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.kit.acceptance_gap import AcceptanceGap, acceptance_gap
from backend.bench.results import BenchResult

ROOT = Path(__file__).resolve().parent.parent
PIPELINE, TRAINED, UNTRAINED_VERIFY, UNTRAINED = "real", "bench-trained", "verify-untrained", "bench-untrained"
REVERIFY = "verify-after-bench"  # the trained checkpoint verified again: its report carries vLLM's count


class PhaseFailed(AssertionError):
    """A command exited with an unexpected status; the message holds its output's tails."""


def cli(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def ok(res: subprocess.CompletedProcess[str], *allowed: int) -> str:
    if res.returncode not in (0, *allowed):
        raise PhaseFailed(f"{' '.join(res.args[3:6])}... exit {res.returncode}\n{res.stdout[-4000:]}\n"
                          f"{res.stderr[-4000:]}")
    return res.stdout


@dataclass
class RealRuns:
    work: Path
    profile: Path | None = None
    times: dict[str, float] = field(default_factory=dict)
    output: dict[str, str] = field(default_factory=dict)  # each phase's stdout (the console's own tables)
    say: Callable[[str, float], None] | None = None  # told each phase's name and wall time as it ends

    def timed(self, name: str, seconds: float) -> None:
        self.times[name] = self.times.get(name, 0.0) + seconds
        if self.say is not None:
            self.say(name, self.times[name])

    def summary(self, run_id: str) -> dict[str, Any]:
        return json.loads((self.work / "runs" / run_id / "summary.json").read_text())

    def gap(self, verify_run: str, bench_run: str) -> AcceptanceGap | None:
        """verify's prediction next to vLLM's count for the drafter bench of `bench_run`."""
        path = self.work / "runs" / f"{bench_run}-drafter" / "bench.json"
        return acceptance_gap(self.summary(verify_run), BenchResult.from_dict(json.loads(path.read_text())).levels)


def _phase(runs: RealRuns, name: str, *args: str, allowed: tuple[int, ...] = ()) -> str:
    t = time.monotonic()
    out = ok(cli(*args), *allowed)
    runs.output[name] = out
    runs.timed(name, time.monotonic() - t)
    return out


def run_all(runs: RealRuns, limit: int = 64, *, epochs: int | None = None,
            levels: tuple[int, ...] | None = None, bench_untrained: bool = True) -> RealRuns:
    """Every phase in order; raises PhaseFailed at the first that fails (what ran is in `runs`).
    `epochs`, `levels`: the profile's [train] epochs and [bench] concurrency instead of the demo's, set in
    the profile file as an operator would; `bench_untrained`: False verifies the untrained drafter without
    benching it (the test tier's shorter run; the benchmark keeps all of it)."""
    from console.profile import load_profile, write_profile
    from harness.specdec_support import dry_run

    t = time.monotonic()
    out = ok(cli("demo-host", "start", "--dir", str(runs.work), "--engine", "vllm"))
    runs.profile = Path(out.strip().splitlines()[-1])
    p = str(runs.profile)
    if epochs is not None or levels is not None:
        edited = load_profile(runs.profile)
        if epochs is not None:
            edited.train.epochs = epochs
        if levels is not None:
            edited.bench.concurrency = list(levels)
        write_profile(edited, runs.profile, overwrite=True)
    ok(cli("wait-ready", "--profile", p, "--timeout", "600", "--interval", "3"))
    runs.timed("engine start", time.monotonic() - t)
    _phase(runs, "pipeline", "run", "pipeline", "--profile", p, "--yes", "--wait", "--limit", str(limit),
           "--interval", "10", "--run-id", PIPELINE)
    # exit 3: the drafter is slower than the baseline, as it is on a CPU (its step costs a verifier step)
    _phase(runs, "bench trained", "run", "bench", "--profile", p, "--yes", "--wait", "--interval", "10",
           "--run-id", TRAINED, allowed=(3,))
    _phase(runs, "verify after bench", "run", "verify", "--profile", p, "--yes", "--wait", "--interval", "5",
           "--input", f"{PIPELINE}-train", "--run-id", REVERIFY)
    t = time.monotonic()
    prof = load_profile(runs.profile)
    verifier = Path(prof.drafter.verifier or prof.server.model_path)
    untrained = dry_run(verifier, runs.work / "untrained", {**os.environ, "HF_HUB_OFFLINE": "1"})
    runs.timed("untrained dry-run", time.monotonic() - t)
    _phase(runs, "verify untrained", "run", "verify", "--profile", p, "--yes", "--wait", "--interval", "5",
           "--checkpoint", str(untrained), "--input", f"{PIPELINE}-train", "--run-id", UNTRAINED_VERIFY)
    if not bench_untrained:
        return runs
    _phase(runs, "bench untrained", "run", "bench", "--profile", p, "--yes", "--wait", "--interval", "10",
           "--input", UNTRAINED_VERIFY, "--run-id", UNTRAINED, allowed=(3,))
    return runs


def stop(work: Path) -> None:
    cli("demo-host", "stop", "--dir", str(work), timeout=180)
