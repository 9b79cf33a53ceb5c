"""Under tmux a stage's stop waits as long as systemd's TimeoutStopSec for it would: a stage holding the
GPUs swaps back to the baseline on SIGTERM, and a fixed 120 s SIGKILL could cut that swap off."""
from __future__ import annotations

from console.control.launch import gpu_stop_timeout, stage_stop_timeout
from console.control.units import stage_stop_command
from console.naming import stage_unit_name
from console.profile import profile_from_dict


def test_gpu_holding_stages_get_the_swaps_stop_budget_under_tmux():
    p = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                           "server": {"model_path": "/m", "manager": "tmux", "unit": "demo-vllm",
                                      "stop_timeout_s": 300, "command": ["python3", "-m", "sim.vllm_server"]},
                           "paths": {"work_dir": "/tmp/demo"}})
    budget = gpu_stop_timeout(p)
    assert budget > 120
    for stage in ("extract", "train", "verify", "bench", "pipeline"):
        assert stage_stop_timeout(p, stage_unit_name(stage, "r1")) == budget, stage
    assert stage_stop_timeout(p, stage_unit_name("generate", "r1")) == 120
    unit = stage_unit_name("extract", "r1")
    stop = stage_stop_command(p, unit, stop_timeout_s=stage_stop_timeout(p, unit))
    assert f"{int(budget * 5)}" in " ".join(stop.argv)  # the wrapper polls five times a second
