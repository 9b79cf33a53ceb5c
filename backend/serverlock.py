"""The host's one lock on the servers: held by every program that stops or starts a server.

Two programs that switch servers at once would interleave their stops and starts (one extract's
"start the baseline" landing in the middle of a bench's drafter load), and two pipelines checked by the
console one after the other both see "nothing running" before either starts. The check therefore lives
on the host, as an exclusive `flock` on `<work dir>/state/servers.lock`, taken before the first stop and
held until the program exits; the second program is refused at once with the holder's name.

The lock file holds who took it (`{"holder": ..., "pid": ..., "since": ...}`) for that message. A parent
that holds the lock (the pipeline) passes it to its stage programs: the open descriptor is inherited and
its number is in E3_SERVER_LOCK_FD, so a child checks the descriptor is that very file and goes on.
The kernel drops the lock when the last holder exits, also after a kill -9: nothing stale to clean.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from typing import Any

LOCK_FD_ENV = "E3_SERVER_LOCK_FD"
LOCK_NAME = "servers.lock"
HOLDER_MAX = 4096  # bytes of the holder record read back (the file is the host's, but bounded anyway)


class LockHeld(Exception):
    """Another program switches the servers now; the message names it."""


def lock_path(work_dir: str) -> str:
    return os.path.join(work_dir, "state", LOCK_NAME)


def read_holder(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(HOLDER_MAX).decode(errors="replace") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe_holder(holder: dict[str, Any]) -> str:
    name = str(holder.get("holder") or "another program")[:200]
    pid = holder.get("pid")
    since = holder.get("since")
    when = ""
    if isinstance(since, (int, float)) and not isinstance(since, bool):
        when = f", since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(since))}"
    return f"{name}" + (f" (pid {pid}{when})" if isinstance(pid, int) else "")


class ServerLock:
    """`acquire()` or LockHeld; `release()` (also on exit, by the kernel). `holder` says who, e.g.
    "extract run extract-1"."""

    def __init__(self, path: str, holder: str):
        self.path = path
        self.holder = holder
        self.fd = -1
        self.inherited = False

    @property
    def held(self) -> bool:
        return self.fd >= 0

    def _inherited_fd(self) -> int:
        text = os.environ.get(LOCK_FD_ENV, "")
        if not text.isdigit():
            return -1
        fd = int(text)
        try:
            mine, there = os.fstat(fd), os.stat(self.path)
        except OSError:
            return -1
        return fd if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino) else -1

    def acquire(self) -> "ServerLock":
        if self.held:
            return self
        fd = self._inherited_fd()
        if fd >= 0:  # the parent (a pipeline) holds it for us
            self.fd, self.inherited = fd, True
            return self
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockHeld(f"the servers are being switched by {describe_holder(read_holder(self.path))}: "
                           f"one program at a time stops or starts a server; wait for it to finish, or stop "
                           f"it first (lock {self.path})") from None
        except OSError:
            os.close(fd)
            raise
        record = json.dumps({"holder": self.holder, "pid": os.getpid(), "since": round(time.time(), 3)}).encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        except OSError:
            pass  # a full disk: the lock still holds, only its holder's name is missing
        self.fd = fd
        return self

    def child_env(self) -> dict[str, str]:
        """The environment that hands the lock to a child (with `pass_fds=self.pass_fds()`)."""
        return {LOCK_FD_ENV: str(self.fd)} if self.held else {}

    def pass_fds(self) -> tuple[int, ...]:
        return (self.fd,) if self.held else ()

    def release(self) -> None:
        if not self.held:
            return
        if not self.inherited:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)  # closing the last descriptor drops the flock
        self.fd, self.inherited = -1, False

    def __enter__(self) -> "ServerLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
