"""One lock per run directory: one program at a time writes a run.

Two programs started on one run id (a second `run train --run-id X` while the first still trains, a
resume typed while the old process is still saving) would interleave their events, both write
checkpoints and both repair a half-finished save. The lifecycle (backend/kit/lifecycle.py) therefore takes
this lock before it opens (or archives, with --fresh) the run directory and holds it for the program's
life; the second program is refused (exit 2, nothing touched) with the holder's name, pid and start.

The lock file lives outside the run directory, `<work dir>/state/runs/<run id>.lock`, so archiving the
directory (--fresh) never moves the lock of the run being started. Workers that write the run for its
program (torchrun and its ranks) inherit the descriptor, so a resume waits for them too.
"""
from __future__ import annotations

import os

from backend.contract.runs import check_run_id
from backend.kit.hostlock import HostLock

LOCK_FD_ENV = "E3_RUN_LOCK_FD"


def run_lock_path(work_dir: str, run_id: str) -> str:
    return os.path.join(os.path.abspath(work_dir), "state", "runs", f"{check_run_id(run_id)}.lock")


class RunLock(HostLock):
    """The lock of run `run_id`; `holder` says who, e.g. "train run train-1"."""

    fd_env = LOCK_FD_ENV

    def __init__(self, work_dir: str, run_id: str, holder: str):
        super().__init__(run_lock_path(work_dir, run_id), holder)
        self.run_id = run_id

    def refusal(self, holder: str) -> str:
        return (f"run {self.run_id} is in use by {holder}: one program at a time writes a run directory; "
                f"wait for it to finish, stop it (eagle3-console run stop --run-id {self.run_id}), or choose "
                f"another --run-id (lock {self.path})")
