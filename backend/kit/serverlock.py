"""The host's one lock on the servers: held by every program that stops or starts a server.

Two programs that switch servers at once would interleave their stops and starts (one extract's
"start the baseline" landing in the middle of a bench's drafter load), and two pipelines checked by the
console one after the other both see "nothing running" before either starts. The check therefore lives
on the host, as an exclusive `flock` on `<work dir>/state/servers.lock`, taken before the first stop and
held until the program exits; the second program is refused at once with the holder's name.

The lock itself (the holder record, the hand-over to children, the kernel dropping it after a kill -9) is
backend/kit/hostlock.py's; a parent that holds it (the pipeline) passes it to its stage programs through
E3_SERVER_LOCK_FD.
"""
from __future__ import annotations

import os

from backend.kit.hostlock import HostLock, LockHeld, describe_holder, read_holder

__all__ = ["LOCK_FD_ENV", "LOCK_NAME", "LockHeld", "ServerLock", "describe_holder", "lock_path", "read_holder"]

LOCK_FD_ENV = "E3_SERVER_LOCK_FD"
LOCK_NAME = "servers.lock"


def lock_path(work_dir: str) -> str:
    return os.path.join(work_dir, "state", LOCK_NAME)


class ServerLock(HostLock):
    """The server lock; `holder` says who, e.g. "extract run extract-1"."""

    fd_env = LOCK_FD_ENV

    def refusal(self, holder: str) -> str:
        return (f"the servers are being switched by {holder}: one program at a time stops or starts a server; "
                f"wait for it to finish, or stop it first (lock {self.path})")

    def acquire(self) -> "ServerLock":
        super().acquire()
        return self

    def __enter__(self) -> "ServerLock":
        return self.acquire()
