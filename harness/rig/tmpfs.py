"""A small tmpfs for the full-disk tests: a volume that fills up for real (root only)."""
from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from harness.rig.availability import rig_unavailable


@contextmanager
def small_tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """`mnt` (created here) on its own tmpfs of `size` (mount's size=, e.g. 64k or 64m)."""
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        rig_unavailable(f"cannot mount a small tmpfs for the full-disk test (needs root): {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
