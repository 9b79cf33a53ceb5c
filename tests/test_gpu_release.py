"""The server switch waits for the stopped server's GPU memory to be released before starting the next
(backend/kit/gpu_free.py), on the demo host whose simulated GPUs keep a stopped server's memory for a while
(`--gpu-release-delay`), as a driver freeing a TP8 server of a large model does. Without the wait the
stand-in refuses to start as vLLM does (free memory below its gpu_memory_utilization share)."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from backend.kit import gpu_free
from backend.kit.switch import Switch, SwitchFailed, switch_from_dict
from console import demo
from console.control.extraction import build_plan
from console.control.stage_argv import nvidia_smi_prefix
from sim.gpu_state import GpuState, write_state

pytestmark = pytest.mark.timeout(180)

# real `nvidia-smi --format=csv,noheader,nounits` output of a host whose TP8 server just exited
MEM = "0, GPU-a0, 131072\n1, GPU-a1, 3\n"
APPS = "GPU-a0, 4242, /usr/bin/python3, 131068\nGPU-zz, 99, other, 10\n"


def test_the_check_names_the_holders_on_the_wanted_gpus_only():
    got = gpu_free.check(MEM, APPS, [0, 1], idle_mib=1024)
    assert not got.free and [h.pid for h in got.holders] == [4242]
    assert got.describe() == "GPU 0: pid 4242 /usr/bin/python3, 131068 MiB"
    assert gpu_free.check(MEM, APPS, [1], idle_mib=1024).free
    # memory above idle with no process listed (the driver still releasing) is not free either
    assert gpu_free.check(MEM, "", [0], idle_mib=1024).describe() == "GPU 0: 131072 MiB used"
    assert gpu_free.check("garbage\n", "", [], idle_mib=1024).free  # nothing listed, nothing held


def test_the_simulated_gpus_keep_an_exited_servers_memory_for_the_delay(tmp_path):
    state = tmp_path / "gpus.json"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gpus = GpuState.idle(2)
    gpus.set_memory(120000)
    # 5 s: the read is two nvidia-smi starts, and a loaded run once took a second over them (with a 1 s delay
    # the memory query saw it held and the process query, after it, saw it released)
    gpus.pid, gpus.exited_at, gpus.release_s = int(dead.stdout), time.time(), 5.0
    write_state(str(state), gpus)
    smi = [sys.executable, "-m", "sim.nvidia_smi", "--state", str(state)]
    held = asyncio.run(gpu_free.read(smi, [0, 1], 1024))
    assert not held.free and {h.pid for h in held.holders} == {int(dead.stdout)}
    free, waited, _ = asyncio.run(gpu_free.wait_free(smi, [0, 1], timeout_s=20, idle_mib=1024, interval=0.1))
    assert free and 0.3 < waited < 10


def test_a_swap_on_a_host_that_releases_memory_late_starts_the_next_server_once_the_gpus_are_free(
        tmp_path, monkeypatch):
    work = tmp_path / "demo"
    profile = asyncio.run(demo.start(work, speed=20, gpu_release_s=8.0))
    try:
        # the switch's tmux commands reach the demo's private tmux server, as the stages' do there
        monkeypatch.delenv("TMUX", raising=False)
        monkeypatch.setenv("TMUX_TMPDIR", f"{work}/tmux")
        plan = switch_from_dict(build_plan(profile, "r1", [1, 2], 4)["switch"])
        assert plan.nvidia_smi == nvidia_smi_prefix(profile) and plan.home.gpus == list(range(8))
        events: list[dict] = []
        sw = Switch(plan, holder="test", health_interval=0.2,
                    progress=lambda phase, force=False, **kw: events.append({"phase": phase, **kw, "t": time.time()}),
                    emit=lambda kind, **kw: events.append({"phase": kind, **kw}))

        async def swap() -> None:
            await sw.wait_ready(plan.home)  # the demo's baseline answers first
            events.clear()
            try:
                await sw.go("extractor")
            finally:
                await sw.back(wait=True)

        asyncio.run(swap())
        phases = [e["phase"] for e in events]
        assert "error" not in phases, events
        for server in ("extractor", "baseline"):
            free = next(e for e in events if e["phase"] == "gpus_free" and e["server"] == server)
            start = next(e for e in events if e["phase"] == f"starting_{server}")
            assert phases.index("gpus_free", phases.index("waiting_for_gpus")) < phases.index(f"starting_{server}")
            # seen held at least once (polled every 0.5 s), then free, then started: without the wait the
            # stand-in refuses to start, as vLLM does, and the swap fails
            assert free["t"] <= start["t"] and free["waited_s"] >= 0.4, free
        assert phases.index("extractor_ready") < phases.index("baseline_ready")
        assert sw.record.baseline_restarted is True

        # the timeout names the holder: a release slower than the plan's bound refuses the start
        plan = switch_from_dict({**build_plan(profile, "r2", [1, 2], 4)["switch"], "gpu_free_s": 1})
        late: list[tuple] = []
        sw = Switch(plan, holder="test", health_interval=0.2,
                    progress=lambda phase, force=False, **kw: late.append((phase, kw)))

        async def too_slow() -> None:
            try:
                await sw.go("extractor")
            finally:
                sw.keep_home_down = True  # the baseline's own restart is the first test's
                await sw.back()

        with pytest.raises(SwitchFailed, match=r"GPU 0,1,2,3,4,5,6,7 still held .* pid \d+"):
            asyncio.run(too_slow())
        assert "gpus_free" not in [p for p, _ in late] and "starting_extractor" not in [p for p, _ in late]
    finally:
        asyncio.run(demo.stop(work))
