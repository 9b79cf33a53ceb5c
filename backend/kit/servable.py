"""Which drafter checkpoint the drafter server may load: a verified one.

`python -m backend.ask servable --work-dir W [--run RUN]` (backend/ask.py) prints `{"run_id", "stage",
"checkpoint"}` as one JSON line, or says on stderr why there is none (exit 2). RUN may be a verify run (its
checkpoint, which it verified: a verify run completes only when every check passed) or a train run (its best checkpoint, when
a completed verify run verified that same checkpoint). Without RUN: the latest completed verify run of a
train run's own checkpoint (a published drafter verified with `--checkpoint` is never served by default).
`--third`: the published drafter the latest completed fetch-drafter run left, once a verify run verified it
(the bench's third contender). The console asks the host (where the runs are) rather than guess a path.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from backend.contract.lookup import InputError, completed_run, latest_completed
from backend.contract.runs import RunDirError, read_manifest, run_path
from backend.contract.stages import FETCH_DRAFTER as FETCH_STAGE


@dataclass(frozen=True)
class Servable:
    run_id: str  # the verify run that vouches for the checkpoint
    stage: str  # the stage of the run that was named ("verify" or "train")
    checkpoint: str


def _verified(work_dir: str, checkpoint: str) -> str | None:
    """The latest completed verify run of `checkpoint`, if any."""
    runs_dir = os.path.join(os.path.abspath(work_dir), "runs")
    found: list[tuple[float, str]] = []
    for name in os.listdir(runs_dir) if os.path.isdir(runs_dir) else ():
        try:
            run = completed_run(work_dir, name, "verify")
        except RunDirError:
            continue
        if os.path.realpath(run.outputs.get("checkpoint", "")) == os.path.realpath(checkpoint):
            found.append((os.path.getmtime(os.path.join(run.path, "summary.json")), name))
    return max(found)[1] if found else None


def servable(work_dir: str, run_id: str | None = None) -> Servable:
    """The checkpoint to serve, or an InputError saying why there is none and what to run."""
    if run_id is None:
        try:
            run = latest_completed(work_dir, "verify", where=lambda r: not r.summary.get("external_checkpoint"))
        except InputError:
            raise InputError("no verified drafter: no completed verify run in "
                             f"{os.path.join(os.path.abspath(work_dir), 'runs')}; run `verify` first "
                             "(or name a verify run with --input)") from None
        return Servable(run.run_id, "verify", run.output("checkpoint"))
    manifest = read_manifest(run_path(work_dir, run_id)) if os.path.isdir(run_path(work_dir, run_id)) else None
    stage = manifest.stage if manifest else "verify"
    if stage not in ("verify", "train"):
        raise InputError(f"run {run_id!r} is a {stage} run: name a verify run (or a train run it verified)")
    run = completed_run(work_dir, run_id, stage)
    checkpoint = run.output("checkpoint")
    if stage == "verify":
        return Servable(run.run_id, "verify", checkpoint)
    verify = _verified(work_dir, checkpoint)
    if verify is None:
        raise InputError(f"train run {run_id}'s checkpoint {checkpoint} has not been verified: run "
                         f"`verify --input {run_id}` first")
    return Servable(verify, "train", checkpoint)


def third(work_dir: str) -> Servable:
    """The published drafter to bench beside ours: the latest fetch-drafter run's checkpoint, verified."""
    try:
        fetched = latest_completed(work_dir, FETCH_STAGE)
    except InputError:
        raise InputError("no published drafter fetched: run `fetch-drafter` first (it downloads "
                         "[bench].third_drafter)") from None
    checkpoint = fetched.output("checkpoint")
    verify = _verified(work_dir, checkpoint)
    if verify is None:
        raise InputError(f"the published drafter {checkpoint} (fetch run {fetched.run_id}) has not been verified: "
                         f"run `verify --checkpoint {checkpoint}` first")
    return Servable(verify, FETCH_STAGE, checkpoint)
