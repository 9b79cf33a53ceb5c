"""Disk on the host: what each run directory holds, and which runs may go (`python -m backend.kit.disk`).

    python -m backend.kit.disk survey --work-dir W
    python -m backend.kit.disk prune --work-dir W [--running ID]... [--older-than S] [--stage S] [--archived]
                                 [--resumable] [--only ID]... [--delete]

`survey` prints one JSON object: the volumes (free and total bytes of the work dir's volume and of every
volume a run directory lives on) and every run directory under `<work dir>/runs`, archived ones included
(`--fresh` moves a run aside as `<run id>.archived-<stamp>`), with its size on disk, stage, state, age
and input run. `prune` prints the plan, what would be deleted and what is kept and why; only with
`--delete` does it delete, and then only the runs named by `--only` (what the operator was shown and
agreed to) that the plan, made again at that moment, still allows, each on its own (its result said).

Never deleted: a running run (named by the console with `--running`, run by a live `e3-*` systemd unit
or tmux session of this host, or unfinished and written in the last RECENT_S seconds), a run a live
process names a path of (the drafter server's checkpoint), the newest completed run of each stage, a
resumable run (failed, stopped, unfinished; unless `--resumable`), a run holding a mount point, and
every run any of those needs, transitively: one dependency graph read from every key of each run's
records (manifest.json, summary.json, its plans), by run id or by a path under runs/. Each deletion
says which other runs it breaks, or that it breaks nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable

from backend.contract.lookup import last_finish
from backend.contract.runs import MANIFEST_FILE, SUMMARY_FILE, UNIT_PREFIX, unit_run

RECENT_S = 600.0  # an unfinished run written this recently may be running: never deleted
_ARCHIVED = re.compile(r"(?P<run_id>[A-Za-z0-9][A-Za-z0-9_-]{0,63})\.archived-[0-9T-]+")
_RUN_DIR = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_PATH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a run directory's name inside a path (archived too)
RECORD_MAX = 8 << 20  # bytes of one record file read for the names it holds
RECORDS_MAX = 64  # record files (top-level *.json) read per run
STRINGS_MAX = 200_000  # strings of one run's records searched for names
CMDLINE_MAX = 64 << 10  # bytes of one process's command line read
ASK_TIMEOUT_S = 10.0  # systemctl and tmux, asked which units and sessions live
NOT_REFERENCES = frozenset({"stage", "input_stage", "status", "title", "server", "state", "method"})
LIVE_UNIT_STATES = ("active", "activating", "deactivating", "reloading")


@dataclass(frozen=True)
class RunDisk:
    name: str  # the directory's name under runs/ (an archived run's carries its suffix)
    run_id: str
    path: str
    stage: str | None
    state: str  # completed | failed | stopped | unfinished
    size: int  # bytes on disk (never counted across a mount point)
    mtime: float  # the newest of the directory and its events file
    archived: bool = False
    # the runs it needs, by directory name, each with where its records name it ("manifest.json:
    # identity.from_pretrained"): every key of every record, by run id or by a path under runs/
    inputs: tuple[str, ...] = ()
    via: dict[str, str] = field(default_factory=dict)
    link: str | None = None  # runs/<name> is a symbolic link to this directory (another volume, typically)
    mounts: tuple[str, ...] = ()  # mount points inside it: never deleted through, never counted


@dataclass(frozen=True)
class Volume:
    path: str
    free: int
    total: int


@dataclass
class Plan:
    delete: list[RunDisk] = field(default_factory=list)
    keep: list[tuple[RunDisk, str]] = field(default_factory=list)  # with the reason it is kept
    breaks: dict[str, str] = field(default_factory=dict)  # per deletion: what it breaks ("" nothing)

    @property
    def total(self) -> int:
        return sum(r.size for r in self.delete)

    def to_dict(self) -> dict[str, Any]:
        return {"delete": [{**asdict(r), "breaks": self.breaks.get(r.name, "")} for r in self.delete],
                "total_bytes": self.total, "keep": [{**asdict(r), "reason": why} for r, why in self.keep]}


def _unescape_mount(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), text)


def mount_points() -> list[str]:
    """Every mount point of this mount namespace (/proc/self/mountinfo): a bind mount of a directory of
    the same filesystem has the same st_dev, so the device alone does not tell."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            text = f.read(4 << 20).decode(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            out.append(_unescape_mount(fields[4]))
    return out


def mounts_in(path: str, points: Iterable[str] | None = None) -> tuple[str, ...]:
    """The mount points at or below `path` (its real path)."""
    real = os.path.realpath(path)
    return tuple(sorted(p for p in (mount_points() if points is None else points)
                        if p == real or p.startswith(real.rstrip("/") + "/")))


def _size(path: str, mounts: Iterable[str] = ()) -> int:
    """Bytes on disk below `path`, none across a mount point (another volume's files are not this run's)."""
    total = 0
    try:
        dev = os.lstat(path).st_dev
    except OSError:
        return 0
    skip = {os.path.realpath(m) for m in mounts}
    real = os.path.realpath(path)
    for root, dirs, files in os.walk(path, onerror=lambda _e: None):
        real_root = os.path.join(real, os.path.relpath(root, path))
        kept = []
        for name in dirs:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if st.st_dev != dev or os.path.normpath(os.path.join(real_root, name)) in skip:
                continue  # a mount point: neither counted nor entered
            total += st.st_blocks * 512
            kept.append(name)
        dirs[:] = kept
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


def _strings(data: Any, where: str, out: list[tuple[str, str]], depth: int = 0) -> None:
    if len(out) >= STRINGS_MAX or depth > 64:
        return
    if isinstance(data, str):
        out.append((where, data))
    elif isinstance(data, dict):
        for key, value in data.items():
            if isinstance(key, str) and key in NOT_REFERENCES:
                continue  # a stage's or a server's name, never a run's
            _strings(value, f"{where}.{key}" if where else str(key), out, depth + 1)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _strings(value, f"{where}[{i}]", out, depth + 1)


def record_strings(path: str) -> list[tuple[str, str]]:
    """Every string of the run's records (manifest.json, summary.json, its plans: each top-level *.json),
    with where it is: what the dependency graph reads for the runs one run needs."""
    out: list[tuple[str, str]] = []
    try:
        first = (MANIFEST_FILE, SUMMARY_FILE)  # what the run is, then what it made: named first in a reason
        names = sorted((n for n in os.listdir(path) if n.endswith(".json")),
                       key=lambda n: (first.index(n) if n in first else len(first), n))[:RECORDS_MAX]
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(path, name), "rb") as f:
                raw = f.read(RECORD_MAX + 1)
            if len(raw) > RECORD_MAX:
                continue
            data = json.loads(raw)
        except (OSError, ValueError, RecursionError):
            continue
        found: list[tuple[str, str]] = []
        _strings(data, "", found)
        out += [(f"{name}: {where}", text) for where, text in found[:STRINGS_MAX - len(out)]]
    return out


def run_dirs_prefixes(work_dir: str) -> tuple[str, ...]:
    """`<work dir>/runs/` as paths may spell it: as given and resolved."""
    runs_dir = os.path.join(os.path.abspath(work_dir), "runs")
    return tuple(dict.fromkeys((runs_dir + "/", os.path.realpath(runs_dir) + "/")))


def names_in_text(text: str, prefixes: Iterable[str]) -> list[str]:
    """The run directory names that paths under runs/ in `text` name (`.../runs/train-1/checkpoint`)."""
    out = []
    for prefix in prefixes:
        start = 0
        while (i := text.find(prefix, start)) >= 0:
            start = i + len(prefix)
            m = _PATH_NAME.match(text, start)
            if m:
                out.append(m[0].rstrip("."))
    return out


def _references(strings: list[tuple[str, str]], *, self_name: str, by_id: dict[str, str], names: set[str],
                prefixes: tuple[str, ...]) -> dict[str, str]:
    refs: dict[str, str] = {}
    for where, text in strings:  # a run id first: the plainest way a record names the run (input_run)
        if text in by_id and by_id[text] != self_name:
            refs.setdefault(by_id[text], where)
    for where, text in strings:
        for name in names_in_text(text, prefixes):
            if name in names and name != self_name:
                refs.setdefault(name, where)
    return refs


def _read_state(path: str) -> tuple[str | None, str]:
    manifest: dict[str, Any] = {}
    try:
        with open(os.path.join(path, MANIFEST_FILE), encoding="utf-8") as f:
            loaded = json.load(f)
            manifest = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError, RecursionError):
        pass
    try:
        finish = last_finish(path) or {}
    except (OSError, ValueError):
        finish = {}
    status = finish.get("status")
    stage = manifest.get("stage") if isinstance(manifest.get("stage"), str) else None
    return stage, status if status in ("completed", "failed", "stopped") else "unfinished"


def read_run(path: str, *, points: list[str] | None = None) -> RunDisk | None:
    """One run directory (its references resolved later, by `survey`); OSError when it went meanwhile."""
    name = os.path.basename(path)
    m = _ARCHIVED.fullmatch(name)
    if not m and not _RUN_DIR.fullmatch(name):
        return None  # not a run directory (a temp file, a foreign name): never listed, never deleted
    stage, state = _read_state(path)
    mtimes = [os.stat(path).st_mtime]
    events = os.path.join(path, "events.jsonl")
    with contextlib.suppress(FileNotFoundError):
        mtimes.append(os.stat(events).st_mtime)
    link = os.path.realpath(path) if os.path.islink(path) else None
    mounts = mounts_in(path, points)
    return RunDisk(name=name, run_id=m["run_id"] if m else name, path=path, stage=stage, state=state,
                   size=_size(path, mounts), mtime=max(mtimes), archived=bool(m), link=link, mounts=mounts)


def survey(work_dir: str, skipped: list[tuple[str, str]] | None = None) -> tuple[list[Volume], list[RunDisk]]:
    """The volumes and the run directories with the runs each needs. A run that goes (or is renamed)
    while it is read is left out, and said in `skipped` (name, why)."""
    runs_dir = os.path.join(os.path.abspath(work_dir), "runs")
    skipped = [] if skipped is None else skipped
    points = mount_points()
    found: list[RunDisk] = []
    strings: dict[str, list[tuple[str, str]]] = {}
    try:
        listing = sorted(os.listdir(runs_dir))
    except FileNotFoundError:
        listing = []
    for name in listing:
        path = os.path.join(runs_dir, name)
        try:
            if not os.path.isdir(path):  # a link to a directory on another volume counts too
                continue
            run = read_run(path, points=points)
        except OSError as e:
            skipped.append((name, f"changed while it was read ({e.strerror or e}): left out, ask again"))
            continue
        if run is not None:
            found.append(run)
            strings[run.name] = record_strings(path)
    by_id = {r.run_id: r.name for r in found if not r.archived}
    names = {r.name for r in found}
    prefixes = run_dirs_prefixes(work_dir)
    runs = []
    for r in found:
        refs = _references(strings[r.name], self_name=r.name, by_id=by_id, names=names, prefixes=prefixes)
        runs.append(replace(r, inputs=tuple(sorted(refs)), via=refs))
    volumes: list[Volume] = []
    seen: set[int] = set()
    for path in [os.path.abspath(work_dir)] + [r.path for r in runs]:
        probe = path
        try:
            while not os.path.exists(probe) and os.path.dirname(probe) != probe:
                probe = os.path.dirname(probe)
            dev = os.stat(probe).st_dev
            if dev in seen:
                continue
            seen.add(dev)
            usage = shutil.disk_usage(probe)
        except OSError:
            continue  # went meanwhile: its run is said in `skipped` on the next survey
        volumes.append(Volume(path=probe, free=usage.free, total=usage.total))
    return volumes, runs


def _ask(argv: list[str]) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, timeout=ASK_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return ""
    return res.stdout[:1 << 20].decode(errors="replace") if res.returncode == 0 else ""


def live_units() -> dict[str, str]:
    """Run id -> the live `e3-<stage>-<run id>` systemd unit or tmux session that runs it, whoever started
    it (another console, a script): the host's own list, not one console's."""
    live: dict[str, str] = {}
    for line in _ask(["systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager",
                      f"{UNIT_PREFIX}*"]).splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] in LIVE_UNIT_STATES and (found := unit_run(fields[0])):
            live.setdefault(found[1], f"systemd unit {fields[0].removesuffix('.service')}")
    for line in _ask(["tmux", "list-panes", "-a", "-F", "#{session_name} #{pane_dead}"]).splitlines():
        session, _, dead = line.rpartition(" ")
        if dead == "0" and (found := unit_run(session)):
            live.setdefault(found[1], f"tmux session {session}")
    return live


def live_processes(work_dir: str) -> dict[str, str]:
    """Run directory name -> the live process whose command line or working directory names a path in
    it: the drafter server that serves a checkpoint, a stage started by hand."""
    prefixes = run_dirs_prefixes(work_dir)
    used: dict[str, str] = {}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return used
    for pid in pids[:1 << 16]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read(CMDLINE_MAX).split(b"\0")
        except OSError:
            continue
        text = " ".join(a.decode(errors="replace") for a in argv if a)
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd") + "/"
        except OSError:
            cwd = ""
        for name in names_in_text(text + "\n" + cwd, prefixes):
            used.setdefault(name, f"used by live process {pid} ({os.path.basename(argv[0].decode(errors='replace'))[:40]})")
    return used


def plan_prune(runs: Iterable[RunDisk], *, running: Iterable[str] = (), now: float, older_than_s: float | None = None,
               stage: str | None = None, archived_only: bool = False, resumable: bool = False,
               live: dict[str, str] | None = None) -> Plan:
    """Pure: which runs the selection would delete, which it keeps and why, and what each deletion breaks.

    One dependency graph (each run's `inputs`, read from every key of its records): a run that is kept
    (running, used by a live unit, session or process, the newest completed of its stage, resumable,
    linked, holding a mount) keeps every run it needs, and theirs in turn. `live` maps a run id or a
    run directory's name to what uses it (`live_units`, `live_processes`)."""
    runs = list(runs)
    by_name = {r.name: r for r in runs}
    console_running = set(running)
    live = dict(live or {})
    newest: dict[str, RunDisk] = {}
    for r in runs:
        if r.state == "completed" and not r.archived and r.stage:
            if r.stage not in newest or r.mtime > newest[r.stage].mtime:
                newest[r.stage] = r
    own: dict[str, str] = {}  # kept for itself
    for r in runs:
        if r.link is not None:
            own[r.name] = f"a link to {r.link}: remove it there by hand"
        elif r.mounts:
            own[r.name] = f"holds a mount point ({', '.join(r.mounts)}): unmount it first, then prune"
        elif r.name in live or (not r.archived and r.run_id in live):
            own[r.name] = live.get(r.name) or live[r.run_id]
        elif not r.archived and r.run_id in console_running:
            own[r.name] = "running"
        elif not r.archived and r.state == "unfinished" and now - r.mtime < RECENT_S:
            own[r.name] = f"unfinished and written {now - r.mtime:.0f} s ago: may be running"
        elif not r.archived and newest.get(r.stage or "") is r:
            own[r.name] = f"the newest completed {r.stage} run"
        elif not r.archived and r.state != "completed" and not resumable:
            own[r.name] = f"{r.state}: resumable (runs prune --resumable deletes it)"
    reasons = dict(own)
    todo = list(own)
    while todo:  # everything a kept run needs, and what that needs in turn
        user = todo.pop()
        for inp in by_name[user].inputs if user in by_name else ():
            if inp not in reasons and inp in by_name:
                reasons[inp] = f"the input of {user} ({by_name[user].via.get(inp, 'its record')})"
                todo.append(inp)
    plan = Plan()
    for r in runs:
        if stage is not None and r.stage != stage:
            continue
        if archived_only and not r.archived:
            continue
        if older_than_s is not None and now - r.mtime < older_than_s:
            continue
        if r.name in reasons:
            plan.keep.append((r, reasons[r.name]))
        else:
            plan.delete.append(r)
    going = {r.name for r in plan.delete}
    for r in plan.delete:
        users = [f"{u.name} ({u.via.get(r.name, 'its record')})" for u in runs
                 if r.name in u.inputs and u.name not in going]
        plan.breaks[r.name] = ("breaks " + "; ".join(users)) if users else ""
    return plan


def host_plan(work_dir: str, *, running: Iterable[str] = (), **selection: Any) -> tuple[Plan, list[tuple[str, str]]]:
    """The plan with what the host itself sees live (units, sessions, processes), and the runs skipped."""
    skipped: list[tuple[str, str]] = []
    _, runs = survey(work_dir, skipped)
    live = {**live_processes(work_dir), **live_units()}
    return plan_prune(runs, running=running, now=time.time(), live=live, **selection), skipped


def room_hint(work_dir: str, need: int, *, run_id: str | None = None, uses: Iterable[str] = ()) -> str:
    """For a preflight that lacks `need` more bytes: the runs whose removal would make room, or ''.
    Never the calling run (`run_id`: it may be resuming) nor what it uses (`uses`: run ids or paths)."""
    try:
        plan, _ = host_plan(work_dir, running=[run_id] if run_id else [])
    except OSError:
        return ""
    prefixes = run_dirs_prefixes(work_dir)
    spare = {run_id} if run_id else set()
    for u in uses:
        spare.add(u)
        spare.update(names_in_text(u, prefixes))
    candidates = [r for r in plan.delete if r.name not in spare and r.run_id not in spare]
    picked, total = [], 0
    for r in sorted(candidates, key=lambda r: r.size, reverse=True):
        if total >= need:
            break
        picked.append(r)
        total += r.size
    if not picked or total < need:
        return ""
    names = ", ".join(f"{r.name} ({r.size / 2**30:.1f} GiB)" for r in picked)
    return f"; removing {names} would make room (`eagle3-console runs prune`)"


@dataclass(frozen=True)
class Deletion:
    name: str
    deleted: bool
    reason: str = ""  # why not, or what is left of it


def _unwritable(path: str) -> str | None:
    """The first directory below `path` (or it) that this user cannot empty, said with its owner."""
    for root, dirs, _files in os.walk(path, onerror=lambda _e: None):
        if not os.access(root, os.W_OK | os.X_OK):
            try:
                owner = os.stat(root).st_uid
            except OSError:
                owner = -1
            return f"{root} is owned by uid {owner}, not writable by uid {os.geteuid()}"
    return None


def delete_one(runs_dir: str, r: RunDisk) -> Deletion:
    if os.path.dirname(r.path) != runs_dir or os.path.islink(r.path):
        return Deletion(r.name, False, "not a run directory of this work dir")
    mounts = mounts_in(r.path)
    if mounts:
        return Deletion(r.name, False, f"holds a mount point ({', '.join(mounts)}): never deleted through; "
                                       f"unmount it first")
    if not os.access(runs_dir, os.W_OK | os.X_OK):
        return Deletion(r.name, False, f"{runs_dir} is not writable by uid {os.geteuid()}")
    if problem := _unwritable(r.path):
        return Deletion(r.name, False, f"cannot delete: {problem} (a stage ran as another user: "
                                       f"the profile's sudo decides who deletes)")
    errors: list[str] = []
    shutil.rmtree(r.path, onerror=lambda _f, p, exc: errors.append(f"{p}: {exc[1]}"))
    if errors:
        return Deletion(r.name, False, f"partly deleted: {len(errors)} error(s), the first: {errors[0]}")
    return Deletion(r.name, True)


def delete(work_dir: str, plan: Plan, only: Iterable[str]) -> list[Deletion]:
    """Delete the runs named in `only` that the plan allows, each on its own: one that fails (or holds a
    mount point) is said and the rest go on."""
    runs_dir = os.path.join(os.path.abspath(work_dir), "runs")
    allowed = {r.name: r for r in plan.delete}
    kept = {r.name: why for r, why in plan.keep}
    out = []
    for name in dict.fromkeys(only):
        r = allowed.get(name)
        if r is None:
            out.append(Deletion(name, False, f"kept: {kept[name]}" if name in kept else "not in the plan"))
            continue
        try:
            out.append(delete_one(runs_dir, r))
        except OSError as e:
            out.append(Deletion(name, False, f"{type(e).__name__}: {e}"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.kit.disk", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("survey", "prune"))
    p.add_argument("--work-dir", required=True)
    p.add_argument("--running", action="append", default=[], help="a run the console sees running")
    p.add_argument("--older-than", type=float, default=None, help="only runs untouched for this many seconds")
    p.add_argument("--stage", default=None)
    p.add_argument("--archived", action="store_true", help="only runs --fresh moved aside")
    p.add_argument("--resumable", action="store_true", help="failed, stopped and unfinished runs may go too")
    p.add_argument("--only", action="append", default=[], help="with --delete: the runs to delete")
    p.add_argument("--delete", action="store_true")
    a = p.parse_args(argv)
    if a.action == "survey":
        skipped: list[tuple[str, str]] = []
        volumes, runs = survey(a.work_dir, skipped)
        print(json.dumps({"volumes": [asdict(v) for v in volumes], "runs": [asdict(r) for r in runs],
                          "skipped": [{"name": n, "reason": why} for n, why in skipped]}))
        return 0
    plan, skipped = host_plan(a.work_dir, running=a.running, older_than_s=a.older_than, stage=a.stage,
                              archived_only=a.archived, resumable=a.resumable)
    out = plan.to_dict()
    out["skipped"] = [{"name": n, "reason": why} for n, why in skipped]
    if a.delete:
        results = delete(a.work_dir, plan, a.only)
        out["results"] = [asdict(d) for d in results]
        out["deleted"] = [d.name for d in results if d.deleted]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
