"""The train stage's torchrun and its ranks die with the stage (backend/train/launch.py), and hold its run
lock (backend/kit/runlock.py) until they are gone: a kill -9 of the stage (tmux's session killed, the OOM
killer) leaves no rank training on, and a resume started afterwards is refused until the last one exits.

Real processes: the stage with two CPU ranks under torchrun (simulated GPUs, the demo host's way), the
tiny verifier; the ranks are killed while they build the model or train, whichever comes first.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from backend.kit.hostlock import LockHeld
from backend.kit.runlock import RunLock
from harness import train_support as ts

pytestmark = pytest.mark.timeout(300)


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def holders(path: str) -> list[str]:
    """The processes that have `path` open (what keeps a lock held), for the failure message."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") == path for fd in os.listdir(f"/proc/{entry}/fd")):
                found.append(f"{entry}: {cmdline(int(entry))[:200]}")
        except OSError:
            continue
    return found


def test_a_killed_stage_takes_torchrun_and_its_ranks_with_it(tmp_path_factory):
    verifier = ts.tiny_verifier(tmp_path_factory)
    data = ts.Dataset(tmp_path_factory.mktemp("train-data"), verifier, train=16, heldout=4)
    env = ts.stage_env(tmp_path_factory)
    work = tmp_path_factory.mktemp("work")
    data.extract_run(work)
    stage = subprocess.Popen(ts.stage_cmd("backend.train", "--work-dir", str(work), "--verifier", str(verifier),
                                          "--gpus", "2", "--simulated-gpus", "--skip-preflight", "--epochs", "50",
                                          "--seq-length", "256", "--run-id", "train-ranks"),
                             env=env, cwd=ts.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ranks: list[int] = []
    launcher = None
    try:
        deadline = time.monotonic() + 180
        while len(ranks) < 2:
            assert stage.poll() is None, stage.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "torchrun never started its two ranks"
            launcher = next((p for p in children(stage.pid) if "backend.train.launch" in cmdline(p)), None)
            ranks = [p for p in children(launcher) if "backend.train.worker" in cmdline(p)] if launcher else []
            time.sleep(0.2)
        time.sleep(3)  # past the ranks' start: their tie is made, whatever they do now
        with pytest.raises(LockHeld, match="train run train-ranks"):
            RunLock(str(work), "train-ranks", "test").acquire()
        stage.send_signal(signal.SIGKILL)
        stage.wait(timeout=30)
        # torchrun has the lock's descriptor: the run stays locked while it (or a rank) may still write
        if alive(launcher):
            with pytest.raises(LockHeld):
                RunLock(str(work), "train-ranks", "test").acquire()
        deadline = time.monotonic() + 60  # a rank saves on SIGTERM; torchrun kills a slow one at 30 s
        while any(alive(p) for p in (launcher, *ranks)):
            assert time.monotonic() < deadline, [cmdline(p) for p in (launcher, *ranks) if alive(p)]
            time.sleep(0.2)
        print(f"torchrun and its ranks gone {60 - (deadline - time.monotonic()):.1f} s after the kill")
        # free now (a moment later at most: a process's descriptors close after its main thread is a
        # zombie), so a resume can start
        lock = RunLock(str(work), "train-ranks", "test")
        free_by = time.monotonic() + 5
        while True:
            try:
                lock.acquire().release()
                break
            except LockHeld:
                assert time.monotonic() < free_by, f"still held by {holders(lock.path)}"
                time.sleep(0.1)
    finally:
        for pid in (stage.pid, *([launcher] if launcher else []), *ranks):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        stage.communicate(timeout=30)
