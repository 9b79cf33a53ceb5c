"""The run directory contract shared by stage programs: `<work dir>/runs/<run id>/`.

Holds `manifest.json` (what the run is: its identity and a hash of it), the stage's output,
`events.jsonl` (backend/contract/events.py) and `summary.json`. A restart into the same directory resumes only
when the identity is unchanged; otherwise it is refused, or with `fresh` the old directory is archived
(renamed, never deleted) and a new one started.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from backend.contract.events import EVENTS_FILE

MANIFEST_FILE = "manifest.json"
SUMMARY_FILE = "summary.json"
# A run id also names the run's unit (`e3-<stage>-<run id>`: a systemd unit or a tmux session), so it
# holds nothing either treats specially (no dots, colons or '#'). The one definition, for both sides.
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
UNIT_PREFIX = "e3-"
_STAGE_NAME = re.compile(r"[a-z][a-z0-9_]*")  # stage names hold no '-': the first one after the prefix ends it


def stage_unit_name(stage: str, run_id: str) -> str:
    """The systemd unit or tmux session of a stage run (the run id rule keeps it a valid name)."""
    return f"{UNIT_PREFIX}{stage}-{run_id}"


def unit_run(name: str) -> tuple[str, str] | None:
    """(stage, run id) of a `stage_unit_name` (a `.service` suffix allowed), or None: read on the host by
    backend/kit/disk.py, which keeps the run of every live unit or session whoever started it."""
    name = name.removesuffix(".service")
    if not name.startswith(UNIT_PREFIX):
        return None
    stage, sep, run_id = name[len(UNIT_PREFIX):].partition("-")
    if not sep or not _STAGE_NAME.fullmatch(stage) or not RUN_ID_PATTERN.fullmatch(run_id):
        return None
    return stage, run_id


class RunDirError(Exception):
    """The run directory cannot be used as asked; the message says what to do."""


class ManifestMismatch(RunDirError):
    def __init__(self, run_dir: str, differences: list[str]):
        self.run_dir = run_dir
        self.differences = differences
        super().__init__(
            f"{run_dir} holds a different run ({'; '.join(differences)}). Resume only continues the "
            f"same run: pass the same settings, choose another --run-id, or pass --fresh to archive "
            f"the old directory and start over."
        )


@dataclass
class Manifest:
    stage: str
    run_id: str
    identity: dict[str, Any]  # everything that makes two runs the same run (dataset, model, sampling...)
    config_hash: str = ""
    created: float = field(default_factory=time.time)
    settings: dict[str, Any] = field(default_factory=dict)  # informational (concurrency, timeouts)

    def __post_init__(self) -> None:
        if not self.config_hash:
            self.config_hash = config_hash(self.identity)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Manifest":
        if not isinstance(data, dict) or not isinstance(data.get("identity"), dict):
            raise RunDirError("manifest.json is not a manifest (no `identity` object)")
        return cls(stage=str(data.get("stage", "")), run_id=str(data.get("run_id", "")),
                   identity=data["identity"], config_hash=str(data.get("config_hash", "")),
                   created=float(data.get("created", 0.0)), settings=dict(data.get("settings") or {}))


def config_hash(identity: dict[str, Any]) -> str:
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def compare_manifests(old: Manifest, new: Manifest) -> list[str]:
    """Human-readable differences between two runs' identities (empty: same run)."""
    diffs: list[str] = []
    if old.stage != new.stage:
        diffs.append(f"stage was {old.stage!r}, now {new.stage!r}")
    for key in sorted(set(old.identity) | set(new.identity)):
        a, b = old.identity.get(key), new.identity.get(key)
        if a != b:
            diffs.append(f"{key} was {_short(a)}, now {_short(b)}")
    return diffs


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


class _NonFinite(str):
    """NaN, Infinity or a number that overflows a float, as written in the file (to name it)."""


def _finite_float(text: str) -> float | str:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _non_finite_key(data: Any, where: str = "") -> tuple[str, str] | None:
    if isinstance(data, _NonFinite):
        return where or "(top level)", str(data)
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = _non_finite_key(value, f"{where}.{key}" if isinstance(key, str) and where else
                                f"{where}[{key}]" if isinstance(key, int) else str(key))
        if found:
            return found
    return None


def read_json_object(path: str, error: type[Exception], missing: str) -> dict[str, Any]:
    """A JSON object from `path`, or `error` saying what is wrong with it (`missing` when it is absent).

    Every number in it is finite: a plan or a config with NaN or 1e999 (a timeout that never ends, a
    learning rate of nan) is refused naming the key, as a profile is."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f, parse_float=_finite_float, parse_constant=_NonFinite)
    except FileNotFoundError:
        raise error(missing) from None
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:
        raise error(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise error(f"{path} is not a JSON object")
    bad = _non_finite_key(data)
    if bad is not None:
        raise error(f"{path}: {bad[0]}: expected a finite number, got {bad[1]}")
    return data


def write_json_atomic(path: str, data: Any) -> None:
    """Write via a temp file + fsync + rename so a reader never sees half a JSON document."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # a full disk fails the write or the fsync: the half-written temp file must not stay behind,
        # holding the very space the run's last events need
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(os.path.dirname(path) or ".")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RunDir:
    path: str
    manifest: Manifest
    resumed: bool  # True when the directory already held this run
    archived: str | None = None  # where --fresh moved the previous directory

    @property
    def manifest_path(self) -> str:
        return os.path.join(self.path, MANIFEST_FILE)

    @property
    def events_path(self) -> str:
        return os.path.join(self.path, EVENTS_FILE)

    @property
    def summary_path(self) -> str:
        return os.path.join(self.path, SUMMARY_FILE)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.summary_path, summary)


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id):
        raise RunDirError(f"run id {run_id!r}: expected letters, digits, '_' and '-' (at most 64), "
                          "starting with a letter or digit")
    return run_id


def run_path(work_dir: str, run_id: str) -> str:
    check_run_id(run_id)
    return os.path.join(os.path.abspath(work_dir), "runs", run_id)


def read_manifest(path: str) -> Manifest | None:
    name = os.path.join(path, MANIFEST_FILE)
    if not os.path.exists(name):
        return None
    try:
        with open(name, encoding="utf-8") as f:
            return Manifest.from_dict(json.load(f))
    except ValueError as exc:
        raise RunDirError(f"{name} is not valid JSON ({exc}); inspect it, or pass --fresh to archive "
                          f"the directory and start over") from exc


def archive(path: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = f"{path}.archived-{stamp}"
    n = 1
    while os.path.exists(target):
        n += 1
        target = f"{path}.archived-{stamp}-{n}"
    os.rename(path, target)
    return target


def open_run_dir(work_dir: str, run_id: str, manifest: Manifest, *, fresh: bool = False) -> RunDir:
    """Create, resume, or (with `fresh`) archive-and-recreate the run directory for `manifest`."""
    path = run_path(work_dir, run_id)
    archived = None
    if os.path.isdir(path):
        old = read_manifest(path) if not fresh else None
        if fresh:
            archived = archive(path)
        elif old is None:
            if os.listdir(path):
                raise RunDirError(f"{path} exists and is not empty but has no {MANIFEST_FILE}; move it "
                                  f"away, choose another --run-id, or pass --fresh to archive it")
        else:
            diffs = compare_manifests(old, manifest)
            if diffs:
                raise ManifestMismatch(path, diffs)
            return RunDir(path=path, manifest=old, resumed=True)
    elif os.path.exists(path):
        raise RunDirError(f"{path} exists and is not a directory")
    os.makedirs(path, exist_ok=True)
    write_json_atomic(os.path.join(path, MANIFEST_FILE), manifest.to_dict())
    return RunDir(path=path, manifest=manifest, resumed=False, archived=archived)
