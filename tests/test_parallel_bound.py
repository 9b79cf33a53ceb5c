"""A tensor-parallel size no host has (`-tp 100000000`) is refused by every reader with the range it
expected, at once, instead of building a list of a hundred million GPU indices."""
from __future__ import annotations

import time

import pytest

from backend.kit.gpu_owners import OwnershipError, server_gpus_of
from console.control.gpu_plan import server_gpus
from console.control.operator_unit import unit_settings
from console.control.server_argv import ServerArgvError, target_tp
from console.control.units import ServerProgram
from console.parsers.vllm_cmdline import CmdlineError, read_serve_argv
from console.profile import profile_from_dict


def test_every_reader_bounds_tp_times_pp_and_names_the_range():
    t0 = time.monotonic()
    with pytest.raises(CmdlineError, match=r"expected a product from 1 to 1024"):
        unit_settings(ServerProgram(("vllm", "serve", "/m", "-tp", "100000000")))
    with pytest.raises(ServerArgvError, match=r"from 1 to 1024"):
        target_tp(["vllm", "serve", "/m", "--tensor-parallel-size=100000000"])
    with pytest.raises(OwnershipError, match=r"from 1 to 1024"):
        server_gpus_of(1024, 2)
    with pytest.raises(OwnershipError, match=r"from 1 to 8 \(the host's 8 GPUs\)"):
        server_gpus_of(16, host_gpus=8)
    profile = profile_from_dict({"host": {"name": "gpu-host.example"}, "gpus": {"count": 8},
                                 "server": {"model_path": "/m", "vllm_args": ["-tp", "16"]},
                                 "paths": {"work_dir": "/data/e3"}})
    with pytest.raises(OwnershipError, match=r"tensor parallel 16 .* from 1 to 8"):
        server_gpus(profile)
    assert time.monotonic() - t0 < 5
    assert read_serve_argv(["vllm", "serve", "/m", "-tp", "8"]).tensor_parallel_size == 8
    assert server_gpus_of(8, host_gpus=8) == tuple(range(8))
