"""Load progress and ETA while vLLM loads weights, from whichever signal is best right now.

journald holds a tqdm bar back until it finishes, so for a systemd unit the shard counter arrives only
at the end. Three signals, best first:
1. "shards": a live tqdm bar (log file or tmux pipe), with tqdm's own remaining time;
2. "gpu_memory": memory used on the GPUs against the weight memory the previous load reported
   (`Model loading took X GiB`) or the profile's expected_weights_gib;
3. "previous_load": time elapsed against the previous successful load of the same model on this host.
Load records are remembered in `<work dir>/state/loads.jsonl` on the host.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Iterable

from backend.contract.numbers import finite
from console.snapshot import GpuInfo, RunInfo

LOADS_FILE = "state/loads.jsonl"


@dataclass(frozen=True)
class LoadRecord:
    model: str
    started: float
    ready: float
    weights_gib: float | None = None  # per GPU, as vLLM's "Model loading took X GiB" says
    weights_s: float | None = None
    baseline_mib: float | None = None  # GPU memory in use before the load began
    settings: str | None = None  # eta_ready.settings_key: loads of other arguments are not compared
    phases: dict[str, float] | None = None  # seconds in each load step (eta_ready.step_durations)

    @property
    def duration_s(self) -> float:
        return self.ready - self.started

    def to_line(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


class LoadHistory(list[LoadRecord]):
    """The host's load records, good ones only; `skipped` counts the lines that were not one (a torn
    write, a foreign writer's line, a wrong-typed or non-finite number): skipped, never fatal."""
    skipped: int = 0


# the seconds a load step or a whole load may take: beyond a week it is not a measurement
SECONDS_MAX = 7 * 86400.0


def parse_load_history(text: str) -> LoadHistory:
    """Every number goes through backend/contract/numbers.py: `"weights_gib": "70"` or `1e999` makes that line
    unreadable (counted in `skipped`), never a TypeError in the ETA or "about inf h" of downtime."""
    records = LoadHistory()
    for line in text.splitlines():
        if not line.strip():
            continue
        rec = _record(line)
        if rec is None:
            records.skipped += 1  # a torn or foreign line must not hide the good ones
        elif rec.ready > rec.started:  # a load seen only once ready (attached late) measured nothing
            records.append(rec)
    return records


def _record(line: str) -> LoadRecord | None:
    try:
        d = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(d, dict) or not isinstance(d.get("model"), str):
        return None
    started, ready = finite(d.get("started")), finite(d.get("ready"))
    if started is None or ready is None or not 0 <= ready - started <= SECONDS_MAX:
        return None
    numbers: dict[str, float | None] = {}
    for key in ("weights_gib", "weights_s", "baseline_mib"):
        value, number = d.get(key), finite(d.get(key))
        if value is not None and (number is None or number < 0):
            return None  # given but not a number: the record is not what our writer wrote
        numbers[key] = number
    settings = d.get("settings")
    if settings is not None and not isinstance(settings, str):
        return None
    return LoadRecord(model=d["model"], started=started, ready=ready, settings=settings,
                      phases=_phases(d.get("phases")), **numbers)


def _phases(value: object) -> dict[str, float] | None:
    """A record's step durations; anything but names with finite seconds up to SECONDS_MAX is dropped."""
    if not isinstance(value, dict):
        return None
    out: dict[str, float] = {}
    for k, v in value.items():
        seconds = finite(v)
        if isinstance(k, str) and seconds is not None and 0 <= seconds <= SECONDS_MAX:
            out[k] = seconds
    return out or None


def last_load(records: Iterable[LoadRecord], model: str) -> LoadRecord | None:
    best = None
    for r in records:
        if r.model == model and (best is None or r.ready > best.ready):
            best = r
    return best


@dataclass(frozen=True)
class LoadEstimate:
    fraction: float | None
    eta_s: float | None
    source: str | None


def _mean_used_mib(gpus: list[GpuInfo]) -> float | None:
    used = [g.memory_used_mib for g in gpus if g.memory_used_mib is not None]
    return sum(used) / len(used) if used else None


def estimate_load(*, elapsed_s: float | None, shards: tuple[int, int] | None, shard_eta_s: float | None,
                  shards_live: bool, gpus: list[GpuInfo], expected_weights_gib: float | None,
                  baseline_mib: float | None, previous: LoadRecord | None) -> LoadEstimate:
    """Pure: best available fraction and ETA during weight loading."""
    if shards_live and shards and shards[1] > 0:
        frac = shards[0] / shards[1]
        eta = shard_eta_s
        if eta is None and elapsed_s and frac > 0:
            eta = elapsed_s * (1 - frac) / frac
        return LoadEstimate(frac, eta, "shards")

    weights_gib = (previous.weights_gib if previous and previous.weights_gib else None) or expected_weights_gib
    used = _mean_used_mib(gpus)
    if weights_gib and used is not None:
        base = baseline_mib if baseline_mib is not None else 0.0
        frac = max(0.0, min(1.0, (used - base) / (weights_gib * 1024)))
        eta = None
        # memory tracks bytes loaded, so elapsed * remaining/done is a fair ETA once a little is in
        if elapsed_s and frac >= 0.02:
            eta = elapsed_s * (1 - frac) / frac
        elif previous and previous.weights_s and elapsed_s is not None:
            eta = max(0.0, previous.weights_s - elapsed_s)
        return LoadEstimate(frac, eta, "gpu_memory")

    if previous and elapsed_s is not None:
        # the weights step as the previous load took it (elapsed counts from this load's weights start)
        span = (previous.phases or {}).get("loading_weights") or previous.weights_s or previous.duration_s
        share = max(0.0, min(0.99, elapsed_s / span)) if span > 0 else None
        return LoadEstimate(share, max(0.0, span - elapsed_s), "previous_load")
    return LoadEstimate(None, None, None)


def _minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def downtime_text(loads: int, records: Iterable[LoadRecord], model: str, load_timeout_s: float) -> str:
    """What an action that stops the baseline costs, said before it is spent: how many server loads and
    how long each takes, from the last measured load of `model` on this host (state/loads.jsonl)."""
    if loads <= 0:
        return "no server load"
    what = f"{loads} server load{'s' if loads != 1 else ''}"
    last = last_load(records, model)
    if last is None:
        return (f"{what}; no load of {model} measured on this host yet ([server] load_timeout_s allows "
                f"{_minutes(load_timeout_s)} each)")
    each = last.duration_s
    return (f"{what} of about {_minutes(each)} each (the last load of {model} here took {_minutes(each)}): "
            f"about {_minutes(loads * each)} of loading in all")


def run_seconds(run: RunInfo) -> float | None:
    """How long a completed run took: its last (re)start to its finish event (a resumed run: the last
    leg only, so an estimate errs short); None when that is not known."""
    ts = (run.last_event or {}).get("ts")
    if run.state != "done" or run.started is None or not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return None
    return float(ts) - run.started if ts >= run.started else None


def span_text(stages: list[str], runs: Iterable[RunInfo]) -> str:
    """How long `stages` take one after the other, from the last completed run of each on this host (the
    console's view of the runs' events), said stage by stage; "unknown: first run" for a stage never
    completed here."""
    latest: dict[str, tuple[float, float]] = {}
    for run in runs:
        took = run_seconds(run)
        if took is not None and run.stage in stages and (run.stage not in latest or
                                                          (run.started or 0) > latest[run.stage][0]):
            latest[run.stage] = (run.started or 0, took)
    parts = [f"{s} about {_minutes(latest[s][1])}" if s in latest else f"{s} unknown: first run" for s in stages]
    known = sum(latest[s][1] for s in stages if s in latest)
    if len(latest) == len(set(stages)):
        total = f"about {_minutes(known)}"
    elif latest:
        total = f"more than {_minutes(known)}"
    else:
        return "unknown: first run (no completed " + " or ".join(stages) + " run on this host yet)"
    return f"{total} by the last completed runs on this host ({'; '.join(parts)})"
