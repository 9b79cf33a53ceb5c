"""Disk on the host, from the console: the survey (volumes, each run's size) and the prune, both by
`python -m backend.kit.disk` on the host (the one place that decides which runs are protected: a running
run, a run a live unit, session or process uses, the newest completed run of each stage, a resumable
run, and every run those need: one dependency graph). Everything the host answers is untrusted: an
entry that does not read (a size of 1e999, a NaN mtime) is left out and said, never deleted.

The prune is two calls: the plan (nothing deleted), shown to the operator with its total; then, once
agreed, the delete of exactly the runs shown, which the host plans again at that moment, so a run that
started meanwhile is still kept.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable

from console.control.launch import ensure_backend
from console.host.base import Host
from console.parsers.text import clean
from console.profile import Profile

DISK_TIMEOUT_S = 300.0  # sizing a work dir of many hidden-state files takes a while
_DURATION = re.compile(r"(?P<n>\d+(?:\.\d+)?)(?P<unit>[smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class DiskError(RuntimeError):
    pass


def parse_duration(text: str) -> float:
    """`--older-than`: 90, 90s, 30m, 12h, 7d or 2w -> seconds."""
    m = _DURATION.fullmatch(text.strip())
    if not m:
        raise DiskError(f"--older-than {text!r}: expected a number with s, m, h, d or w (e.g. 7d)")
    return float(m["n"]) * _UNITS[m["unit"]]


@dataclass(frozen=True)
class RunSpace:
    name: str
    run_id: str
    stage: str | None
    state: str
    size: int
    mtime: float
    archived: bool
    reason: str | None = None  # why the prune keeps it
    breaks: str = ""  # a deletion: the runs it breaks ("" nothing)


@dataclass(frozen=True)
class VolumeSpace:
    path: str
    free: int
    total: int


@dataclass(frozen=True)
class DiskReport:
    volumes: tuple[VolumeSpace, ...]
    runs: tuple[RunSpace, ...]
    skipped: tuple[str, ...] = ()  # runs left out, each with why (the host's, or an entry the console refused)


@dataclass(frozen=True)
class Deletion:
    name: str
    deleted: bool
    reason: str = ""


@dataclass(frozen=True)
class PrunePlan:
    delete: tuple[RunSpace, ...]
    keep: tuple[RunSpace, ...]
    total_bytes: int
    deleted: tuple[str, ...] = ()
    results: tuple[Deletion, ...] = ()  # with `only`: each asked run's result
    skipped: tuple[str, ...] = ()


MAX_BYTES = 1 << 62  # a size or free space beyond this is not a disk's


def _num(v: Any, what: str, *, limit: float = float(MAX_BYTES)) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DiskError(f"backend.kit.disk: {what}: expected a number, got {type(v).__name__}")
    if not math.isfinite(v) or not 0 <= v <= limit:
        raise DiskError(f"backend.kit.disk: {what}: expected a number from 0 to {limit:.0f}, got {v!r}")
    return v


def _run(d: Any) -> RunSpace:
    if not isinstance(d, dict):
        raise DiskError("backend.kit.disk: a run entry is not an object")
    stage = d.get("stage")
    reason = d.get("reason")
    breaks = d.get("breaks")
    name = clean(str(d.get("name", "")))[:200]
    return RunSpace(name=name, run_id=clean(str(d.get("run_id", "")))[:200],
                    stage=clean(stage)[:40] if isinstance(stage, str) else None,
                    state=clean(str(d.get("state", "")))[:20],
                    size=int(_num(d.get("size"), f"run {name!r} size")),
                    mtime=float(_num(d.get("mtime"), f"run {name!r} mtime", limit=1e11)),
                    archived=bool(d.get("archived")), reason=clean(reason)[:500] if isinstance(reason, str) else None,
                    breaks=clean(breaks)[:500] if isinstance(breaks, str) else "")


def _runs(entries: Any, skipped: list[str]) -> tuple[RunSpace, ...]:
    """The entries that read as runs; each one that does not is left out and said in `skipped` (and is
    never deleted: a deletion names only runs read here)."""
    out = []
    for entry in _list(entries):
        try:
            out.append(_run(entry))
        except (DiskError, ValueError, OverflowError) as e:
            skipped.append(f"an entry left out: {e}")
    return tuple(out)


def _skipped(data: dict[str, Any]) -> list[str]:
    return [f"{clean(str(s.get('name')))[:200]}: {clean(str(s.get('reason')))[:300]}"
            for s in _list(data.get("skipped")) if isinstance(s, dict)]


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _json(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError, RecursionError):
        raise DiskError(f"backend.kit.disk answered no JSON: {clean(text[-200:])!r}") from None
    if not isinstance(data, dict):
        raise DiskError("backend.kit.disk: expected a JSON object")
    return data


async def _backend_disk(host: Host, profile: Profile, args: list[str], *, readonly: bool,
                        sudo: bool = False) -> dict[str, Any]:
    if readonly:
        from console.control.launch import backend_bundle
        code_dir = f"{profile.paths.work_dir}/code/{backend_bundle()[0]}"
        if not (await host.run(["test", "-f", f"{code_dir}/.complete"], timeout=30)).ok:
            raise DiskError("read-only: the stage programs are not on the host yet (they are uploaded when a "
                            "stage starts), so the sizes cannot be read without changing the host")
    else:
        code_dir = await ensure_backend(host, profile, [])
    argv = ["env", f"PYTHONPATH={code_dir}", profile.paths.python, "-m", "backend.kit.disk", *args,
            "--work-dir", profile.paths.work_dir]
    if sudo:
        argv = ["sudo", "-n", *argv]
    res = await host.run(argv, timeout=DISK_TIMEOUT_S)
    if not res.ok:
        raise DiskError(f"backend.kit.disk failed: {clean((res.stderr or res.stdout).strip()[-300:])}")
    return _json(res.stdout)


def parse_survey(data: dict[str, Any]) -> DiskReport:
    """Pure: `backend.kit.disk survey`'s answer (untrusted): what does not read is left out and said."""
    skipped = _skipped(data)
    vols = []
    for v in _list(data.get("volumes")):
        try:
            vols.append(VolumeSpace(clean(str(v.get("path")))[:300], int(_num(v.get("free"), "volume free")),
                                    int(_num(v.get("total"), "volume total"))))
        except (AttributeError, DiskError) as e:
            skipped.append(f"a volume left out: {e}")
    runs = _runs(data.get("runs"), skipped)
    return DiskReport(tuple(vols), runs, tuple(skipped))


async def survey(host: Host, profile: Profile, *, readonly: bool = False) -> DiskReport:
    return parse_survey(await _backend_disk(host, profile, ["survey"], readonly=readonly))


def selection_args(*, running: Iterable[str], older_than_s: float | None, stage: str | None,
                   archived: bool, resumable: bool = False) -> list[str]:
    args: list[str] = []
    for run_id in running:
        args += ["--running", run_id]
    if older_than_s is not None:
        args += ["--older-than", repr(older_than_s)]
    if stage:
        args += ["--stage", stage]
    if archived:
        args.append("--archived")
    if resumable:
        args.append("--resumable")
    return args


async def prune(host: Host, profile: Profile, selection: list[str], *, only: Iterable[str] | None = None) -> PrunePlan:
    """The plan for `selection` (selection_args); with `only`, deletes those of its runs. The delete runs
    as the stages do: through `sudo -n` where the profile says sudo (its stages run as root, so their run
    directories are root's), else as the SSH user."""
    args = ["prune", *selection]
    if only is not None:
        args.append("--delete")
        for name in only:
            args += ["--only", name]
    data = await _backend_disk(host, profile, args, readonly=False, sudo=only is not None and profile.server.sudo)
    return parse_plan(data)


def parse_plan(data: dict[str, Any]) -> PrunePlan:
    """Pure: `backend.kit.disk prune`'s answer (untrusted): an entry that does not read is left out and said,
    and never deleted (a deletion names only the runs read here)."""
    skipped = _skipped(data)
    keep = _runs(data.get("keep"), skipped)
    delete = _runs(data.get("delete"), skipped)
    results = []
    for d in _list(data.get("results")):
        if isinstance(d, dict) and isinstance(d.get("name"), str):
            results.append(Deletion(clean(d["name"])[:200], d.get("deleted") is True,
                                    clean(str(d.get("reason") or ""))[:500]))
    # the total of the runs shown (and asked for), not the host's number: an entry left out is not in it
    return PrunePlan(delete=delete, keep=keep, total_bytes=sum(r.size for r in delete),
                     deleted=tuple(r.name for r in results if r.deleted), results=tuple(results),
                     skipped=tuple(skipped))
