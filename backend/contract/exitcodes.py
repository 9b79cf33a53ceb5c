"""The exit codes of every host program, defined once (backend/kit/lifecycle.py applies them).

The console and scripts read them: a stop is not a failure (the run resumes when started again), and a
refusal (2) promises that nothing was created or changed.
"""
from __future__ import annotations

COMPLETED = 0  # completed, or stopped by SIGTERM/SIGINT (the summary and finish event say which)
FAILED = 1  # the run failed: its summary and finish event say why
BAD_INPUT = 2  # unusable arguments or input: one line on stderr, nothing created
SLOWER = 3  # a bench that completed and found the drafter slower than the baseline

STATUSES = ("completed", "stopped", "failed")


def for_status(status: str, *, slower: bool = False) -> int:
    """The exit code of a run that ended with `status` (a finish event's status)."""
    if status == "failed":
        return FAILED
    if status == "completed" and slower:
        return SLOWER
    if status in ("completed", "stopped"):
        return COMPLETED
    return FAILED
