"""torchrun, tied to the train stage that starts it, and its ranks tied to torchrun.

Nothing else ties them: a train stage killed with SIGKILL (a kill -9, the OOM killer, tmux's session
killed) left torchrun and its ranks training on, holding the GPUs and writing the run a resume then
writes too. The kernel's parent-death signal (prctl PR_SET_PDEATHSIG) ties each child to its parent: when
the stage dies torchrun gets SIGTERM, which it forwards to its ranks (they save a resumable checkpoint and
exit; torchrun kills them after 30 s); when torchrun dies its ranks get SIGTERM themselves.

`python -m backend.train.launch TORCHRUN-ARGS...` is torchrun (torch.distributed.run) with the tie made
first. The stage passes its run lock's descriptor to it (backend/kit/runlock.py), so the run stays locked
until torchrun, which outlives its ranks, has exited.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "E3_TRAIN_PARENT_PID"  # the pid the process started expects as its parent
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """`sig` to this process when its parent (the pid in E3_TRAIN_PARENT_PID) dies; at once when it is
    already gone (it died between the fork and here). No-op without the variable (run by hand)."""
    text = os.environ.get(PARENT_ENV, "")
    if not text.isdigit():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != int(text):
        os.kill(os.getpid(), sig)


def main(argv: list[str]) -> None:
    die_with_parent()
    os.environ[PARENT_ENV] = str(os.getpid())  # the ranks torchrun starts are tied to it in turn
    from torch.distributed.run import main as torchrun

    torchrun(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
