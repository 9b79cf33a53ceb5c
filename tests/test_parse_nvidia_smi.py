from __future__ import annotations

from pathlib import Path

import pytest

from console.snapshot import GpuInfo
from console.parsers.nvidia_smi import (DEFAULT_GPU_QUERY, classify_gpu_error, parse_gpu_csv,
                                        parse_gpu_row)

SAMPLES = Path(__file__).parent / "samples" / "nvidia_smi"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text(encoding="utf-8")


def test_default_query_argv():
    assert DEFAULT_GPU_QUERY == [
        "nvidia-smi",
        "--query-gpu=index,name,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw",
        "--format=csv,noheader,nounits",
    ]


def test_eight_h200():
    rows = parse_gpu_csv(sample("h200x8.csv"))
    assert [r.index for r in rows] == list(range(8))
    assert rows[0] == GpuInfo(index=0, name="NVIDIA H200", memory_used_mib=130512, memory_total_mib=143771,
                              utilization_pct=97, temperature_c=61, power_w=612.45)


def test_mig_parent_has_no_memory_reading():
    rows = parse_gpu_csv(sample("mig_parent.csv"))
    assert rows[0] == GpuInfo(index=0, name="NVIDIA A100-SXM4-80GB", memory_used_mib=None,
                              memory_total_mib=81920, utilization_pct=None, temperature_c=34, power_w=71.23)
    assert rows[1].memory_used_mib == 4


def test_odd_values_spaces_and_comma_in_name():
    rows = parse_gpu_csv(sample("odd_values.csv"))
    assert rows[0].name == "NVIDIA GeForce RTX 4090"
    assert (rows[0].memory_used_mib, rows[0].power_w) == (23012, None)
    assert (rows[1].utilization_pct, rows[1].temperature_c, rows[1].power_w) == (None, None, None)
    assert rows[2] == GpuInfo(index=2, name="Quadro RTX 8000, Rev A", memory_used_mib=10,
                              memory_total_mib=46080, utilization_pct=3, temperature_c=40, power_w=55.5)


@pytest.mark.parametrize("line,expected", [
    ("0, H100, 1 MiB, 80000 MiB, 5 %, 30, 100.5 W",  # a query run without nounits
     GpuInfo(0, "H100", 1, 80000, 5, 30, 100.5)),
    ("3, X, N/A, N/A, N/A, N/A, N/A", GpuInfo(3, "X", None, None, None, None, None)),
    ("0, , 1, 2, 3, 4, 5", GpuInfo(0, "unknown", 1, 2, 3, 4, 5.0)),
    ("0, X, nan, 2, 3, 4, inf", GpuInfo(0, "X", None, 2, 3, 4, None)),
])
def test_row_shapes(line, expected):
    assert parse_gpu_row(line) == expected


@pytest.mark.parametrize("text", [
    "", "\n\n", "index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], temperature.gpu, power.draw [W]",
    "  MIG 1g.10gb      Device  0: (UUID: MIG-0e2c7f5e-aaaa-bbbb-cccc-1234567890ab)",
    "GPU 0: NVIDIA H200 (UUID: GPU-1234)",
    "0, H200, 1, 2",  # too few fields
    "-1, H200, 1, 2, 3, 4, 5",
    "x, H200, 1, 2, 3, 4, 5",
])
def test_not_gpu_rows(text):
    assert parse_gpu_csv(text) == []


def test_blank_and_noise_lines_are_skipped_between_rows():
    text = "0, A, 1, 2, 3, 4, 5\n\ngarbage\n1, B, 1, 2, 3, 4, 5\n"
    assert [r.name for r in parse_gpu_csv(text)] == ["A", "B"]


@pytest.mark.parametrize("rc,out,err,needle", [
    (9, sample("no_driver.txt"), "", "cannot talk to the NVIDIA driver"),
    (18, sample("mismatch.txt"), "", "version mismatch"),
    (127, "", "bash: line 1: nvidia-smi: command not found", "not found on the host"),
    (127, "", "", "not found on the host"),
    (1, "", "sh: 1: nvidia-smi: Permission denied", "permission denied"),
    (126, "", "", "permission denied"),
    (6, sample("no_devices.txt"), "", "no NVIDIA GPU"),
    (None, "", "", "did not finish"),
    (3, "", "Unexpected failure\n", "nvidia-smi failed (exit 3): Unexpected failure"),
    (255, "", "", "nvidia-smi failed (exit 255): no output"),
])
def test_classify_errors(rc, out, err, needle):
    message = classify_gpu_error(rc, out, err)
    assert message is not None and needle in message


def test_classify_success_is_none():
    assert classify_gpu_error(0, sample("h200x8.csv"), "") is None
    assert classify_gpu_error(0, "", "") is None
    assert classify_gpu_error(0, None, None) is None
