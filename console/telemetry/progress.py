"""Typed progress views of a stage run: what the panes and `run --wait` read instead of event dicts.

A run's latest event (RunInfo.last_event: its progress, or its finish with the summary merged in) is
host text of any shape. Each view reads it once, here, with tolerant readers: a value of the wrong type,
a bool, NaN or an infinity reads as "not given", never as an exception, so one odd line costs one
figure, not a pane. The stage table (console/control/stages.py) says which view each stage gets.
Pure; no Textual.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from backend.contract.numbers import count, finite
from backend.verify.report import K_MAX, draft_positions, read_k_table
from console.parsers.text import clean, clean_block
from console.snapshot import RunInfo

FINISHED = ("done", "failed", "stopped", "stale")


def amount(value: Any) -> int | None:
    """A non-negative count from the host, or None when it gives none (backend/contract/numbers.py reads it)."""
    return count(value, None)


def text(value: Any, limit: int = 2000) -> str | None:
    return clean_block(value[:limit]) if isinstance(value, str) and value else None


@dataclass(frozen=True)
class StageProgress:
    """Counts in the stage's own unit (records, rows, steps, bytes, stages), and how it ended."""
    stage: str
    run_id: str
    state: str
    unit: str = "items"
    done: int = 0
    total: int = 0
    failed: int = 0
    rate: float | None = None  # units per second
    eta_s: float | None = None
    error: str | None = None  # a run that did not complete: its reason, cleaned
    outputs: tuple[tuple[str, str], ...] = ()  # what it leaves for the next stage, cleaned
    slower: bool = False  # a bench: the drafter is slower than the baseline somewhere

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def line(self) -> str:
        """The one line `run --wait` prints per change."""
        line = f"{self.state}: {self.done}/{self.total} {self.unit}, {self.failed} failed"
        return line + (f", {self.rate:.1f}/s" if self.rate else "")


def _event(run: RunInfo) -> Mapping[str, Any]:
    return run.last_event if isinstance(run.last_event, dict) else {}


def _base(run: RunInfo, unit: str) -> dict[str, Any]:
    ev = _event(run)
    outputs = ev.get("outputs") if run.state == "done" else None
    return dict(stage=run.stage, run_id=run.run_id, state=run.state, unit=unit, done=amount(run.done) or 0,
                total=amount(run.total) or 0, failed=amount(run.failed) or 0, rate=finite(run.rate),
                eta_s=finite(run.eta_s), error=text(ev.get("error")) if run.state != "done" else None,
                outputs=tuple((clean(str(k))[:80], clean(str(v))[:400]) for k, v in list(outputs.items())[:20])
                if isinstance(outputs, dict) else ())


def counted(unit: str):
    """The view of a stage that counts `unit`s and says nothing more."""
    def view(run: RunInfo, runs: Sequence[RunInfo] = ()) -> StageProgress:
        return StageProgress(**_base(run, unit))
    return view


@dataclass(frozen=True)
class GenerationProgress(StageProgress):
    skipped: int = 0
    reduced: int = 0
    failed_permanent: int = 0
    skipped_by_reason: tuple[tuple[str, int], ...] = ()
    failed_by_reason: tuple[tuple[str, int], ...] = ()
    reasoning_captured: int | None = None
    truncated: int | None = None
    completion_tokens: int | None = None
    tokens_per_s: float | None = None  # when the stage reports it; else the pane derives it
    bytes_written: int | None = None
    free_disk: int | None = None
    ts: float | None = None
    by_source: tuple[tuple[str, int, int], ...] = ()  # --sources runs: (name, done, selected)


def reason_counts(value: Any) -> tuple[tuple[str, int], ...]:
    """A `*_by_reason` map, biggest first; the reasons are host text, cut and cleaned."""
    if not isinstance(value, dict):
        return ()
    items = [(clean(str(k))[:40], n) for k, v in list(value.items())[:200] if (n := amount(v))]
    return tuple(sorted(items, key=lambda kv: (-kv[1], kv[0])))


_FREE_DISK_KEYS = ("free_disk", "disk_free_bytes", "free_disk_bytes")  # generate emits free_disk


def generation_view(run: RunInfo, runs: Sequence[RunInfo] = ()) -> GenerationProgress:
    ev = _event(run)
    base = _base(run, "records")
    # the event's own counters win over the run book's (they are the stage's latest word)
    for key in ("done", "total", "failed"):
        if (v := amount(ev.get(key))) is not None:
            base[key] = v
    if base["rate"] is None:
        base["rate"] = finite(ev.get("rate"))
    free = next((amount(ev[k]) for k in _FREE_DISK_KEYS if k in ev), None)
    return GenerationProgress(
        **base, skipped=amount(ev.get("skipped")) or 0, reduced=amount(ev.get("reduced")) or 0,
        failed_permanent=amount(ev.get("failed_permanent")) or 0,
        skipped_by_reason=reason_counts(ev.get("skipped_by_reason")), failed_by_reason=reason_counts(ev.get("failed_by_reason")),
        reasoning_captured=amount(ev.get("reasoning_captured")), truncated=amount(ev.get("truncated")),
        completion_tokens=amount(ev.get("completion_tokens")), tokens_per_s=finite(ev.get("tokens_per_s")),
        bytes_written=amount(ev.get("bytes_written")), free_disk=free, ts=finite(ev.get("ts")),
        by_source=source_counts(ev.get("by_source")))


def source_counts(value: Any, limit: int = 64) -> tuple[tuple[str, int, int], ...]:
    """A generation's `by_source` ({done: {name: n}, selected: {name: n}}): names cut and cleaned."""
    if not isinstance(value, dict) or not isinstance(value.get("selected"), dict):
        return ()
    done = value.get("done") if isinstance(value.get("done"), dict) else {}
    return tuple((clean(str(name))[:32], amount(done.get(name)) or 0, n)
                 for name, selected in list(value["selected"].items())[:limit] if (n := amount(selected)) is not None)


@dataclass(frozen=True)
class ByteProgress(StageProgress):
    phase: str | None = None  # fetch-drafter: download, then convert

    def line(self) -> str:
        line = f"{self.state}: {self.done / 2**20:.1f}/{self.total / 2**20:.1f} MiB"
        return line + (f", {self.rate / 2**20:.1f} MiB/s" if self.rate else "")


def bytes_view(run: RunInfo, runs: Sequence[RunInfo] = ()) -> ByteProgress:
    phase = _event(run).get("phase")
    return ByteProgress(**_base(run, "bytes"), phase=clean(phase)[:40] if isinstance(phase, str) else None)


@dataclass(frozen=True)
class StepProgress(StageProgress):
    """A program that moves through named steps (the bench pair: bench, swap, bench, compare, swap back)."""
    current: str | None = None

    def line(self) -> str:
        if self.current is None:
            return super().line()
        return f"{self.state}: {self.done}/{self.total} steps, {self.current}"


def pair_view(run: RunInfo, runs: Sequence[RunInfo] = ()) -> StepProgress:
    ev = _event(run)
    current = ev.get("current")
    return StepProgress(**_base(run, "steps"), current=clean(current)[:120] if isinstance(current, str) else None,
                        slower=run.state == "done" and ev.get("slower") is True)


@dataclass(frozen=True)
class ChainProgress(StageProgress):
    """A pipeline run: its stages done, and the stage run going now with that run's own progress."""
    stage_runs: tuple[tuple[str, str], ...] = ()  # (stage, run id) of each stage it ran
    current: StageProgress | None = None

    def line(self) -> str:
        line = f"{self.state}: {self.done}/{self.total} stages"
        c = self.current
        if self.state == "running" and c is not None:
            line += f", now {c.stage} {c.run_id}: {c.done}/{c.total}"
        return line

    def stage_run(self, stage: str) -> str | None:
        return next((run_id for s, run_id in self.stage_runs if s == stage), None)


def chain_view(run: RunInfo, runs: Sequence[RunInfo] = ()) -> ChainProgress:
    ev = _event(run)
    stage_runs = ev.get("runs")
    pairs = tuple((clean(str(s))[:40], clean(str(r))[:200]) for s, r in list(stage_runs.items())[:20]) \
        if isinstance(stage_runs, dict) else ()
    current_id = ev.get("current_run")
    current = next((r for r in runs if isinstance(current_id, str) and r.run_id == current_id), None)
    return ChainProgress(**_base(run, "stages"), stage_runs=pairs,
                         current=StageProgress(**_base(current, "items")) if current is not None else None)


@dataclass(frozen=True)
class Acceptance:
    per_position: tuple[float | None, ...] = ()
    mean_accepted: float | None = None
    mean_acceptance_length: float | None = None
    samples: int | None = None


@dataclass(frozen=True)
class VerifyProgress(StageProgress):
    """verify's report once it finished: its checks and the offline acceptance of the trained and the
    untrained draft."""
    checks: tuple[tuple[str, bool], ...] = ()  # (name, ok)
    k: int = 0
    trained: Acceptance | None = None
    untrained: Acceptance | None = None
    report: Mapping[str, Any] | None = field(default=None, compare=False)  # for the stage's own table
    k_table: Any = field(default=None, compare=False)  # backend/verify/k_table.KTable, read back tolerantly

    @property
    def failed_checks(self) -> tuple[str, ...]:
        return tuple(name for name, ok in self.checks if not ok)


MAX_K = K_MAX  # draft positions shown (the verify report's own cap): a report claiming more is cut


def _acceptance(value: Any, k: int) -> Acceptance | None:
    if not isinstance(value, dict):
        return None
    per = value.get("per_position")
    return Acceptance(per_position=tuple(finite(v) for v in per[:k]) if isinstance(per, list) else (),
                      mean_accepted=finite(value.get("mean_accepted")),
                      mean_acceptance_length=finite(value.get("mean_acceptance_length")),
                      samples=amount(value.get("samples")))


def verify_view(run: RunInfo, runs: Sequence[RunInfo] = ()) -> VerifyProgress:
    base = _base(run, "samples")
    ev = _event(run)
    if run.state not in FINISHED or not isinstance(ev.get("checks"), list):
        return VerifyProgress(**base)
    checks = tuple((clean(str(c.get("name")))[:80], c.get("ok") is True)
                   for c in ev["checks"][:100] if isinstance(c, dict))
    acc = ev.get("acceptance") if isinstance(ev.get("acceptance"), dict) else {}
    k = draft_positions(acc)
    return VerifyProgress(**base, checks=checks, k=k, trained=_acceptance(acc.get("trained"), k),
                          untrained=_acceptance(acc.get("untrained"), k), report=ev,
                          k_table=read_k_table(ev.get("k_table")))


@dataclass(frozen=True)
class TrainPoint:
    """One training step as the pane plots it."""
    step: int
    epoch: float | None = None
    loss: float | None = None
    val_loss: float | None = None
    lr: float | None = None
    acc: tuple[float, ...] = ()
    checkpoint: str | None = None


def train_point(event: Mapping[str, Any]) -> TrainPoint | None:
    """A train progress event as a point; None when it has no step (a start event). A value of the wrong
    type reads as not given."""
    step = amount(event.get("step"))
    if step is None:
        return None
    acc_list = event.get("acc_k", event.get("acc"))
    if isinstance(acc_list, list):
        acc = tuple(finite(a) or 0.0 for a in acc_list[:MAX_K])
    else:  # acc_0, acc_1, ... as separate keys
        found = sorted((int(k[4:]), k) for k in event if isinstance(k, str) and k.startswith("acc_")
                       and k[4:].isdigit() and len(k) < 8)
        acc = tuple(finite(event[k]) or 0.0 for _, k in found[:MAX_K])
    ckpt = event.get("checkpoint")
    return TrainPoint(step=step, epoch=finite(event.get("epoch")), loss=finite(event.get("loss")),
                      val_loss=finite(event.get("val_loss")), lr=finite(event.get("lr")), acc=acc,
                      checkpoint=clean(ckpt)[:400] if isinstance(ckpt, str) and ckpt else None)


@dataclass(frozen=True)
class TrainProgress(StageProgress):
    """A training run: its curves as the console accumulated them (RunInfo.series, from every event;
    the stage counts epochs and steps from 0), or, without them, the latest event's point."""
    point: TrainPoint | None = None
    loss: tuple[tuple[int, float], ...] = ()  # (step, train loss)
    val: tuple[tuple[int, float, float], ...] = ()  # (step, epoch (or step without one), val loss)
    last_checkpoint: str | None = None
    best: tuple[float, str] | None = None  # (val loss, checkpoint)
    epochs: int | None = None
    steps_total: int | None = None
    val_acc: tuple[float | None, ...] = ()
    resumed_from: int | None = None
    from_series: bool = False
    # held-out acceptance per saved epoch (backend/train/selection.py): (epoch, mean acceptance length)
    acceptance: tuple[tuple[int, float], ...] = ()
    chosen_epoch: int | None = None
    acceptance_patience: int | None = None
    stale_epochs: int | None = None

    def line(self) -> str:
        if self.point is None:
            return super().line()
        shown = self.point.step + 1 if self.from_series else self.point.step
        line = f"{self.state}: step {shown}" + (f"/{self.steps_total}" if self.steps_total else "")
        return line + (f", loss {self.point.loss:.4f}" if self.point.loss is not None else "")


def train_view(run: RunInfo, runs: Sequence[RunInfo] = ()) -> TrainProgress:
    base = _base(run, "steps")
    series = run.series
    if not isinstance(series, dict):
        return TrainProgress(**base, point=train_point(_event(run)))
    loss = tuple((s, v) for item in (series.get("loss") or [])[:100_000] if isinstance(item, list) and len(item) == 2
                 and (s := amount(item[0])) is not None and (v := finite(item[1])) is not None)
    val = []
    for item in (series.get("val") or [])[:10_000]:
        if isinstance(item, list) and len(item) == 3 and (s := amount(item[0])) is not None \
                and (v := finite(item[2])) is not None:
            epoch = finite(item[1])
            val.append((s, epoch if epoch is not None else float(s), v))
    last = series.get("last_checkpoint")
    last_path = last.get("path") if isinstance(last, dict) else None
    best = series.get("best")
    best_pair = None
    if isinstance(best, dict) and isinstance(best.get("path"), str) and finite(best.get("val_loss")) is not None:
        best_pair = (finite(best["val_loss"]), clean(best["path"])[:400])
    acc = series.get("acc_k")
    step = amount(series.get("step"))
    point = TrainPoint(step=step if step is not None else (loss[-1][0] if loss else 0),
                       epoch=finite(series.get("epoch")), loss=loss[-1][1] if loss else None,
                       val_loss=max(val)[2] if val else None, lr=finite(series.get("lr")),
                       acc=tuple(finite(a) or 0.0 for a in acc[:MAX_K]) if isinstance(acc, list) else (),
                       checkpoint=clean(last_path)[:400] if isinstance(last_path, str) else None)
    val_acc = series.get("val_acc_k")
    if base["rate"] is None:
        base["rate"] = finite(series.get("rate"))
    if base["eta_s"] is None:
        base["eta_s"] = finite(series.get("eta_s"))
    return TrainProgress(**base, point=point, loss=loss, val=tuple(val), last_checkpoint=point.checkpoint,
                         best=best_pair, epochs=amount(series.get("epochs")), steps_total=amount(series.get("total")),
                         val_acc=tuple(finite(a) for a in val_acc[:MAX_K]) if isinstance(val_acc, list) else (),
                         resumed_from=amount(series.get("resumed_from")), from_series=True,
                         acceptance=tuple((e, v) for item in (series.get("acceptance") or [])[:10_000]
                                          if isinstance(item, list) and len(item) >= 2
                                          and (e := amount(item[0])) is not None and (v := finite(item[1])) is not None),
                         chosen_epoch=amount(series.get("chosen_epoch")),
                         acceptance_patience=amount(series.get("acceptance_patience")),
                         stale_epochs=amount(series.get("stale_epochs")))
