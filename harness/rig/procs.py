"""Process-tree helpers over /proc, so the rigs kill only what they started (never by name)."""
from __future__ import annotations

import os
import signal
from pathlib import Path


def parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[1])


def descendants(root_pid: int) -> list[int]:
    """All live descendants of `root_pid`, children first-found order (not including root_pid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = parent_pid(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [root_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
