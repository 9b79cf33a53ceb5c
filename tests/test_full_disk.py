"""A full disk ends every host program the same way (backend/kit/lifecycle.py): exit 1, no traceback, and the
last event a finish that says "failed" and names the full volume, so the console never shows "stale".

Each program runs as in the stage contract (harness/stage_cases.py, real inputs) with its work
dir on a small tmpfs that fills up while it runs: the test takes every free block once the program is
mid-body (a download under way, requests answered, samples being fetched), or leaves only room for the run
directory before it starts (prepare, whose body is short). generate, extract and train have their own
full-disk tests (test_generate_e2e, test_extract_e2e, test_train_stage); the chain and the bench pair
theirs in test_lifecycle."""
from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from harness.rig.tmpfs import small_tmpfs
from harness.drafter_support import copy_runs
from harness.stage_cases import LAYERS, Case, Kit, events, make_case, py, start

pytestmark = pytest.mark.timeout(600)
FILLER = "filler"


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    return Kit(tmp_path_factory)


@pytest.fixture
def small_work(tmp_path):
    """tmp_path/work on its own 64 MiB tmpfs (room for the copied input runs and a 32 MiB download)."""
    with small_tmpfs(tmp_path / "work", "64m") as mnt:
        yield mnt


def fill(volume: Path, leave: int = 0) -> None:
    """Take every free block of the volume, then give back `leave` bytes."""
    path = volume / FILLER
    with open(path, "ab", buffering=0) as f:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    if leave:
        os.truncate(path, max(0, os.path.getsize(path) - leave))


def verify_case(tmp: Path, kit: Kit, request) -> Case:
    """verify on a train run with no stored held-out states: it fetches them from the extraction stand-in
    into the train run's cache (on the small volume) while it runs."""
    from harness.sim_support import SimServer
    from harness.sim_support import ASKED, extraction_flags
    from harness.train_support import completed_run

    work = tmp / "work"
    storage = tmp / "hs-storage"
    storage.mkdir()
    tiny = kit["tiny"]  # in the stand-in's cache before it starts: a build under load outlasts its start
    sim = SimServer(tmp, "--served-model-name", "tiny", "--text-backend", "tinylm", "--stats-interval", "60",
                    *extraction_flags(ASKED, storage), env=kit["env"]).start()
    request.addfinalizer(sim.kill)
    sim.wait_ready(timeout=120)
    copy_runs(kit["prepared"], work, ("gen", "prep"))
    prep = json.loads((work / "runs" / "prep" / "summary.json").read_text())
    completed_run(work, "train", "tr", {"heldout_data": prep["outputs"]["heldout_data"],
                                        "checkpoint": str(kit["checkpoint"])},
                  verifier=str(tiny), speculative_tokens=3, aux_layer_ids=LAYERS)
    return Case(py("backend.verify", "--work-dir", str(work), "--run-id", "v", "--input-run", "tr", "--samples",
                   "4", "--vllm-endpoint", f"{sim.url}/v1", "--served-model", "tiny"), work, "v", env=kit["env"])


@pytest.mark.parametrize("program", ["fetch_drafter", "verify", "bench", "prepare"])
def test_a_full_disk_mid_run_ends_with_a_finish_naming_the_volume(program, tmp_path, small_work, kit, request):
    if program == "verify":
        case = verify_case(tmp_path, kit, request)
    else:  # the contract's mid-body scenario: a slow download, a slow server, a real prepare run
        case = make_case(program, "stop", tmp_path, kit, request)
    if program == "prepare":
        fill(small_work, leave=12 << 10)  # the run dir and its start event, not the dataset
    proc = start(case)
    try:
        if program != "prepare":
            deadline = time.monotonic() + 240
            while not case.ready(events(case.run)):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, f"{program} never got mid-body: {events(case.run)}"
                time.sleep(0.05)
            fill(small_work)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    evs = events(case.run)
    assert evs and evs[-1]["kind"] == "finish", [e.get("kind") for e in evs]
    finish = evs[-1]
    assert finish["status"] == "failed", finish
    error = finish["summary"]["error"]
    assert error.startswith("disk full: no space left on the volume of ") and str(small_work) in error, error
    assert "disk full" in err
