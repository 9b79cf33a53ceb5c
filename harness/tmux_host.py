"""A host as the console drives it over tmux, on this machine: the baseline stand-in (the tiny verifier) in
its own session of a private tmux server, and the profile that describes it; what the extract and online
training tests hand their swap plans to."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from console.control.extraction import build_plan
from console.control.units import server_log_path, server_start_argv
from console.profile import profile_from_dict
from harness.drafter_support import REPO
from harness.sim_support import free_port

AUX = [1, 2, 3]
LAYERS = 4  # the tiny verifier's decoder layers: the extraction server is asked for AUX + [LAYERS]


class Host:
    """One baseline stand-in (its tmux session and port) and the profile that describes it."""

    def __init__(self, work: Path, env: dict[str, str], name: str, extra: list[str], port: int | None = None):
        self.env, self.port, self.unit = env, port or free_port(), f"e3x-{name}"
        command = ["env", f"PYTHONPATH={REPO}", f"XDG_CACHE_HOME={env['XDG_CACHE_HOME']}", "HF_HUB_OFFLINE=1",
                   sys.executable, "-m", "sim.vllm_server", "--host", "127.0.0.1", "--port", str(self.port),
                   "--model", "/shared/tiny", "--served-model-name", "tiny", "--load-seconds", "0.2",
                   "--shards", "2", "--text-backend", "tinylm", "--stats-interval", "60", *extra]
        self.profile = profile_from_dict({
            "host": {"name": "localhost", "transport": "local"},
            "server": {"manager": "tmux", "unit": self.unit, "model_path": "/shared/tiny",
                       "served_model_name": "tiny", "port": self.port, "command": command, "stop_timeout_s": 15.0,
                       "load_timeout_s": 120.0},
            "paths": {"work_dir": str(work)}, "drafter": {"aux_layer_ids": AUX}})

    def start_baseline(self) -> None:
        res = subprocess.run(server_start_argv(self.profile, server_log_path(self.profile)), env=self.env,
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr

    def write_plan(self, run_id: str, path: Path) -> Path:
        path.write_text(json.dumps(build_plan(self.profile, run_id, AUX, LAYERS)))
        return path

    def panes(self) -> dict[str, str]:
        """Live sessions -> the command their pane runs ('' for a dead pane)."""
        res = subprocess.run(["tmux", "list-panes", "-a", "-F", "#{session_name}\t#{pane_dead}\t#{pane_start_command}"],
                             env=self.env, capture_output=True, text=True)
        out = {}
        for line in res.stdout.splitlines():
            name, dead, cmd = (line.split("\t") + ["", ""])[:3]
            out[name] = "" if dead == "1" else cmd
        return out

    def baseline_is_back(self) -> bool:
        cmd = self.panes().get(self.unit, "")
        return "sim.vllm_server" in cmd and "extract_hidden_states" not in cmd

    def stop_all(self) -> None:
        for name in (self.unit, f"{self.unit}-extract"):
            subprocess.run(["tmux", "kill-session", "-t", f"={name}"], env=self.env, capture_output=True)
