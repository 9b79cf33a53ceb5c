"""GPU rows straight from NVML (pynvml) when the console runs on the GPU host itself.

No subprocess per tick, and the same GpuInfo rows as the nvidia-smi parser. Any NVML failure (no
driver, no library, a MIG parent that hides memory) degrades to None fields or a clear error, never an
exception into the collector.
"""
from __future__ import annotations

from console.snapshot import GpuInfo

MIB = 1024 * 1024


def _safe(fn, *args):
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: the field is simply unknown
        return None


def read_gpus() -> tuple[list[GpuInfo], str | None]:
    try:
        import pynvml
    except ImportError:
        return [], "pynvml is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        return [], f"NVML unavailable: {e} (is the NVIDIA driver installed and loaded?)"
    try:
        rows = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = _safe(pynvml.nvmlDeviceGetName, h)
            mem = _safe(pynvml.nvmlDeviceGetMemoryInfo, h)
            util = _safe(pynvml.nvmlDeviceGetUtilizationRates, h)
            temp = _safe(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
            power = _safe(pynvml.nvmlDeviceGetPowerUsage, h)
            rows.append(GpuInfo(
                index=i, name=name.decode() if isinstance(name, bytes) else str(name or "GPU"),
                memory_used_mib=int(mem.used // MIB) if mem else None,
                memory_total_mib=int(mem.total // MIB) if mem else None,
                utilization_pct=int(util.gpu) if util else None,
                temperature_c=int(temp) if temp is not None else None,
                power_w=round(power / 1000, 1) if power is not None else None))
        return rows, None
    except Exception as e:
        return [], f"NVML query failed: {e}"
    finally:
        _safe(pynvml.nvmlShutdown)
