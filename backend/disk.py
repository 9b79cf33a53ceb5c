"""Disk on the host: what each run directory holds, and which runs may go (`python -m backend.disk`).

    python -m backend.disk survey --work-dir W
    python -m backend.disk prune --work-dir W [--running ID]... [--older-than S] [--stage S] [--archived]
                                 [--only ID]... [--delete]

`survey` prints one JSON object: the volumes (free and total bytes of the work dir's volume and of every
volume a run directory lives on) and every run directory under `<work dir>/runs`, archived ones included
(`--fresh` moves a run aside as `<run id>.archived-<stamp>`), with its size on disk, stage, state, age
and input run. `prune` prints the plan, what would be deleted and what is kept and why; only with
`--delete` does it delete, and then only the runs named by `--only` (what the operator was shown and
agreed to) that the plan, made again at that moment, still allows. Never deleted: a running run (named
by the console with `--running`, or unfinished and written in the last RECENT_S seconds), the inputs of
a running run and theirs in turn (and every run of a running pipeline), and the newest completed run of each stage.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from backend.lookup import last_finish
from backend.runs import MANIFEST_FILE

RECENT_S = 600.0  # an unfinished run written this recently may be running: never deleted
_ARCHIVED = re.compile(r"(?P<run_id>[A-Za-z0-9][A-Za-z0-9_-]{0,63})\.archived-[0-9T-]+")
_RUN_DIR = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


@dataclass(frozen=True)
class RunDisk:
    name: str  # the directory's name under runs/ (an archived run's carries its suffix)
    run_id: str
    path: str
    stage: str | None
    state: str  # completed | failed | stopped | unfinished
    size: int  # bytes on disk
    mtime: float  # the newest of the directory and its events file
    archived: bool = False
    inputs: tuple[str, ...] = ()  # runs it consumes (its manifest's input_run; a pipeline's stage runs)
    link: str | None = None  # runs/<name> is a symbolic link to this directory (another volume, typically)


@dataclass(frozen=True)
class Volume:
    path: str
    free: int
    total: int


@dataclass
class Plan:
    delete: list[RunDisk] = field(default_factory=list)
    keep: list[tuple[RunDisk, str]] = field(default_factory=list)  # with the reason it is kept

    @property
    def total(self) -> int:
        return sum(r.size for r in self.delete)

    def to_dict(self) -> dict[str, Any]:
        return {"delete": [asdict(r) for r in self.delete], "total_bytes": self.total,
                "keep": [{**asdict(r), "reason": why} for r, why in self.keep]}


def _size(path: str) -> int:
    total = 0
    for root, dirs, files in os.walk(path, onerror=lambda _e: None):
        for name in files + dirs:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_blocks * 512
    return total


def _inputs(manifest: dict[str, Any]) -> tuple[str, ...]:
    identity = manifest.get("identity") if isinstance(manifest.get("identity"), dict) else {}
    out = []
    if isinstance(identity.get("input_run"), str):
        out.append(identity["input_run"])
    for entry in identity.get("stages") or []:  # a pipeline run: every stage run is its
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str):
            out.append(entry[1])
    return tuple(out)


def read_run(path: str) -> RunDisk | None:
    name = os.path.basename(path)
    m = _ARCHIVED.fullmatch(name)
    if not m and not _RUN_DIR.fullmatch(name):
        return None  # not a run directory (a temp file, a foreign name): never listed, never deleted
    manifest: dict[str, Any] = {}
    try:
        with open(os.path.join(path, MANIFEST_FILE), encoding="utf-8") as f:
            loaded = json.load(f)
            manifest = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass
    try:
        finish = last_finish(path) or {}
    except (OSError, ValueError):
        finish = {}
    status = finish.get("status")
    state = status if status in ("completed", "failed", "stopped") else "unfinished"
    mtimes = [os.stat(path).st_mtime]
    events = os.path.join(path, "events.jsonl")
    if os.path.exists(events):
        mtimes.append(os.stat(events).st_mtime)
    stage = manifest.get("stage") if isinstance(manifest.get("stage"), str) else None
    link = os.path.realpath(path) if os.path.islink(path) else None
    return RunDisk(name=name, run_id=m["run_id"] if m else name, path=path, stage=stage, state=state,
                   size=_size(path), mtime=max(mtimes), archived=bool(m), inputs=_inputs(manifest), link=link)


def survey(work_dir: str) -> tuple[list[Volume], list[RunDisk]]:
    runs_dir = os.path.join(os.path.abspath(work_dir), "runs")
    runs: list[RunDisk] = []
    if os.path.isdir(runs_dir):
        for name in sorted(os.listdir(runs_dir)):
            path = os.path.join(runs_dir, name)
            if os.path.isdir(path):  # a link to a directory on another volume counts too
                run = read_run(path)
                if run is not None:
                    runs.append(run)
    volumes: list[Volume] = []
    seen: set[int] = set()
    for path in [os.path.abspath(work_dir)] + [r.path for r in runs]:
        probe = path
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        dev = os.stat(probe).st_dev
        if dev in seen:
            continue
        seen.add(dev)
        usage = shutil.disk_usage(probe)
        volumes.append(Volume(path=probe, free=usage.free, total=usage.total))
    return volumes, runs


def plan_prune(runs: Iterable[RunDisk], *, running: Iterable[str] = (), now: float, older_than_s: float | None = None,
               stage: str | None = None, archived_only: bool = False) -> Plan:
    """Pure: which runs the selection would delete, and which it keeps and why."""
    runs = list(runs)
    live = set(running) | {r.run_id for r in runs if r.state == "unfinished" and not r.archived
                           and now - r.mtime < RECENT_S}
    # the inputs of a running run, and theirs in turn: a verify run reads its train run's prepare rows
    inputs_of = {r.run_id: r.inputs for r in runs if not r.archived}
    protected_inputs: dict[str, str] = {}
    for r in runs:
        if r.run_id in live and not r.archived:
            todo = list(r.inputs)
            while todo:
                inp = todo.pop()
                if inp not in protected_inputs and inp != r.run_id:
                    protected_inputs[inp] = r.run_id
                    todo.extend(inputs_of.get(inp, ()))
    newest: dict[str, RunDisk] = {}
    for r in runs:
        if r.state == "completed" and not r.archived and r.stage:
            if r.stage not in newest or r.mtime > newest[r.stage].mtime:
                newest[r.stage] = r
    plan = Plan()
    for r in runs:
        if stage is not None and r.stage != stage:
            continue
        if archived_only and not r.archived:
            continue
        if older_than_s is not None and now - r.mtime < older_than_s:
            continue
        if r.link is not None:
            plan.keep.append((r, f"a link to {r.link}: remove it there by hand"))
        elif not r.archived and r.run_id in live:
            plan.keep.append((r, "running" if r.run_id in set(running) else
                              f"unfinished and written {now - r.mtime:.0f} s ago: may be running"))
        elif not r.archived and r.run_id in protected_inputs:
            plan.keep.append((r, f"the input of running run {protected_inputs[r.run_id]}"))
        elif not r.archived and r.stage in newest and newest[r.stage] is r:
            plan.keep.append((r, f"the newest completed {r.stage} run"))
        else:
            plan.delete.append(r)
    return plan


def room_hint(work_dir: str, need: int) -> str:
    """For a preflight that lacks `need` more bytes: the runs whose removal would make room, or ''."""
    try:
        _, runs = survey(work_dir)
    except OSError:
        return ""
    plan = plan_prune(runs, now=time.time())
    picked, total = [], 0
    for r in sorted(plan.delete, key=lambda r: r.size, reverse=True):
        if total >= need:
            break
        picked.append(r)
        total += r.size
    if not picked or total < need:
        return ""
    names = ", ".join(f"{r.name} ({r.size / 2**30:.1f} GiB)" for r in picked)
    return f"; removing {names} would make room (`eagle3-console runs prune`)"


def delete(work_dir: str, plan: Plan, only: Iterable[str]) -> list[str]:
    """Delete the runs named in `only` that the plan allows; returns what was deleted."""
    runs_dir = os.path.join(os.path.abspath(work_dir), "runs")
    allowed = {r.name: r for r in plan.delete}
    done = []
    for name in only:
        r = allowed.get(name)
        if r is None or os.path.dirname(r.path) != runs_dir or os.path.islink(r.path):
            continue
        shutil.rmtree(r.path)
        done.append(name)
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.disk", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("survey", "prune"))
    p.add_argument("--work-dir", required=True)
    p.add_argument("--running", action="append", default=[], help="a run the console sees running")
    p.add_argument("--older-than", type=float, default=None, help="only runs untouched for this many seconds")
    p.add_argument("--stage", default=None)
    p.add_argument("--archived", action="store_true", help="only runs --fresh moved aside")
    p.add_argument("--only", action="append", default=[], help="with --delete: the runs to delete")
    p.add_argument("--delete", action="store_true")
    a = p.parse_args(argv)
    volumes, runs = survey(a.work_dir)
    if a.action == "survey":
        print(json.dumps({"volumes": [asdict(v) for v in volumes], "runs": [asdict(r) for r in runs]}))
        return 0
    plan = plan_prune(runs, running=a.running, now=time.time(), older_than_s=a.older_than, stage=a.stage,
                      archived_only=a.archived)
    out = plan.to_dict()
    if a.delete:
        out["deleted"] = delete(a.work_dir, plan, a.only)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
