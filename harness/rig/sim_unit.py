"""The vLLM stand-in as a real systemd unit in the booted rig (harness/rig/systemd_host.py), and a
systemd-manager profile that reaches it over SSH with the rig's verified host key: what the rig tests and
benchmarks/bench_readiness.py both install."""
from __future__ import annotations

import json
import shlex
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from console.host.ssh import SshHost
from console.profile import load_profile
from harness.rig import keys
from harness.sim_support import PYTHON

REPO = Path(__file__).resolve().parents[2]
MODEL_PATH = "/models/kimi-k2.5-int4"
SERVED = "kimi-k2.5-int4"
WEIGHTS_GIB = 40.0


@dataclass
class RigUnit:
    name: str
    port: int
    work_dir: str
    profile_path: Path
    extra_profile: dict = field(default_factory=dict)


def unit_text(unit: str, port: int, work_dir: str, *, version: str, load_seconds: float,
              extra: list[str]) -> str:
    argv = [sys.executable, "-m", "sim.vllm_server", "--model", MODEL_PATH,
            "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
            "--vllm-version", version, "--load-seconds", str(load_seconds), "--shards", "8",
            "--gpus", "2", "--gpu-state", f"{work_dir}/gpus.json", "--weights-gib", str(WEIGHTS_GIB),
            "--stats-interval", "30", *extra]
    return "\n".join([
        "[Unit]", f"Description=vLLM stand-in {unit}", "",
        "[Service]", "Type=simple", f"Environment=PYTHONPATH={REPO}", "Environment=PYTHONUNBUFFERED=1",
        f"ExecStart={shlex.join(argv)}", "Restart=no", "TimeoutStopSec=20", "",
    ])


def write_profile(path: Path, rig, unit: str, port: int, work_dir: str, *, served: str = SERVED,
                  gpu_args: list[str] | None = None) -> Path:
    gpu_cmd = [*PYTHON, "-m", "sim.nvidia_smi",
               *(gpu_args if gpu_args is not None else ["--state", f"{work_dir}/gpus.json"]),
               "--query-gpu=index,name,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw",
               "--format=csv,noheader,nounits"]
    path.write_text("\n".join([
        "[host]", 'name = "127.0.0.1"', f"port = {rig.port}", f'user = "{rig.username}"',
        f'identity_file = "{rig.identity_file}"', f'known_hosts = "{rig.known_hosts}"', "",
        "[server]", 'manager = "systemd"', f'unit = "{unit}"', f'model_path = "{MODEL_PATH}"',
        f'served_model_name = "{served}"', f"port = {port}", f"expected_weights_gib = {WEIGHTS_GIB}",
        "stop_timeout_s = 20.0", "",
        "[paths]", f'work_dir = "{work_dir}"', "",
        "[gpus]", f"command = {json.dumps(gpu_cmd)}", "",
    ]))
    load_profile(path)  # fail here, with the profile's own message, if the test wrote a bad one
    return path


async def install_unit(ssh: SshHost, rig, tmp_path: Path, *, version: str = "0.33.0",
                       load_seconds: float = 3.0, extra: list[str] = (), served: str = SERVED) -> RigUnit:
    name = f"e3vllm-{uuid.uuid4().hex[:8]}"
    port = keys.free_port()
    work_dir = f"/root/e3rig/{name}"
    text = unit_text(name, port, work_dir, version=version, load_seconds=load_seconds, extra=list(extra))
    script = 'mkdir -p "$2" && cat > "$1" && systemctl daemon-reload'
    await ssh.run(["sh", "-c", script, "sh", f"/etc/systemd/system/{name}.service", work_dir],
                  input=text, check=True, timeout=30)
    profile = write_profile(tmp_path / f"{name}.toml", rig, name, port, work_dir, served=served)
    return RigUnit(name, port, work_dir, profile)


async def stop_unit(ssh: SshHost, unit: RigUnit) -> None:
    await ssh.run(["systemctl", "stop", unit.name], timeout=30)
