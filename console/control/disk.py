"""Disk on the host, from the console: the survey (volumes, each run's size) and the prune, both by
`python -m backend.disk` on the host (the one place that decides which runs are protected: a running
run, the input of a running run, the newest completed run of each stage).

The prune is two calls: the plan (nothing deleted), shown to the operator with its total; then, once
agreed, the delete of exactly the runs shown, which the host plans again at that moment, so a run that
started meanwhile is still kept.
"""
from __future__ import annotations

import json
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


@dataclass(frozen=True)
class VolumeSpace:
    path: str
    free: int
    total: int


@dataclass(frozen=True)
class DiskReport:
    volumes: tuple[VolumeSpace, ...]
    runs: tuple[RunSpace, ...]


@dataclass(frozen=True)
class PrunePlan:
    delete: tuple[RunSpace, ...]
    keep: tuple[RunSpace, ...]
    total_bytes: int
    deleted: tuple[str, ...] = ()


def _num(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DiskError(f"backend.disk: expected a number, got {type(v).__name__}")
    return v


def _run(d: Any) -> RunSpace:
    if not isinstance(d, dict):
        raise DiskError("backend.disk: a run entry is not an object")
    stage = d.get("stage")
    reason = d.get("reason")
    return RunSpace(name=clean(str(d.get("name", ""))), run_id=clean(str(d.get("run_id", ""))),
                    stage=clean(stage) if isinstance(stage, str) else None, state=clean(str(d.get("state", ""))),
                    size=int(_num(d.get("size"))), mtime=float(_num(d.get("mtime"))),
                    archived=bool(d.get("archived")), reason=clean(reason) if isinstance(reason, str) else None)


def _json(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DiskError(f"backend.disk answered no JSON: {clean(text[-200:])!r}") from None
    if not isinstance(data, dict):
        raise DiskError("backend.disk: expected a JSON object")
    return data


async def _backend_disk(host: Host, profile: Profile, args: list[str], *, readonly: bool) -> dict[str, Any]:
    if readonly:
        from console.control.launch import backend_bundle
        code_dir = f"{profile.paths.work_dir}/code/{backend_bundle()[0]}"
        if not (await host.run(["test", "-f", f"{code_dir}/.complete"], timeout=30)).ok:
            raise DiskError("read-only: the stage programs are not on the host yet (they are uploaded when a "
                            "stage starts), so the sizes cannot be read without changing the host")
    else:
        code_dir = await ensure_backend(host, profile, [])
    argv = ["env", f"PYTHONPATH={code_dir}", profile.paths.python, "-m", "backend.disk", *args,
            "--work-dir", profile.paths.work_dir]
    res = await host.run(argv, timeout=DISK_TIMEOUT_S)
    if not res.ok:
        raise DiskError(f"backend.disk failed: {clean((res.stderr or res.stdout).strip()[-300:])}")
    return _json(res.stdout)


async def survey(host: Host, profile: Profile, *, readonly: bool = False) -> DiskReport:
    data = await _backend_disk(host, profile, ["survey"], readonly=readonly)
    vols = tuple(VolumeSpace(clean(str(v.get("path"))), int(_num(v.get("free"))), int(_num(v.get("total"))))
                 for v in data.get("volumes", []) if isinstance(v, dict))
    return DiskReport(vols, tuple(_run(r) for r in data.get("runs", [])))


def selection_args(*, running: Iterable[str], older_than_s: float | None, stage: str | None,
                   archived: bool) -> list[str]:
    args: list[str] = []
    for run_id in running:
        args += ["--running", run_id]
    if older_than_s is not None:
        args += ["--older-than", repr(older_than_s)]
    if stage:
        args += ["--stage", stage]
    if archived:
        args.append("--archived")
    return args


async def prune(host: Host, profile: Profile, selection: list[str], *, only: Iterable[str] | None = None) -> PrunePlan:
    """The plan for `selection` (selection_args); with `only`, deletes those of its runs."""
    args = ["prune", *selection]
    if only is not None:
        args.append("--delete")
        for name in only:
            args += ["--only", name]
    data = await _backend_disk(host, profile, args, readonly=False)
    keep = tuple(_run(r) for r in data.get("keep", []))
    deleted = tuple(clean(str(n)) for n in data.get("deleted", []) if isinstance(n, str))
    return PrunePlan(delete=tuple(_run(r) for r in data.get("delete", [])), keep=keep,
                     total_bytes=int(_num(data.get("total_bytes", 0))), deleted=deleted)
