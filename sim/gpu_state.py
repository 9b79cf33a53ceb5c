"""Simulated GPUs: a small JSON file the stand-in server writes and `nvidia_smi` reads.

File shape: {"pid": N | null, "updated": ts, "gpus": [{"index", "name", "memory_used_mib",
"memory_total_mib", "utilization_pct", "temperature_c", "power_w"}, ...]}. The writer replaces the file
atomically (temp file + rename), so a reader never sees half a file. A reader that finds `pid` gone
reports idle GPUs: a server killed with SIGKILL cannot reset the file, but its memory is freed anyway.

A server started with a release delay (`--gpu-release-delay S`, the demo host's `--gpu-release-delay`)
leaves its memory in the file when it exits, with "exited_at" and "release_s": for S seconds after its
exit a reader still sees the memory held (and the dead pid as its compute process), as a driver that
takes seconds to free a TP8 server's memory does; after that, idle.
"""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_NAME = "NVIDIA H200"
DEFAULT_TOTAL_MIB = 143771
DEFAULT_GPUS = 8
IDLE_USED_MIB = 4
IDLE_TEMP_C = 31
IDLE_POWER_W = 74.6
POWER_LIMIT_W = 700.0
STATE_ENV = "EAGLE3_SIM_GPU_STATE"


@dataclass
class SimGpu:
    index: int
    name: str = DEFAULT_NAME
    memory_used_mib: int = IDLE_USED_MIB
    memory_total_mib: int = DEFAULT_TOTAL_MIB
    utilization_pct: int = 0
    temperature_c: int = IDLE_TEMP_C
    power_w: float = IDLE_POWER_W


@dataclass
class GpuState:
    gpus: list[SimGpu]
    pid: int | None = None
    updated: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    exited_at: float | None = None  # the server exited then, its memory not yet released
    release_s: float = 0.0           # how long after its exit the memory stays held

    def releasing(self, now: float) -> bool:
        """The server exited but the driver still holds its memory."""
        return self.exited_at is not None and now < self.exited_at + self.release_s

    @classmethod
    def idle(cls, count: int = DEFAULT_GPUS, total_mib: int = DEFAULT_TOTAL_MIB, name: str = DEFAULT_NAME) -> "GpuState":
        return cls(gpus=[SimGpu(index=i, name=name, memory_total_mib=total_mib) for i in range(count)])

    def to_json(self) -> dict[str, Any]:
        out = {"pid": self.pid, "updated": round(self.updated, 3), "gpus": [asdict(g) for g in self.gpus],
               **self.extra}
        if self.exited_at is not None:
            out.update(exited_at=round(self.exited_at, 3), release_s=self.release_s)
        return out

    def set_memory(self, used_mib: float) -> None:
        for gpu in self.gpus:
            gpu.memory_used_mib = int(min(gpu.memory_total_mib, max(IDLE_USED_MIB, used_mib)))

    def set_load(self, busy: float, rng: random.Random) -> None:
        """Utilisation, temperature and power for a busy fraction 0..1 (small per-GPU jitter)."""
        for gpu in self.gpus:
            if busy <= 0:
                gpu.utilization_pct = 0
                gpu.temperature_c = IDLE_TEMP_C + 4  # weights resident: warmer than a bare idle GPU
                gpu.power_w = round(IDLE_POWER_W + 45 + rng.uniform(-3, 3), 2)
            else:
                util = min(100, int(60 + 40 * busy + rng.uniform(-4, 4)))
                gpu.utilization_pct = max(1, util)
                gpu.temperature_c = int(45 + 25 * busy + rng.uniform(-1, 1))
                gpu.power_w = round(min(POWER_LIMIT_W, 250 + 400 * busy + rng.uniform(-15, 15)), 2)


def write_state(path: str, state: GpuState) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(state.to_json(), fh)
    os.replace(tmp, path)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _gpu_from(record: dict[str, Any], index: int) -> SimGpu:
    return SimGpu(
        index=int(record.get("index", index)),
        name=str(record.get("name", DEFAULT_NAME)),
        memory_used_mib=int(record.get("memory_used_mib", IDLE_USED_MIB)),
        memory_total_mib=int(record.get("memory_total_mib", DEFAULT_TOTAL_MIB)),
        utilization_pct=int(record.get("utilization_pct", 0)),
        temperature_c=int(record.get("temperature_c", IDLE_TEMP_C)),
        power_w=float(record.get("power_w", IDLE_POWER_W)),
    )


def read_state(path: str | None, *, default_count: int = DEFAULT_GPUS) -> GpuState:
    """The GPUs as a reader sees them now: idle when the file is missing or its server is dead.

    Raises ValueError (with the path) when the file exists but is not a state file.
    """
    if not path or not os.path.exists(path):
        return GpuState.idle(default_count)
    try:
        with open(path) as fh:
            raw = json.load(fh)
        gpus = [_gpu_from(g, i) for i, g in enumerate(raw["gpus"])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a simulated GPU state file ({exc})") from exc
    pid = raw.get("pid")
    state = GpuState(gpus=gpus, pid=pid if isinstance(pid, int) else None, updated=float(raw.get("updated", 0)))
    exited, release = raw.get("exited_at"), raw.get("release_s")
    if isinstance(exited, (int, float)) and isinstance(release, (int, float)):
        state.exited_at, state.release_s = float(exited), float(release)
        if state.releasing(time.time()):
            return state  # the server is gone, its memory not yet
    if state.pid is None or not pid_alive(state.pid):
        return GpuState(gpus=[SimGpu(index=g.index, name=g.name, memory_total_mib=g.memory_total_mib) for g in gpus])
    return state
