"""The built-in SIMULATED demo host: a vLLM stand-in in tmux and simulated GPUs, all on this machine.

`demo-host start` fills console/demo.toml in (this interpreter, a free loopback port, the GPU state
file), writes the result to `<demo dir>/profile.toml` and starts the stand-in the same way a real tmux
host is driven. The demo keeps its own tmux server (TMUX_TMPDIR under the demo dir), so `stop` can end
every process it started without touching the operator's own tmux sessions.
"""
from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket
import sys
from importlib.resources import as_file, files
from pathlib import Path

import sim
from console.profile import DEFAULT_GPU_QUERY, Profile, ProfileError, check_path, load_profile, write_profile
from sim import tinylm
from sim.tinycorpus import demo_questions
from console.host.base import CommandResult
from console.host.factory import env_prefix
from console.control.units import server_log_path, server_start_argv, server_stop_argv, tmux_target

# Where `sim` was imported from (site-packages, or a checkout): the stand-in, started under tmux, must
# import that same copy.
ROOT = Path(sim.__file__).resolve().parents[1]
TEMPLATE = files("console") / "demo.toml"
BASE_LOAD_SECONDS = 20.0


def default_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "eagle3-console" / "demo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _python() -> list[str]:
    # the stand-in must import `backend` whether or not the project is installed
    return ["env", f"PYTHONPATH={ROOT}", sys.executable]


def prepare(work_dir: Path, *, speed: float = 1.0, port: int | None = None, seed_shape: bool = False,
            vllm_version: str | None = None) -> Profile:
    """Write the effective demo profile and the demo dataset; return the profile. `seed_shape`: training
    asks for one of the GPUs the server holds, as on the seed host (it still computes on the CPU).
    `vllm_version`: the release the stand-in imitates (its /version, log lines and errors; sim/versions.py)."""
    work_dir = work_dir.resolve()
    (work_dir / "tmux").mkdir(parents=True, exist_ok=True)
    os.chmod(work_dir / "tmux", 0o700)  # tmux refuses a socket directory others can write
    data_dir = work_dir / "data"
    data_dir.mkdir(exist_ok=True)
    with as_file(TEMPLATE) as template:
        p = load_profile(template)
    state = str(work_dir / "gpus.json")
    p.paths.work_dir = str(work_dir)
    p.paths.data_dir = str(data_dir)
    p.paths.python = sys.executable
    p.server.port = port or _free_port()
    count = p.gpus.count or 8
    p.server.command = [
        *_python(), "-m", "sim.vllm_server", "--host", "127.0.0.1", "--port", str(p.server.port),
        "--model", p.server.model_path, "--served-model-name", p.server.model_id,
        "--load-seconds", f"{BASE_LOAD_SECONDS / max(speed, 0.01):g}", "--tensor-parallel-size", str(count),
        "--gpu-state", state, "--weights-gib", f"{p.server.expected_weights_gib or 70:g}",
        "--stats-interval", "5",
        # a tiny real language model when the `train` extra is installed, canned text otherwise;
        # the console's header and `status` say which
        "--text-backend", "auto",
        # answers take a couple of seconds, as on a real server, so generation is watchable
        "--latency", f"{0.5 / max(speed, 0.01):g}", "--latency-per-token", f"{0.01 / max(speed, 0.01):g}",
        *(["--vllm-version", vllm_version] if vllm_version else []),
    ]
    p.gpus.command = [*_python(), "-m", "sim.nvidia_smi", "--state", state, *DEFAULT_GPU_QUERY[1:]]
    if seed_shape:
        p.train.gpus = 1
    dataset = data_dir / "demo-prompts.jsonl"
    write_demo_dataset(dataset)
    p.generate.dataset = str(dataset)
    # the drafter stages' verifier is the stand-in's own tiny model (built at its first use)
    verifier = str(tinylm.model_dir())
    if check_path(verifier) is None:
        p.drafter.verifier = verifier
    write_profile(p, work_dir / "profile.toml", overwrite=True)
    p.source = str(work_dir / "profile.toml")
    return p


def write_demo_dataset(path: Path, rows: int = 500) -> None:
    """Small ShareGPT-shaped prompts (as open-perfectblend), made here: nothing is downloaded."""
    if path.exists():
        return
    lines = []
    # distinct questions drawn from those the tiny verifier was trained on, so its answers stay on topic
    for q in demo_questions(rows):
        lines.append(json.dumps({"conversations": [{"from": "human", "value": q},
                                                   {"from": "gpt", "value": "(original answer, dropped)"}],
                                 "source": "demo"}))
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


async def _run(argv: list[str], timeout: float = 60) -> CommandResult:
    from console.host.local import LocalHost
    return await LocalHost().run(argv, timeout=timeout)


async def running(work_dir: Path) -> Profile | None:
    """The profile of the demo already running in `work_dir` (its server's pane is alive), else None."""
    path = effective_profile(work_dir)
    if not path.exists():
        return None
    try:
        profile = load_profile(path)
    except ProfileError:
        return None
    panes = await _run(env_prefix(profile.paths.work_dir)
                       + ["tmux", "list-panes", "-t", tmux_target(profile.server.unit), "-F", "#{pane_dead}"])
    return profile if panes.ok and "0" in panes.stdout.split() else None


async def start(work_dir: Path, *, speed: float = 1.0, seed_shape: bool = False,
                vllm_version: str | None = None) -> Profile:
    """Start the demo host, or return the running one's profile untouched: rewriting it (a new port)
    would cut every console and stage using the running server off from it."""
    existing = await running(work_dir)
    if existing is not None:
        return existing
    profile = prepare(work_dir, speed=speed, seed_shape=seed_shape, vllm_version=vllm_version)
    argv = env_prefix(profile.paths.work_dir) + server_start_argv(profile, server_log_path(profile))
    res = await _run(argv)
    if not res.ok and "already running" not in res.stderr:
        raise RuntimeError(f"could not start the demo server: {shlex.join(argv)}\n{res.stderr.strip()}")
    return profile


def effective_profile(work_dir: Path) -> Path:
    return work_dir.resolve() / "profile.toml"


async def stop(work_dir: Path) -> list[str]:
    """SIGTERM the stand-in and every stage session, then end the demo's own tmux server."""
    path = effective_profile(work_dir)
    if not path.exists():
        return []
    profile = load_profile(path)
    prefix = env_prefix(profile.paths.work_dir)
    done = []
    sessions = await _run(prefix + ["tmux", "list-sessions", "-F", "#{session_name}"])
    names = sessions.stdout.split() if sessions.ok else []
    from console.control.units import UnitNameError, tmux_stop_argv
    for name in names:
        try:
            argv = server_stop_argv(profile) if name == profile.server.unit else tmux_stop_argv(name, 20)
        except UnitNameError:
            continue  # not one of ours: kill-server below ends it
        await _run(prefix + argv, timeout=90)
        done.append(name)
    await _run(prefix + ["tmux", "kill-server"])
    return done
