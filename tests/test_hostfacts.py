"""The host's facts recorded with each run and shown by `status --json` (on the demo host), and the
preflight's host-integrity checks, each on a real instance of the problem: two vLLM packages on the path,
two `vllm` executables on PATH, a driver older than torch's CUDA build (warnings), a leftover listener on
the port (the switch's refusal: tests/test_switch_leftover.py)."""
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
TORCH_VERSION_PY = "__version__ = '2.7.0+cu128'\ndebug = False\ncuda: Optional[str] = '12.8'\nhip = None\n"


def checks(report: PreflightReport) -> dict:
    return {c.name: c for c in report.checks}


def test_parsers_on_real_samples():
    assert hostfacts.parse_torch_cuda(TORCH_VERSION_PY) == "12.8"
    assert hostfacts.parse_torch_cuda("cuda: Optional[str] = None\n") is None


def test_two_vllm_packages_on_the_path_are_flagged(tmp_path):
    for site in ("a", "b"):
        (tmp_path / site / "vllm").mkdir(parents=True)
        (tmp_path / site / "vllm" / "__init__.py").write_text("")
    report = PreflightReport()
    hostfacts.check_integrity(report, sys_path=[str(tmp_path / "a"), str(tmp_path / "b")], path_env="",
                              torch_cuda_build=None, driver=None)
    got = checks(report)["vllm_installs"]
    assert not got.ok and str(tmp_path / "a" / "vllm") in got.detail and "pip uninstall vllm" in got.fix
    assert got.warning and report.ok and report.warnings()  # said, never a refusal
    one = PreflightReport()
    hostfacts.check_integrity(one, sys_path=[str(tmp_path / "a")], path_env="", torch_cuda_build=None,
                              driver=None)
    assert checks(one)["vllm_installs"].ok


def test_two_vllm_executables_on_path_are_flagged(tmp_path):
    for d in ("bin1", "bin2"):
        (tmp_path / d).mkdir()
        exe = tmp_path / d / "vllm"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    report = PreflightReport()
    hostfacts.check_integrity(report, sys_path=[], path_env=f"{tmp_path / 'bin1'}:{tmp_path / 'bin2'}",
                              torch_cuda_build=None, driver=None)
    assert not checks(report)["vllm_installs"].ok


def test_a_driver_older_than_torchs_cuda_build_is_a_warning_naming_both_versions():
    report = PreflightReport()
    hostfacts.check_integrity(report, sys_path=[], path_env="", torch_cuda_build="12.8", driver="550.54.15")
    got = checks(report)["driver_cuda"]
    assert not got.ok and got.warning and report.ok
    assert "driver 550.54.15 is older than 570.26" in got.detail and "CUDA 12.8" in got.detail
    assert "minor version compatibility" in got.detail
    dead = PreflightReport()
    hostfacts.check_integrity(dead, sys_path=[], path_env="", torch_cuda_build="12.8", driver="520.61.05")
    assert "cannot initialize" in checks(dead)["driver_cuda"].detail
    ok = PreflightReport()
    hostfacts.check_integrity(ok, sys_path=[], path_env="", torch_cuda_build="12.8", driver="570.133.20")
    assert checks(ok)["driver_cuda"].ok
    # a release between the table's rows takes the nearest older one of its major
    assert hostfacts.driver_needed("12.7") == ("560.28.03", "525.60.13")
    assert hostfacts.driver_needed("9.2") is None


def test_the_simulated_nvidia_smi_reports_an_old_driver_on_request(tmp_path, monkeypatch):
    """The demo host's knob: EAGLE3_SIM_DRIVER_VERSION is what its nvidia-smi says, and the warning follows."""
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps({"gpus": [{"index": 0, "name": "NVIDIA H200"}]}))
    monkeypatch.setenv("EAGLE3_SIM_DRIVER_VERSION", "535.54.03")
    smi = [sys.executable, "-m", "sim.nvidia_smi", "--state", str(state)]
    assert hostfacts.driver_version(smi) == "535.54.03"
    report = PreflightReport()
    hostfacts.check_integrity(report, sys_path=[], path_env="", torch_cuda_build="12.8", nvidia_smi=smi)
    assert "driver 535.54.03 is older than 570.26" in checks(report)["driver_cuda"].detail


def _listener() -> tuple[subprocess.Popen, int]:
    child = subprocess.Popen([sys.executable, "-c", "import socket,sys,time\n"
                              "s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\n"
                              "print(s.getsockname()[1], flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    return child, int(child.stdout.readline())


def test_the_serving_command_is_the_listeners_own_argv():
    child, port = _listener()
    try:
        argv = hostfacts.serving_command(f"http://127.0.0.1:{port}")
        assert argv is not None and argv[0] == sys.executable and argv[1] == "-c"
    finally:
        child.kill()
        child.wait()
    assert hostfacts.serving_command(f"http://127.0.0.1:{port}") is None
    assert hostfacts.serving_command("not a url") is None


def test_the_facts_keep_the_servers_command_lines_redacted():
    facts = hostfacts.collect(server_command=["vllm", "serve", "m", "--api-key", "sk-1"],
                              servers={"baseline": ["vllm", "serve", "--api-key=sk-2"], "none": []})
    assert facts["server_command"] == ["vllm", "serve", "m", "--api-key", "***"]
    assert facts["servers"] == {"baseline": ["vllm", "serve", "--api-key=***"]}
    kept = host_facts({**facts, "servers": {"baseline\x1b[2J": ["a\x07"]}})
    assert kept["servers"] == {"baseline": ["a"]} and kept["server_command"][-1] == "***"


def test_a_listener_while_every_server_is_down_is_a_leftover():
    child, port = _listener()
    try:
        why = hostfacts.leftover_on_port(port, units=["vllm-kimi"], servers_down=True)
        assert why is not None and f"pid {child.pid}" in why
        # while a plan server runs (or nobody can tell), a listener this user cannot place is its own
        assert hostfacts.leftover_on_port(port, units=["vllm-kimi"], servers_down=False) is None
        assert hostfacts.leftover_on_port(port, units=["vllm-kimi"], servers_down=None) is None
        assert "stop the leftover" in hostfacts.leftover_message(port, why)
    finally:
        child.kill()
        child.wait()
    assert hostfacts.leftover_on_port(port, units=[], servers_down=True) is None


def test_a_listener_in_another_systemd_service_is_a_leftover(tmp_path):
    """/proc as a host with systemd shows it (a copy: this machine's processes run in no service): a socket
    listening on the port, held by a pid whose cgroup is another model's service."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (proc / "net" / "tcp").write_text(header + "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 "
                                      "00000000     0        0 424242 1 0000000000000000 100 0 0 10 0\n")
    for pid, unit in ((4711, "vllm-old-model.service"), (4712, "vllm-kimi.service")):
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(f"0::/system.slice/{unit}\n")
        (proc / str(pid) / "cmdline").write_bytes(b"vllm\0serve\0/models/old\0")
    os.symlink("socket:[424242]", proc / "4711" / "fd" / "7")
    why = hostfacts.leftover_on_port(8000, units=["vllm-kimi"], servers_down=False, proc=str(proc))
    assert why == "pid 4711 in vllm-old-model.service listens (vllm serve /models/old)"
    assert hostfacts.leftover_on_port(8000, units=["vllm-old-model"], servers_down=False, proc=str(proc)) is None


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
        # the baseline's command line as it runs: the stand-in the demo host's tmux session started
        assert facts["server_command"][1:3] == ["-m", "sim.vllm_server"], facts.get("server_command")
        snap = json.loads(cli("status", "--profile", profile, "--json").stdout)
        run = next(r for r in snap["runs"] if r["run_id"] == "facts")
        assert run["host"]["torch_version"] == facts["torch_version"]
        assert run["host"]["server_command"] == facts["server_command"]
        # the generation's throughput smoke, as its start recorded it (issue 31 item 9)
        assert run["smoke"]["requests"] > 0 and run["smoke"]["history_runs"] == 0
    finally:
        cli("demo-host", "stop", "--dir", str(demo_dir), timeout=60)
