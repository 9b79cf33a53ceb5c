"""Parse `nvidia-smi --query-gpu ... --format=csv,noheader,nounits` and explain why it failed.

nvidia-smi does not quote its CSV, so a name with a comma yields extra fields: the index is the first
field, the five numbers are the last five, and whatever lies between is the name.
"""
from __future__ import annotations

from console.snapshot import GpuInfo

GPU_QUERY_FIELDS: tuple[str, ...] = (
    "index", "name", "memory.used", "memory.total", "utilization.gpu", "temperature.gpu", "power.draw",
)
DEFAULT_GPU_QUERY: list[str] = [
    "nvidia-smi", "--query-gpu=" + ",".join(GPU_QUERY_FIELDS), "--format=csv,noheader,nounits",
]

# Values nvidia-smi prints when it has no reading; all mean "unknown", never zero.
_UNITS = ("MiB", "%", "W", "C")


def _number(field: str) -> float | None:
    text = field.strip()
    for unit in _UNITS:  # tolerate a query run without `nounits`
        if text.endswith(unit):
            text = text[: -len(unit)].strip()
            break
    try:
        value = float(text)
    except ValueError:  # [N/A], N/A, [Not Supported], [Unknown Error], ERR!, ...
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def _int(field: str) -> int | None:
    value = _number(field)
    return None if value is None else int(round(value))


def parse_gpu_row(line: str) -> GpuInfo | None:
    """One CSV line -> GpuInfo, or None for a line that is not a GPU row (header, MIG listing, noise)."""
    if not isinstance(line, str):
        return None
    fields = [f.strip() for f in line.split(",")]
    if len(fields) < len(GPU_QUERY_FIELDS):
        return None
    try:
        index = int(fields[0])
    except ValueError:
        return None
    if index < 0:
        return None
    used, total, util, temp, power = fields[-5:]
    name = ", ".join(fields[1:-5]).strip() or "unknown"
    return GpuInfo(
        index=index,
        name=name,
        memory_used_mib=_int(used),
        memory_total_mib=_int(total),
        utilization_pct=_int(util),
        temperature_c=_int(temp),
        power_w=_number(power),
    )


def parse_gpu_csv(text: str) -> list[GpuInfo]:
    """All GPU rows, in output order; malformed lines are skipped, blank output gives []."""
    if not isinstance(text, str):
        return []
    rows = []
    for line in text.splitlines():
        row = parse_gpu_row(line)
        if row is not None:
            rows.append(row)
    return rows


def classify_gpu_error(returncode: int | None, stdout: str = "", stderr: str = "") -> str | None:
    """A sentence an operator can act on when nvidia-smi did not give readings; None when it did."""
    out = f"{stdout or ''}\n{stderr or ''}"
    lowered = out.lower()
    if "couldn't communicate with the nvidia driver" in lowered or "could not communicate" in lowered:
        return ("nvidia-smi cannot talk to the NVIDIA driver: the driver is not loaded or not installed "
                "(check `lsmod | grep nvidia`; after a driver upgrade the host may need a reboot)")
    if "driver/library version mismatch" in lowered:
        return ("NVIDIA driver/library version mismatch: the driver was upgraded but the old kernel "
                "module is still loaded; reboot the host (or reload the nvidia modules)")
    if returncode == 127 or "command not found" in lowered or (
            "no such file or directory" in lowered and "nvidia-smi" in lowered):
        return "nvidia-smi not found on the host: no NVIDIA driver installed, or it is not on PATH"
    if returncode == 126 or "permission denied" in lowered or "insufficient permissions" in lowered:
        return "permission denied running nvidia-smi: the SSH user may not access the GPU devices"
    if "no devices were found" in lowered:
        return "nvidia-smi found no NVIDIA GPU on the host"
    if returncode is None:
        return "nvidia-smi did not finish (timed out or the connection dropped)"
    if returncode != 0:
        first = next((ln.strip() for ln in out.splitlines() if ln.strip()), "no output")
        return f"nvidia-smi failed (exit {returncode}): {first}"
    return None
