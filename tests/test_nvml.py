"""GPU rows on a local (non-simulated) host: NVML first, the profile's command when NVML is unusable."""
from __future__ import annotations

import asyncio
import sys

from console.profile import profile_from_dict
from console.telemetry.collector import Collector
from console.host.local import LocalHost
from console.telemetry.nvml import read_gpus
from harness.sim_support import PYTHON


def test_read_gpus_never_raises():
    rows, err = read_gpus()
    assert (rows and err is None) or (rows == [] and "NVML" in err or "pynvml" in err)


def test_local_host_falls_back_to_the_command_without_nvml(tmp_path):
    state = tmp_path / "gpus.json"
    p = profile_from_dict({
        "host": {"name": "localhost", "transport": "local"},
        "server": {"model_path": "/m", "manager": "tmux", "unit": "e3-nvml-test", "port": 1},
        "paths": {"work_dir": str(tmp_path)},
        "gpus": {"command": [*PYTHON, "-m", "sim.nvidia_smi", "--state", str(state),
                             "--query-gpu=index,name,memory.used,memory.total,utilization.gpu,temperature.gpu,"
                             "power.draw", "--format=csv,noheader,nounits"]},
    })
    collector = Collector(p, LocalHost())
    snap = asyncio.run(collector.refresh())
    nvml_rows, nvml_err = read_gpus()
    if nvml_err is None:  # a machine with a driver: NVML is the source
        assert len(snap.gpus) == len(nvml_rows)
    else:
        assert collector.nvml_note == nvml_err
        assert len(snap.gpus) == 8 and snap.gpu_error is None  # the simulated command's rows
