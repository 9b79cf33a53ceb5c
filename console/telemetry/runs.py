"""Stage runs as the console sees them: each run dir's events.jsonl, read by offset, and its unit.

A run's state comes from its own events first (a finish event says done, failed or stopped) and from its
unit second: no finish and no live unit means the program died without a word (kill -9, reboot): stale.
A train run also keeps its curves (console/telemetry/train_view.py); a `resume` event carrying a `step`
supersedes the progress of the steps a restart trains again (backend/contract/events.py).
A stale run shows what its last events said is on disk: the generate stage reports every durable batch
and starts with what it found on disk, so that is the record count a resume would start from.

Reads are bounded: one probe asks for about PROBE_EVENTS_BUDGET bytes of events in all (unfinished and
newest runs first, the rest on later probes), an old run found at start-up is read from its tail only
(its last events say how it ended), and a line longer than one read makes the next read larger instead
of stopping that run's reader for good: up to READ_LIMIT_MAX, the one bound on a line, which such a read
may take beyond the probe's budget.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from backend.contract.events import Event, read_events
from backend.contract.numbers import count, finite
from console.parsers.text import clean
from console.naming import UNIT_STAGE, is_stage_unit, stage_unit_name, unit_stages
from console.snapshot import RunInfo
from console.telemetry.probe import EventsRead, RunFile
from console.telemetry.train_view import TrainSeries

HISTORY_MAX = 2000  # progress events kept per run for curves
READ_LIMIT = 512 * 1024  # bytes of one run's events per probe, to begin with
READ_LIMIT_MAX = 64 << 20  # a single line longer than this is skipped
PROBE_EVENTS_BUDGET = 2 << 20  # bytes of events in one probe, all runs together
TAIL_BYTES = 64 * 1024  # how much of an old run is read when it is found
FULL_HISTORY_RUNS = 4  # the newest runs are read whole (their curves), older ones from the tail


HOST_KEYS = ("vllm_version", "speculators_version", "torch_version", "torch_cuda", "driver_version", "python")
CHECKPOINT_KEYS = ("path", "sha256", "method", "weight_files", "error")


def host_facts(data: object) -> dict | None:
    """A start event's `host` (backend/kit/hostfacts.py) as the console keeps it: the known keys only, each
    value a short cleaned string (a host's text is untrusted), the command line at most 200 arguments."""
    if not isinstance(data, dict):
        return None
    out: dict = {k: (clean(data[k], 80) if data.get(k) is not None else None) for k in HOST_KEYS if k in data}
    cmd = data.get("server_command")
    if isinstance(cmd, list):
        out["server_command"] = [clean(a, 400) for a in cmd[:200]]
    servers = data.get("servers")
    if isinstance(servers, dict):
        out["servers"] = {clean(name, 40): [clean(a, 400) for a in argv[:200]]
                          for name, argv in list(servers.items())[:8] if isinstance(argv, list)}
    ck = data.get("checkpoint")
    if isinstance(ck, dict):
        out["checkpoint"] = {k: clean(ck[k], 400) for k in CHECKPOINT_KEYS if ck.get(k) is not None}
    return out


def smoke_facts(data: object) -> dict | None:
    """A generation start's `smoke` (backend/generate/smoke.py) as the console keeps it: its numbers (finite
    or null), the history's size, the throttled GPUs and the warnings, cleaned and bounded."""
    if not isinstance(data, dict):
        return None
    history = data.get("history")
    throttle = data.get("throttle")
    warnings = data.get("warnings")
    return {"tokens_per_s": finite(data.get("tokens_per_s")), "history_median": finite(data.get("history_median")),
            "history_runs": len(history) if isinstance(history, list) else 0,
            "requests": count(data.get("requests")), "completed": count(data.get("completed")),
            "seconds": finite(data.get("seconds")),
            "throttled": [clean(f"GPU {r.get('index')}: {', '.join(map(str, r.get('reasons') or []))}", 200)
                          for r in (throttle if isinstance(throttle, list) else [])[:64]
                          if isinstance(r, dict) and count(r.get("mask")) & ~1],
            "warnings": [clean(w, 600) for w in (warnings if isinstance(warnings, list) else [])[:8]]}


@dataclass
class RunTrack:
    run_dir: str
    run_id: str
    offset: int = 0  # bytes of events.jsonl consumed
    size: int = 0  # its size at the last listing
    mtime: float = 0.0
    read_limit: int = READ_LIMIT
    started_in: str | None = None
    skip_partial: bool = False  # the next read starts mid-line: drop up to the first newline
    stage: str = ""
    total: int = 0
    progress: dict | None = None
    finish: dict | None = None
    errors: int = 0
    skipped_lines: int = 0  # lines of its events.jsonl that were not events (counted, never raised)
    started: float | None = None
    history: list[dict] = field(default_factory=list)
    series: TrainSeries | None = None  # train runs only
    host: dict | None = None  # the host's facts of its latest start
    smoke: dict | None = None  # a generation's throughput smoke, from its latest start

    @property
    def unit(self) -> str:
        # the unit its start event named (a pipeline's stages run in the chain's), else its own
        return self.started_in or stage_unit_name(UNIT_STAGE.get(self.stage, self.stage), self.run_id)

    def apply(self, ev: Event) -> None:
        self.stage = ev.stage or self.stage
        d = dict(ev.data, ts=ev.ts, kind=ev.kind)
        if self.stage == "train":
            if self.series is None:
                self.series = TrainSeries()
            self.series.apply(ev.kind, ev.data)
        if ev.kind == "resume" and isinstance(ev.data.get("step"), int):
            self._supersede(ev.data["step"])
        if ev.kind == "start":
            self.total = count(ev.data.get("total"))
            self.started = ev.ts
            self.host = host_facts(ev.data.get("host"))
            self.smoke = smoke_facts(ev.data.get("smoke"))
            self.finish = None  # a resumed run starts again
            unit = ev.data.get("unit")
            # only a unit this project names is believed: a foreign or hostile writer naming another unit
            # would have the console ask it whether the run lives, and `stop` stop it
            # a unit of its own stage or of the chain it runs in; any other name is not believed
            self.started_in = unit if is_stage_unit(unit, unit_stages(self.stage)) else None
            if "done" in ev.data:  # the counters as the run found them on disk (a resume starts from there)
                self.progress = {k: v for k, v in d.items() if k != "manifest"}
        elif ev.kind == "progress":
            self.progress = d
            self.total = count(ev.data.get("total")) or self.total
            self.history.append(d)
            del self.history[:-HISTORY_MAX]
        elif ev.kind == "error":
            self.errors += 1
        elif ev.kind == "finish":
            self.finish = d

    def _supersede(self, step: int) -> None:
        """A restart from `step`: drop the progress of the steps it trains again."""
        self.history = [h for h in self.history if not isinstance(h.get("step"), int) or h["step"] < step]
        if self.progress is not None and isinstance(self.progress.get("step"), int) and self.progress["step"] >= step:
            self.progress = self.history[-1] if self.history else None


class RunBook:
    def __init__(self, manager: str):
        self.manager = manager
        self.tracks: dict[str, RunTrack] = {}
        self.unit_states: dict[str, str] = {}

    def reads_wanted(self, budget: int = PROBE_EVENTS_BUDGET) -> list[EventsRead]:
        # unfinished runs are read every time, whatever the last listing said: the probe asks their
        # units before it reads their events, so a finish written just before the exit is never missed
        wanted = [t for t in self.tracks.values() if t.size > t.offset or (t.stage and t.finish is None)]
        wanted.sort(key=lambda t: (not (t.stage and t.finish is None), -t.mtime))
        reads = []
        for t in wanted:
            if budget <= 0:
                break
            # a run in the middle of one line longer than its first read gets the whole larger read it
            # asked for, budget or not (up to READ_LIMIT_MAX): capped at the budget, a line longer than
            # the budget (a generation start with a large manifest) could never be read whole
            limit = t.read_limit if t.read_limit > READ_LIMIT else min(t.read_limit, budget)
            if not (t.stage and t.finish is None):
                # done, or not read yet: what the listing saw is all there is to read (a line longer
                # than one read still gets the larger read it asked for)
                limit = min(limit, max(t.size - t.offset, 1))
            reads.append(EventsRead(t.run_dir, t.offset, limit))
            budget -= limit
        return reads

    def pending_units(self) -> list[str]:
        # several runs can share one unit (a pipeline's stages run in the chain's): ask each unit once
        return list(dict.fromkeys(t.unit for t in self.tracks.values() if t.finish is None and t.stage))

    def apply_listing(self, files: list[RunFile]) -> None:
        newest = {rf.run_dir for rf in sorted(files, key=lambda f: f.mtime)[-FULL_HISTORY_RUNS:]}
        for rf in files:
            track = self.tracks.get(rf.run_dir)
            if track is None or rf.size < track.offset:  # new, or replaced (`--fresh` archived the old one)
                track = self.tracks[rf.run_dir] = RunTrack(rf.run_dir, rf.run_id)
                if rf.run_dir not in newest and rf.size > TAIL_BYTES:
                    track.offset, track.skip_partial = rf.size - TAIL_BYTES, True
            track.size, track.mtime = rf.size, rf.mtime

    def apply_events(self, run_dir: str, data: bytes, limit: int = READ_LIMIT, offset: int | None = None) -> None:
        """`offset`: where the read began; a read asked before the listing found the file replaced
        (`--fresh`) belongs to the old file and is dropped."""
        track = self.tracks.get(run_dir)
        if track is None or (offset is not None and offset != track.offset):
            return
        full = len(data) >= limit
        if track.skip_partial:
            cut = data.find(b"\n")
            if cut < 0:
                track.offset += len(data) if full else 0
                return
            track.offset += cut + 1
            data, track.skip_partial = data[cut + 1:], False
        parsed = read_events(data)
        events, consumed = parsed.events, parsed.consumed
        track.offset += consumed
        track.skipped_lines += parsed.skipped
        if consumed == 0 and full:
            if track.read_limit < READ_LIMIT_MAX:
                track.read_limit = min(READ_LIMIT_MAX, track.read_limit * 4)  # one long line: read more
            else:
                track.offset += len(data)
                track.skip_partial = True  # beyond any sane size: skip that line
        for ev in events:
            try:
                track.apply(ev)
            except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError, RecursionError):
                # the conversions are total; this is the net for a shape nobody foresaw: one line lost
                track.skipped_lines += 1

    def apply_unit_states(self, text: str, units: list[str]) -> None:
        if self.manager == "systemd":  # `systemctl show U1 U2 -p Id,ActiveState,...`: blocks per unit
            current: dict[str, str] = {}
            for block in text.split("\n\n"):
                props = dict(l.split("=", 1) for l in block.splitlines() if "=" in l)
                if "Id" in props:
                    current[props["Id"].removesuffix(".service")] = props.get("ActiveState", "unknown")
            self.unit_states = current
        else:
            # a session whose pane is dead is a stage that exited (remain-on-exit keeps it for its status)
            alive = {b[0] for b in (l.split() for l in text.splitlines()) if len(b) == 2 and b[1] == "0"}
            self.unit_states = {u: ("active" if u in alive else "inactive") for u in units}

    def settled(self) -> bool:
        """Every run's events read and every unfinished run's unit asked (a one-shot status needs a few
        probes to get there: find runs, read events, ask units)."""
        if any(t.size > t.offset for t in self.tracks.values()):
            return False
        return all(u in self.unit_states for u in self.pending_units())

    def infos(self) -> list[RunInfo]:
        out = []
        for t in self.tracks.values():
            if not t.stage:
                continue
            p = dict(t.progress or {})
            if t.finish is not None:
                summary = t.finish.get("summary")
                p.update(summary if isinstance(summary, dict) else {})
                status = t.finish.get("status")
                p.update(kind="finish", status=status, ts=t.finish.get("ts"))
                state = "done" if status == "completed" else ("failed" if status == "failed" else "stopped")
            elif self.unit_states.get(t.unit, "active") in ("active", "activating"):
                state = "running"
            else:
                state = "stale"
            done, total, rate = count(p.get("done")), count(p.get("total")) or t.total, finite(p.get("rate"))
            # rows skipped (bad rows, prompts too long) or failed will not be generated: not in the ETA
            left = total - done - count(p.get("skipped")) - count(p.get("failed"))
            eta = finite(p.get("eta_s"))
            if eta is None and state == "running" and rate is not None and rate > 0 and left > 0:
                eta = round(left / rate, 1)  # the stage reports its rate; the ETA follows
            out.append(RunInfo(stage=t.stage, run_id=t.run_id, state=state, unit=t.unit, done=done, total=total,
                               failed=count(p.get("failed")), rate=rate, eta_s=eta, last_event=p or None,
                               series=t.series.to_dict() if t.series is not None else None,
                               skipped_lines=t.skipped_lines, started=t.started, host=t.host, smoke=t.smoke))
        return out
