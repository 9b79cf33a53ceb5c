"""What every worker of one test run shares (the test command runs pytest-xdist workers): a directory they
all see, and a lock under which the first worker builds a costly thing and the others wait, then read it.

Only for builds that no test changes (the trained drafters); a session fixture that owns a running
program (a rig, a demo host) keeps its tests on one worker instead (tests/conftest.py)."""
from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def run_root(tmp_path_factory) -> Path:
    """The workers' base temp dirs are siblings under the run's own (pytest-xdist); alone, the session's."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def held(lock: Path) -> Iterator[None]:
    """An exclusive kernel lock on `lock` while the block runs (released if the worker dies)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


class FixedTemp:
    """The two calls of tmp_path_factory the harness's builders make, at one fixed directory: what they
    build there is found again by the next worker."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def getbasetemp(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root

    def mktemp(self, name: str, numbered: bool = True) -> Path:
        path = self.getbasetemp() / name
        path.mkdir(exist_ok=True)
        return path
