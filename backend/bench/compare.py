"""Baseline against one or more drafters, per concurrency level: the speed-up and what bought it.

`compare(results)` is pure: the first result (or the one labelled `baseline`) is the reference; every
other result (a drafter, the same drafter at another K, a published one) gets, at each concurrency level
measured by both, the ratio of its output tokens per second to the baseline's, its acceptance (rate and
mean acceptance length), and `slower` when the ratio is below 1. `best(cmp, labels)` names the contender
with the highest mean speed-up over the levels (the bench pair's best K). `format_table` prints it;
`python -m backend.bench.compare --work-dir W RUN RUN [RUN...]` does both for finished bench runs and exits
3 when a drafter is slower (the bench stage's own exit code for it).

The comparison's dict form is flat rows (one per level and contender) so it travels in a finish event's
summary and reads back without deep nesting.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from backend.bench.results import BenchResult, BenchResultError
from backend.bench.scrape import MAX_POSITIONS
from backend.contract import exitcodes

EXIT_SLOWER = exitcodes.SLOWER  # the bench measured fine, and a drafter made generation slower
BASELINE = "baseline"
MAX_RESULTS = 12  # the baseline and up to 11 contenders (the bench pair: several K and a published drafter)
MAX_LEVELS = 16  # as many concurrency levels as a profile may ask for
MAX_ROWS = MAX_RESULTS * MAX_LEVELS
MAX_LABEL = 40


@dataclass(frozen=True)
class Row:
    concurrency: int
    label: str
    output_tps: float
    ratio: float | None  # output tokens/s against the baseline at this level; None for the baseline itself
    slower: bool
    median_tpot_ms: float | None
    median_ttft_ms: float | None
    acceptance_length: float | None
    acceptance_rate: float | None
    failed: int

    @property
    def is_baseline(self) -> bool:
        return self.ratio is None


@dataclass(frozen=True)
class Comparison:
    baseline: str
    labels: tuple[str, ...]  # baseline first
    rows: tuple[Row, ...]  # by concurrency, baseline first within a level
    missing: tuple[str, ...] = ()  # levels not measured by every contender

    @property
    def slower(self) -> bool:
        return any(r.slower for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "labels": list(self.labels), "slower": self.slower,
                "missing": list(self.missing), "rows": [asdict(r) for r in self.rows]}


class CompareError(ValueError):
    pass


def compare(results: Sequence[BenchResult], baseline: str | None = None) -> Comparison:
    """Compare labelled results level by level (see the module docstring)."""
    if not 2 <= len(results) <= MAX_RESULTS:
        raise CompareError(f"compare two to {MAX_RESULTS} results (a baseline and the drafters), got {len(results)}")
    labels = [r.label for r in results]
    if len(set(labels)) != len(labels):
        raise CompareError(f"each result needs its own label, got {labels}")
    want = baseline or (BASELINE if BASELINE in labels else labels[0])
    if want not in labels:
        raise CompareError(f"no result labelled {want!r} (labels: {', '.join(labels)})")
    base = next(r for r in results if r.label == want)
    others = [r for r in results if r.label != want]
    rows: list[Row] = []
    missing: list[str] = []
    levels = sorted({lv.concurrency for r in results for lv in r.levels})
    for c in levels:
        ref = base.level(c)
        mine = [(r.label, r.level(c)) for r in others]
        absent = [lbl for lbl, lv in [(base.label, ref), *mine] if lv is None]
        if absent:
            missing.append(f"concurrency {c}: not measured by {', '.join(absent)}")
            continue
        rows.append(_row(c, base.label, ref, None))
        for label, lv in mine:
            ratio = lv.output_throughput / ref.output_throughput if ref.output_throughput > 0 else math.inf
            rows.append(_row(c, label, lv, ratio))
    return Comparison(baseline=base.label, labels=(base.label, *[r.label for r in others]), rows=tuple(rows),
                      missing=tuple(missing))


def _row(c: int, label: str, lv: Any, ratio: float | None) -> Row:
    acc = lv.acceptance
    return Row(concurrency=c, label=label, output_tps=lv.output_throughput, ratio=ratio,
               slower=ratio is not None and ratio < 1.0, median_tpot_ms=lv.stat("tpot", "median"),
               median_ttft_ms=lv.stat("ttft", "median"), acceptance_length=acc.length if acc else None,
               acceptance_rate=acc.rate if acc else None, failed=lv.failed)


@dataclass(frozen=True)
class Best:
    """The contender with the highest mean speed-up (geometric, over the levels it was measured at)."""
    label: str
    speedup: float
    acceptance_length: float | None  # its mean over the levels that report one
    slower: bool  # slower than the baseline at some level


def best(cmp: Comparison, labels: Sequence[str]) -> Best | None:
    """Of `labels` (rows of `cmp`), the best by mean speed-up; ties go to the earlier label. None when
    none of them has a measured level."""
    found: Best | None = None
    for label in labels:
        rows = [r for r in cmp.rows if r.label == label and r.ratio is not None]
        ratios = [r.ratio for r in rows if r.ratio is not None and r.ratio > 0 and math.isfinite(r.ratio)]
        if not ratios:
            continue
        mean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lengths = [r.acceptance_length for r in rows if r.acceptance_length is not None]
        here = Best(label, mean, sum(lengths) / len(lengths) if lengths else None, any(r.slower for r in rows))
        if found is None or here.speedup > found.speedup:
            found = here
    return found


def comparison_from_dict(data: Any) -> Comparison:
    """A comparison read back from JSON that may come from anywhere: types checked, sizes bounded."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise CompareError("a comparison must be an object with a rows list")
    rows = []
    for raw in data["rows"][:MAX_ROWS]:
        if not isinstance(raw, dict):
            raise CompareError("a comparison row must be an object")
        rows.append(Row(concurrency=_int(raw.get("concurrency")), label=_label(raw.get("label")),
                        output_tps=_opt(raw.get("output_tps")) or 0.0, ratio=_opt(raw.get("ratio")),
                        slower=raw.get("slower") is True, median_tpot_ms=_opt(raw.get("median_tpot_ms")),
                        median_ttft_ms=_opt(raw.get("median_ttft_ms")),
                        acceptance_length=_opt(raw.get("acceptance_length")),
                        acceptance_rate=_opt(raw.get("acceptance_rate")), failed=_int(raw.get("failed"))))
    labels = data.get("labels") if isinstance(data.get("labels"), list) else []
    missing = data.get("missing") if isinstance(data.get("missing"), list) else []
    return Comparison(baseline=_label(data.get("baseline")), labels=tuple(_label(x) for x in labels[:MAX_RESULTS]),
                      rows=tuple(rows), missing=tuple(str(m)[:200] for m in missing[:MAX_ROWS]))


def _opt(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CompareError(f"expected a non-negative integer, got {value!r}")
    return value


def _label(value: Any) -> str:
    if not isinstance(value, str):
        raise CompareError(f"expected a label string, got {value!r}")
    return value[:MAX_LABEL]


# ---- the reference line ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    """The field's figure for this model, from the profile (`[bench] reference_acceptance` at `reference_k`):
    an acceptance length means something only at the K it was measured at, so it carries its K."""
    length: float
    k: int

    def line(self, label: str, length: float | None, k: int | None) -> str:
        """`reference 2.88 (K=3); drafter 1.84 (K=3): -1.04, 64% of the reference`."""
        head = f"reference {self.length:.2f} (K={self.k})"
        if length is None:
            return f"{head}; {label[:MAX_LABEL]}: no acceptance measured"
        at = f" (K={k})" if k is not None else ""
        other_k = (f"; measured at another K than the reference's, so the two do not compare"
                   if k is not None and k != self.k else "")
        return (f"{head}; {label[:MAX_LABEL]} {length:.2f}{at}: {length - self.length:+.2f}, "
                f"{length / self.length:.0%} of the reference{other_k}")


def check_reference(length: Any, k: Any) -> str | None:
    """Why (length, k) is not a reference acceptance: None when it is one. A length is 1 + accepted tokens
    per draft, so it lies in [1, K + 1]."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_POSITIONS:
        return (f"reference_k: expected the K (draft tokens per step) the reference was measured at, "
                f"1..{MAX_POSITIONS}, got {k!r}")
    if isinstance(length, bool) or not isinstance(length, (int, float)) or not math.isfinite(length):
        return f"reference_acceptance: expected a finite number, got {length!r}"
    if not 1 <= length <= k + 1:
        return (f"reference_acceptance: expected an acceptance length from 1 to reference_k + 1 = {k + 1} "
                f"(1 + accepted tokens per draft at K={k}), got {length!r}")
    return None


def reference_from_dict(data: Any) -> Reference | None:
    """A reference read back from a summary (host data): None when absent or not one."""
    if not isinstance(data, dict) or check_reference(data.get("length"), data.get("k")) is not None:
        return None
    return Reference(float(data["length"]), int(data["k"]))


def mean_length(cmp: Comparison, label: str) -> float | None:
    """A contender's mean acceptance length over the levels that report one."""
    lengths = [r.acceptance_length for r in cmp.rows if r.label == label and r.acceptance_length is not None]
    return sum(lengths) / len(lengths) if lengths else None


# ---- the table ---------------------------------------------------------------------------------------
def _f(value: float | None, fmt: str, none: str = "-") -> str:
    return none if value is None else format(value, fmt)


def format_table(cmp: Comparison) -> str:
    """Plain text, one line per level and contender; a slower drafter is marked SLOWER."""
    head = f"{'conc':>4}  {'label':<14} {'out tok/s':>10} {'vs ' + cmp.baseline:>14} {'TPOT p50':>9} " \
           f"{'TTFT p50':>9} {'accept len':>10} {'accept':>7} {'failed':>6}"
    out = [head, "-" * len(head)]
    for r in cmp.rows:
        ratio = "" if r.ratio is None else (f"{r.ratio:.2f}x" + (" SLOWER" if r.slower else ""))
        out.append(f"{r.concurrency:>4}  {r.label[:14]:<14} {r.output_tps:>10.1f} {ratio:>14} "
                   f"{_f(r.median_tpot_ms, '.1f'):>9} {_f(r.median_ttft_ms, '.1f'):>9} "
                   f"{_f(r.acceptance_length, '.2f'):>10} {_f(r.acceptance_rate, '.0%'):>7} {r.failed:>6}")
    out.extend(f"note: {m}" for m in cmp.missing)
    if cmp.slower:
        out.append("a drafter is SLOWER than the baseline at the levels marked")
    return "\n".join(out)


# ---- finished runs -----------------------------------------------------------------------------------
def load_run_result(work_dir: str, run_id: str) -> BenchResult:
    """The result of a completed bench run (via the pipeline's input rule: completed runs only)."""
    from backend.contract.lookup import InputError, completed_run

    run = completed_run(work_dir, run_id, "bench")
    path = run.outputs.get("results") or os.path.join(run.path, "bench.json")
    try:
        with open(path, encoding="utf-8") as f:
            return BenchResult.from_dict(json.load(f))
    except OSError as exc:
        raise InputError(f"bench run {run_id}: cannot read {path}: {exc.strerror}") from None
    except (ValueError, BenchResultError) as exc:
        raise InputError(f"bench run {run_id}: {path}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.bench.compare",
                                description="Compare finished bench runs: a baseline and the drafters.")
    p.add_argument("--work-dir", required=True)
    p.add_argument("--baseline", help="the label of the reference (default: 'baseline', else the first run)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")
    p.add_argument("runs", nargs="+", metavar="RUN")
    ns = p.parse_args(argv)
    from backend.contract.runs import RunDirError

    try:
        cmp = compare([load_run_result(ns.work_dir, r) for r in ns.runs], ns.baseline)
    except (RunDirError, CompareError) as exc:
        print(f"bench compare: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(cmp.to_dict(), indent=2) if ns.json else format_table(cmp))
    return EXIT_SLOWER if cmp.slower else 0


if __name__ == "__main__":
    sys.exit(main())
