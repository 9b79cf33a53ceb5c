"""Whether the GPUs a server is about to take are free: no compute process on them, memory near idle.

A stopped server is "down" when its unit or session is gone, but the driver can take seconds more to
release the memory of a TP8 server of a large model, and vLLM refuses to start while free memory is below
its `gpu_memory_utilization` share. The server switch (backend/kit/switch.py) waits here, bounded, between
seeing one server down and starting the next; on timeout it names who still holds them.

Read with `nvidia-smi --query-gpu=index,uuid,memory.used` and `--query-compute-apps=gpu_uuid,pid,
process_name,used_memory` (both `--format=csv,noheader,nounits`). The parsers are pure functions.
"""
from __future__ import annotations

import asyncio
import csv
import io
import shutil
import time
from dataclasses import dataclass
from typing import Callable, Sequence

NVIDIA_SMI_TIMEOUT_S = 15.0
OUTPUT_MAX = 1 << 20
DEFAULT_FREE_TIMEOUT_S = 120.0
DEFAULT_IDLE_MIB = 1024  # an idle GPU shows a few MiB to a few hundred (persistence, ECC): anything above is held
GPU_QUERY = ("--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits")
APPS_QUERY = ("--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class GpuMemory:
    index: int
    uuid: str
    used_mib: int | None


@dataclass(frozen=True)
class GpuHolder:
    gpu: int
    pid: int
    name: str
    used_mib: int | None

    def describe(self) -> str:
        mib = f", {self.used_mib} MiB" if self.used_mib is not None else ""
        return f"GPU {self.gpu}: pid {self.pid} {self.name[:120]}{mib}"


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(text[:OUTPUT_MAX]))]


def _int(cell: str) -> int | None:
    return int(cell) if cell.isdigit() else None


def parse_memory(text: str) -> list[GpuMemory]:
    """`--query-gpu=index,uuid,memory.used --format=csv,noheader,nounits` rows; others skipped."""
    return [GpuMemory(int(r[0]), r[1], _int(r[2])) for r in _rows(text) if len(r) >= 3 and r[0].isdigit()]


def parse_apps(text: str, gpus: Sequence[GpuMemory]) -> list[GpuHolder]:
    """`--query-compute-apps=gpu_uuid,pid,process_name,used_memory` rows, each on its GPU's index."""
    by_uuid = {g.uuid: g.index for g in gpus}
    out = []
    for r in _rows(text):
        if len(r) >= 4 and r[1].isdigit() and r[0] in by_uuid:
            out.append(GpuHolder(by_uuid[r[0]], int(r[1]), r[2], _int(r[3])))
    return out


@dataclass(frozen=True)
class GpuCheck:
    free: bool
    holders: list[GpuHolder]       # compute processes on the GPUs asked about
    busy: list[GpuMemory]          # GPUs asked about whose memory is above idle

    def describe(self) -> str:
        parts = [h.describe() for h in self.holders]
        parts += [f"GPU {g.index}: {g.used_mib} MiB used" for g in self.busy
                  if not any(h.gpu == g.index for h in self.holders)]
        return "; ".join(parts) or "free"


def check(mem_text: str, apps_text: str, wanted: Sequence[int], idle_mib: int) -> GpuCheck:
    """Free when the wanted GPUs (all listed ones when empty) have no compute process and memory at most
    `idle_mib`."""
    gpus = parse_memory(mem_text)
    mine = [g for g in gpus if not wanted or g.index in wanted]
    holders = [h for h in parse_apps(apps_text, gpus) if any(h.gpu == g.index for g in mine)]
    busy = [g for g in mine if g.used_mib is not None and g.used_mib > idle_mib]
    return GpuCheck(free=not holders and not busy, holders=holders, busy=busy)


async def _run(argv: list[str]) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), NVIDIA_SMI_TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise OSError(f"{argv[0]} did not answer within {NVIDIA_SMI_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        said = (err or out).decode(errors="replace").strip()[-300:]
        raise OSError(said or f"{argv[0]} exited {proc.returncode}")
    return out[:OUTPUT_MAX].decode(errors="replace")


async def read(nvidia_smi: Sequence[str], wanted: Sequence[int], idle_mib: int) -> GpuCheck:
    mem = await _run([*nvidia_smi, *GPU_QUERY])
    apps = await _run([*nvidia_smi, *APPS_QUERY])
    return check(mem, apps, wanted, idle_mib)


def available(nvidia_smi: Sequence[str]) -> bool:
    return bool(nvidia_smi) and shutil.which(nvidia_smi[0]) is not None


async def wait_free(nvidia_smi: Sequence[str], wanted: Sequence[int], *, timeout_s: float, idle_mib: int,
                    interval: float = 0.5, stopped: Callable[[], bool] = lambda: False) -> tuple[bool, float, str]:
    """Until the GPUs are free or `timeout_s` passed: (free, seconds waited, what holds them / why unknown).
    nvidia-smi failing counts as not free until the timeout (its last error is said)."""
    t0 = time.monotonic()
    said = ""
    while True:
        try:
            got = await read(nvidia_smi, wanted, idle_mib)
            if got.free:
                return True, time.monotonic() - t0, ""
            said = got.describe()
        except OSError as exc:
            said = f"nvidia-smi failed: {exc}"
        waited = time.monotonic() - t0
        if waited >= timeout_s or stopped():
            return False, waited, said
        await asyncio.sleep(min(interval, max(0.05, timeout_s - waited)))
