"""Checks before training starts (also alone: `--preflight-only` prints them as JSON).

- python_modules: the host's python has torch, speculators and their training dependencies; otherwise
  the exact install command.
- gpus: the GPUs the run will use exist and no other process holds memory on them; a process that does
  (a vLLM server, typically) is named with its pid and command line, with the advice to stop it.
- disk_space: room for the checkpoints the run will write (model + optimizer state per save).
Each failed check carries `fix`; checks are the same records as the generation stage's.
"""
from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from backend.kit import preflight as shared
from backend.kit.preflight import PreflightReport

__all__ = ["PreflightReport", "GpuProcess", "check_modules", "check_gpus", "check_disk",
           "parse_compute_apps", "checkpoint_bytes"]

TRAIN_MODULES = ("torch", "speculators", "transformers", "datasets", "safetensors")
INSTALL_HINT = "pip install 'eagle3-console[train]' (or: pip install speculators==0.9.0 torch)"
NVIDIA_SMI_TIMEOUT_S = 20


@dataclass(frozen=True)
class GpuProcess:
    gpu_uuid: str
    pid: int
    name: str
    used_mib: int | None
    command: str = ""  # from /proc/<pid>/cmdline when readable


def check_modules(report: PreflightReport, modules: tuple[str, ...] = TRAIN_MODULES) -> None:
    shared.check_modules(report, modules, INSTALL_HINT)


def parse_compute_apps(text: str) -> list[GpuProcess]:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits`."""
    out = []
    for row in csv.reader(io.StringIO(text)):
        cells = [c.strip() for c in row]
        if len(cells) < 4 or not cells[1].isdigit():
            continue
        used = int(cells[3]) if cells[3].isdigit() else None
        out.append(GpuProcess(gpu_uuid=cells[0], pid=int(cells[1]), name=cells[2], used_mib=used))
    return out


def parse_gpu_uuids(text: str) -> dict[int, str]:
    """`nvidia-smi --query-gpu=index,uuid --format=csv,noheader` -> {index: uuid}."""
    out = {}
    for row in csv.reader(io.StringIO(text)):
        cells = [c.strip() for c in row]
        if len(cells) >= 2 and cells[0].isdigit():
            out[int(cells[0])] = cells[1]
    return out


def _command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300]


NVIDIA_SMI = ["nvidia-smi"]  # how this host's GPUs are asked (the stage's --nvidia-smi replaces it)


def _nvidia_smi(*args: str) -> str:
    done = subprocess.run([*NVIDIA_SMI, *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    if done.returncode != 0:
        raise OSError(done.stderr.strip() or f"nvidia-smi exited {done.returncode}")
    return done.stdout


def visible_indices(count: int) -> list[int]:
    """The physical indices of the first `count` GPUs this process may use (CUDA_VISIBLE_DEVICES aside
    from UUID forms, which are taken as the first `count`)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        parts = [p.strip() for p in env.split(",") if p.strip()]
        if all(p.isdigit() for p in parts):
            return [int(p) for p in parts[:count]]
    return list(range(count))


def holders(apps: list[GpuProcess], uuids: dict[int, str], indices: list[int],
            own_pid: int) -> list[tuple[int, GpuProcess]]:
    """The processes (other than ours) holding memory on the GPUs we will use."""
    by_uuid = {u: i for i, u in uuids.items()}
    return [(by_uuid[a.gpu_uuid], a) for a in apps
            if a.gpu_uuid in by_uuid and by_uuid[a.gpu_uuid] in indices and a.pid != own_pid]


def check_gpus(report: PreflightReport, wanted: int, available: int) -> None:
    """`wanted` GPU processes; `available` GPUs torch sees. 0 wanted: training on the CPU."""
    if wanted == 0:
        report.add("gpus", True, "training on the CPU (no GPU requested or none visible)")
        return
    if available < wanted:
        report.add("gpus", False, f"{wanted} GPUs requested, {available} visible to {sys.executable}",
                   "ask for fewer GPUs in the profile's [train] gpus, or check CUDA_VISIBLE_DEVICES and the driver")
        return
    if shutil.which(NVIDIA_SMI[0]) is None:
        report.add("gpus", True, f"{wanted} GPUs visible (nvidia-smi not found: cannot check who holds them)")
        return
    indices = visible_indices(wanted)
    try:
        uuids = parse_gpu_uuids(_nvidia_smi("--query-gpu=index,uuid", "--format=csv,noheader"))
        apps = parse_compute_apps(_nvidia_smi("--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                                              "--format=csv,noheader,nounits"))
    except (OSError, subprocess.TimeoutExpired) as exc:
        report.add("gpus", False, f"nvidia-smi failed: {exc}", "check the GPU driver (nvidia-smi must answer)")
        return
    busy = holders(apps, uuids, indices, os.getpid())
    if not busy:
        report.add("gpus", True, f"GPUs {', '.join(map(str, indices))} are free")
        return
    names = "; ".join(f"GPU {i}: pid {a.pid} {(_command_of(a.pid) or a.name)[:120]}"
                      f"{f' ({a.used_mib} MiB)' if a.used_mib is not None else ''}" for i, a in busy)
    vllm = any("vllm" in (_command_of(a.pid) or a.name).lower() for _, a in busy)
    report.add("gpus", False, f"GPUs in use by other processes: {names}",
               ("a vLLM server holds them: stop it first (the console's server pane: x; or "
                "`systemctl stop <unit>`), train, then start it again" if vllm else
                "stop those processes (or give [train] gpus other GPUs, e.g. gpus = [6, 7]), then start "
                "training again"))


def checkpoint_bytes(params: int, trainable: int, saves: int) -> int:
    """bf16 weights plus bf16 optimizer state (two moments) of the trainable part, per save."""
    return saves * (2 * params + 4 * trainable)


def check_disk(report: PreflightReport, path: str, need: int, work_dir: str | None = None,
               uses: tuple[str, ...] = ()) -> None:
    shared.check_disk(report, path, need, what="the checkpoints", work_dir=work_dir, uses=uses,
                      fix="raise [train] checkpoint_freq (fewer saves), or point the work dir at a larger volume")
