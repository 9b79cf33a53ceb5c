"""The host's facts recorded with each run and shown by `status --json` (on the demo host), and the
preflight's host-integrity checks, each on a real instance of the problem: two vLLM packages on the path,
two `vllm` executables on PATH, a driver older than torch's CUDA build, a leftover listener on the port."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from backend.kit import hostfacts
from backend.kit.preflight import PreflightReport
from console.telemetry.runs import host_facts

ROOT = Path(__file__).resolve().parents[1]
# nvidia-smi's header, as a 570 driver prints it
SMI_HEADER = ("+-----------------------------------------------------------------------------------------+\n"
              "| NVIDIA-SMI 570.133.20             Driver Version: 570.133.20     CUDA Version: 12.8     |\n")
TORCH_VERSION_PY = "__version__ = '2.7.0+cu128'\ndebug = False\ncuda: Optional[str] = '12.8'\nhip = None\n"


def checks(report: PreflightReport) -> dict:
    return {c.name: c for c in report.checks}


def test_parsers_on_real_samples():
    assert hostfacts.parse_driver_cuda(SMI_HEADER) == "12.8"
    assert hostfacts.parse_torch_cuda(TORCH_VERSION_PY) == "12.8"
    assert hostfacts.parse_torch_cuda("cuda: Optional[str] = None\n") is None


def test_two_vllm_packages_on_the_path_are_flagged(tmp_path):
    for site in ("a", "b"):
        (tmp_path / site / "vllm").mkdir(parents=True)
        (tmp_path / site / "vllm" / "__init__.py").write_text("")
    report = PreflightReport()
    hostfacts.check_integrity(report, sys_path=[str(tmp_path / "a"), str(tmp_path / "b")], path_env="",
                              torch_cuda_build=None, smi_header=None)
    got = checks(report)["vllm_installs"]
    assert not got.ok and str(tmp_path / "a" / "vllm") in got.detail and "pip uninstall vllm" in got.fix
    one = PreflightReport()
    hostfacts.check_integrity(one, sys_path=[str(tmp_path / "a")], path_env="", torch_cuda_build=None,
                              smi_header=None)
    assert checks(one)["vllm_installs"].ok


def test_two_vllm_executables_on_path_are_flagged(tmp_path):
    for d in ("bin1", "bin2"):
        (tmp_path / d).mkdir()
        exe = tmp_path / d / "vllm"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    report = PreflightReport()
    hostfacts.check_integrity(report, sys_path=[], path_env=f"{tmp_path / 'bin1'}:{tmp_path / 'bin2'}",
                              torch_cuda_build=None, smi_header=None)
    assert not checks(report)["vllm_installs"].ok


def test_a_driver_older_than_torchs_cuda_build_is_flagged():
    report = PreflightReport()
    hostfacts.check_integrity(report, sys_path=[], path_env="", torch_cuda_build="12.9", smi_header=SMI_HEADER)
    got = checks(report)["driver_cuda"]
    assert not got.ok and "CUDA 12.9" in got.detail and "up to CUDA 12.8" in got.detail
    ok = PreflightReport()
    hostfacts.check_integrity(ok, sys_path=[], path_env="", torch_cuda_build="12.8", smi_header=SMI_HEADER)
    assert checks(ok)["driver_cuda"].ok


def test_a_leftover_listener_on_the_port_is_flagged_the_units_server_is_not(tmp_path):
    # a real process listening on loopback, not the unit's server
    child = subprocess.Popen([sys.executable, "-c", "import socket,sys,time\n"
                              "s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\n"
                              "print(s.getsockname()[1], flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        report = PreflightReport()
        hostfacts.check_integrity(report, port=port, sys_path=[], path_env="", torch_cuda_build=None,
                                  smi_header=None)
        got = checks(report)["server_port"]
        assert not got.ok and f"pid {child.pid} listens" in got.detail and str(child.pid) in got.fix
        own = PreflightReport()
        hostfacts.check_integrity(own, port=port, server_pids=[child.pid], sys_path=[], path_env="",
                                  torch_cuda_build=None, smi_header=None)
        assert checks(own)["server_port"].ok
    finally:
        child.kill()
        child.wait()


def test_the_checkpoint_hash_changes_with_its_config_and_weights(tmp_path):
    (tmp_path / "config.json").write_text('{"a": 1}')
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    first = hostfacts.checkpoint_hash(str(tmp_path))
    assert first is not None and first["weight_files"] == 1 and "sizes" in first["method"]
    (tmp_path / "model.safetensors").write_bytes(b"x" * 11)
    assert hostfacts.checkpoint_hash(str(tmp_path))["sha256"] != first["sha256"]


def test_the_console_keeps_known_facts_only_cleaned():
    got = host_facts({"vllm_version": "0.11\x1b[31m", "evil": "x", "server_command": ["vllm", "serve"],
                      "checkpoint": {"sha256": "ab", "junk": 1}})
    assert got == {"vllm_version": "0.11", "server_command": ["vllm", "serve"], "checkpoint": {"sha256": "ab"}}
    assert host_facts("nope") is None


@pytest.mark.timeout(300)
def test_a_run_on_the_demo_host_records_the_host_facts_and_status_json_shows_them(tmp_path):
    demo_dir = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TMUX", None)

    def cli(*args: str, timeout: float = 200) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=ROOT)

    try:
        start = cli("demo-host", "start", "--dir", str(demo_dir), "--speed", "20")
        assert start.returncode == 0, start.stderr
        profile = start.stdout.strip()
        assert cli("wait-ready", "--profile", profile, "--timeout", "120").returncode == 0
        gen = cli("run", "generate", "--profile", profile, "--limit", "2", "--run-id", "facts", "--wait")
        assert gen.returncode == 0, gen.stderr[-2000:]
        summary = json.loads((demo_dir / "runs" / "facts" / "summary.json").read_text())
        facts = summary["host"]
        assert facts["torch_version"] and facts["python"] == sys.version.split()[0]
        assert "vllm_version" in facts and "driver_version" in facts and "torch_cuda" in facts
        snap = json.loads(cli("status", "--profile", profile, "--json").stdout)
        run = next(r for r in snap["runs"] if r["run_id"] == "facts")
        assert run["host"]["torch_version"] == facts["torch_version"]
    finally:
        cli("demo-host", "stop", "--dir", str(demo_dir), timeout=60)
