"""An exclusive host lock held for a program's life: a kernel `flock` on a file that names its holder.

Two locks are built on it: the host's server lock (backend/kit/serverlock.py) and one lock per run directory
(backend/kit/runlock.py). The second program that asks is refused at once, with the holder's name read back
from the file (`{"holder": ..., "pid": ..., "since": ...}`).

A parent that holds a lock passes it to its children: the open descriptor is inherited (`pass_fds`), and
its number is in the lock's environment variable, so a child that asks for the same lock checks the
descriptor is that very file and goes on. A child that only works for the parent (torchrun and its
ranks) just keeps the descriptor open: flock locks belong to the open file description, shared across
fork and exec, so the lock holds until the last process that has it exits. The kernel drops it then, also
after a kill -9: nothing stale to clean.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from typing import Any

HOLDER_MAX = 4096  # bytes of the holder record read back (the file is the host's, but bounded anyway)


class LockHeld(Exception):
    """Another program holds the lock; the message names it."""


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


class HostLock:
    """`acquire()` or LockHeld; `release()` (also on exit, by the kernel). `holder` says who, e.g.
    "extract run extract-1". Subclasses name the environment variable that hands the lock to a child
    (`fd_env`) and say what a refusal means (`refusal`)."""

    fd_env = ""

    def __init__(self, path: str, holder: str):
        self.path = path
        self.holder = holder
        self.fd = -1
        self.inherited = False
        self._made: list[str] = []  # the lock file and folders its acquire created

    @property
    def held(self) -> bool:
        return self.fd >= 0

    def refusal(self, holder: str) -> str:
        return f"{self.path} is held by {holder}"

    def _inherited_fd(self) -> int:
        text = os.environ.get(self.fd_env, "") if self.fd_env else ""
        if not text.isdigit():
            return -1
        fd = int(text)
        try:
            mine, there = os.fstat(fd), os.stat(self.path)
        except OSError:
            return -1
        return fd if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino) else -1

    def acquire(self) -> "HostLock":
        if self.held:
            return self
        fd = self._inherited_fd()
        if fd >= 0:  # the parent holds it for us
            self.fd, self.inherited = fd, True
            return self
        for _ in range(8):
            fd = self._open_locked()
            if fd >= 0:
                break
        else:
            raise OSError(f"the lock file {self.path} kept being replaced while it was taken")
        record = json.dumps({"holder": self.holder, "pid": os.getpid(), "since": round(time.time(), 3)}).encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        except OSError:
            pass  # a full disk: the lock still holds, only its holder's name is missing
        self.fd = fd
        return self

    def _open_locked(self) -> int:
        """The lock file's descriptor, locked; -1 when the file was removed or replaced meanwhile (a refused
        holder forgets its lock, `release(forget=True)`): a lock on an unlinked file would guard nothing."""
        missing = []
        parent = os.path.dirname(self.path) or "."
        while parent and not os.path.isdir(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            created = True
        except FileExistsError:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            created = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockHeld(self.refusal(describe_holder(read_holder(self.path)))) from None
        except OSError:
            os.close(fd)
            raise
        try:
            same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            return -1
        self._made = ([self.path] if created else []) + missing  # what forgetting it removes, deepest first
        return fd

    def child_env(self) -> dict[str, str]:
        """The environment that hands the lock to a child (with `pass_fds=self.pass_fds()`)."""
        return {self.fd_env: str(self.fd)} if self.held and self.fd_env else {}

    def pass_fds(self) -> tuple[int, ...]:
        return (self.fd,) if self.held else ()

    def release(self, forget: bool = False) -> None:
        """Let go. `forget`: the holder was refused before it touched anything (no child has the lock):
        the lock file and the folders its acquire created go too, so a refusal leaves nothing behind."""
        if not self.held:
            return
        if forget and not self.inherited:
            for path in self._made:
                try:
                    os.unlink(path) if path == self.path else os.rmdir(path)
                except OSError:
                    break  # another lock's file in the folder, or another program's: leave the rest
        if not self.inherited:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)  # closing our descriptor drops the flock once no child holds it either
        self.fd, self.inherited = -1, False

    def __enter__(self) -> "HostLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
