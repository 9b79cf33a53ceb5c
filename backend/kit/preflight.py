"""Checks before a stage touches anything, shared by every stage (each adds its own on top):

- the report: named checks, each ok or failed with `fix`, the exact thing the operator should do; printed
  as JSON by `--preflight-only` and kept in a failed run's summary. A check added with `warn` is said but
  never refuses (two vLLM installs, an old driver: the host's integrity, backend/kit/hostfacts.check_host);
- python modules: the host's python has what the stage imports, else the install command;
- free space on the volume a path is on, and the check of it;
- the offline environment of the stages that read the verifier and datasets (never reach a hub).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False  # failed, it is said (with its fix) but the report stays ok


@dataclass
class PreflightReport:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok or c.warning for c in self.checks)

    def add(self, name: str, ok: bool, detail: str, fix: str = "") -> Check:
        check = Check(name, ok, detail, "" if ok else fix)
        self.checks.append(check)
        return check

    def warn(self, name: str, ok: bool, detail: str, fix: str = "") -> Check:
        """A check that warns when it fails and never refuses."""
        check = Check(name, ok, detail, "" if ok else fix, warning=True)
        self.checks.append(check)
        return check

    def warnings(self) -> list[str]:
        return [f"{c.name}: {c.detail} -> {c.fix}" for c in self.checks if not c.ok and c.warning]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [asdict(c) for c in self.checks]}

    def failures(self) -> str:
        return "; ".join(f"{c.name}: {c.detail} -> {c.fix}" for c in self.checks if not c.ok and not c.warning)


def check_modules(report: PreflightReport, modules: tuple[str, ...], install: str | None = None) -> None:
    """`python_modules`: every one importable by this python; else the command that installs them."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    report.add("python_modules", not missing,
               f"{sys.executable} has {', '.join(modules)}" if not missing
               else f"{sys.executable} lacks {', '.join(missing)}",
               f"{sys.executable} -m {install or 'pip install ' + ' '.join(missing)}")


def free_bytes(path: str) -> int:
    """Free bytes on the volume that holds `path` (or its nearest existing parent)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return shutil.disk_usage(probe).free


def check_disk(report: PreflightReport, path: str, need: int, *, what: str, fix: str,
               work_dir: str | None = None, uses: Iterable[str] = ()) -> None:
    """`disk_space`: `need` bytes free on the volume of `path`, for `what` the stage writes; `fix` says how
    else (after "free N there, "); with `work_dir`, which old runs would make room: never the run `path`
    lies in (it may be the one resuming) nor what it `uses` (its input runs, by id or path)."""
    free = free_bytes(path)
    hint = room_hint_for(work_dir, need - free, run_id=run_of_path(work_dir, path), uses=uses) \
        if work_dir and free < need else ""
    report.add("disk_space", free >= need,
               f"{human_bytes(free)} free on the volume of {path}; {what} may need up to {human_bytes(need)}",
               f"free {human_bytes(max(0, need - free))} there, {fix}{hint}")


def run_of_path(work_dir: str, path: str) -> str | None:
    """The run id whose directory `path` is or lies in (`<work dir>/runs/<run id>/...`), or None."""
    rel = os.path.relpath(os.path.abspath(path), os.path.join(os.path.abspath(work_dir), "runs"))
    first = rel.split(os.sep)[0]
    return None if rel.startswith("..") or first in ("", ".") else first


def room_hint_for(work_dir: str, short: int, *, run_id: str | None = None, uses: Iterable[str] = ()) -> str:
    """The old runs whose removal would make room (backend/kit/disk.py), or '': never `run_id` or its `uses`."""
    from backend.kit.disk import room_hint  # imported late: it reads run directories, this module is imported early
    try:
        return room_hint(work_dir, short, run_id=run_id, uses=uses)
    except Exception:  # noqa: BLE001 - a hint must never break the preflight it decorates
        return ""


def human_bytes(n: float) -> str:
    """1536 -> "1.5 KiB": whole bytes below 1 KiB, else one decimal in the largest unit that is >= 1."""
    if n < 1024:
        return f"{max(0, int(n))} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} PiB"


def offline_env(datasets_cache: str | None = None) -> None:
    """Before datasets/transformers are imported: never reach a hub (the verifier is a local directory);
    `datasets_cache`: keep datasets' cache of row files there (inside the run directory), not in the home
    directory. Progress bars redrawn with \\r are noise in a log file: the stages report in events.jsonl."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if datasets_cache:
        os.environ.setdefault("HF_DATASETS_CACHE", datasets_cache)
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
