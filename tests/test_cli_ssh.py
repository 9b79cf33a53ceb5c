"""The headless commands over a real SSH connection (loopback sshd): host keys, status, server control."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
from harness.sim_support import PYTHON

pytestmark = pytest.mark.rig
ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, input=input)


def write_profile(tmp_path: Path, sshd, known_hosts: Path, **server) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    data = {
        "host": {"name": sshd.host, "port": sshd.port, "user": sshd.username,
                 "identity_file": str(sshd.identity_file), "known_hosts": str(known_hosts)},
        "server": {"manager": "tmux", "unit": f"e3t-{tmp_path.name[-12:].replace('_', '-')}",
                   "model_path": "/m", "served_model_name": "kimi-sim", "port": 1, **server},
        "paths": {"work_dir": str(work), "python": sys.executable},
        "gpus": {"command": [*PYTHON, "-m", "sim.nvidia_smi", "--state", str(work / "none.json"),
                             "--query-gpu=index,name,memory.used,memory.total,utilization.gpu,temperature.gpu,"
                             "power.draw", "--format=csv,noheader,nounits"]},
    }
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def test_unknown_host_key_is_refused_then_trusted_by_fingerprint(tmp_path, sshd_server):
    known = tmp_path / "known_hosts"
    known.write_text("")
    profile = write_profile(tmp_path, sshd_server, known)

    st = cli("status", "--profile", str(profile), "--json")
    snap = json.loads(st.stdout)
    assert st.returncode == 3 and snap["host"]["reachable"] is False
    assert "SHA256:" in snap["host"]["error"] and "trust-host" in snap["host"]["error"]

    wrong = cli("trust-host", "--profile", str(profile), "--fingerprint", "SHA256:not-it")
    assert wrong.returncode == 1 and known.read_text() == ""
    fp = next(w for w in wrong.stdout.split() if w.startswith("SHA256:"))
    noninteractive = cli("trust-host", "--profile", str(profile), input="y\n")
    assert noninteractive.returncode == 2 and known.read_text() == ""  # never accepted blindly

    ok = cli("trust-host", "--profile", str(profile), "--fingerprint", fp)
    assert ok.returncode == 0, ok.stderr
    assert f"[{sshd_server.host}]:{sshd_server.port}" in known.read_text()

    st = cli("status", "--profile", str(profile), "--json")
    snap = json.loads(st.stdout)
    assert st.returncode == 0, st.stdout + st.stderr
    assert snap["host"]["reachable"] is True and snap["host"]["error"] is None
    assert snap["service"]["active_state"] == "inactive"
    assert snap["server"]["phase"] == "stopped"
    assert len(snap["gpus"]) == 8 and snap["gpus"][0]["memory_total_mib"] > 0


def test_status_contract_keys_over_ssh(tmp_path, sshd_server):
    profile = write_profile(tmp_path, sshd_server, sshd_server.known_hosts)
    snap = json.loads(cli("status", "--profile", str(profile), "--json").stdout)
    assert set(snap["host"]) >= {"name", "reachable", "error"}
    assert set(snap["service"]) >= {"manager", "unit", "active_state", "sub_state", "restarts", "since"}
    assert set(snap["server"]) >= {"phase", "progress", "eta_s", "model_id", "max_model_len", "version", "error"}
    assert set(snap["gpus"][0]) >= {"index", "name", "memory_used_mib", "memory_total_mib", "utilization_pct",
                                    "temperature_c", "power_w"}
    assert isinstance(snap["runs"], list)


def test_destructive_commands_need_confirmation(tmp_path, sshd_server):
    profile = write_profile(tmp_path, sshd_server, sshd_server.known_hosts)
    res = cli("stop-server", "--profile", str(profile))
    assert res.returncode == 2 and "--yes" in res.stderr


def test_refused_key_is_reported_once_not_retried(tmp_path, sshd_server):
    """An unknown host key or a refused client key needs the operator: --watch and wait-ready say so and
    stop instead of knocking on sshd every second."""
    import time
    known = tmp_path / "known_hosts"
    known.write_text("")
    profile = write_profile(tmp_path, sshd_server, known)
    started = time.monotonic()
    watch = cli("status", "--profile", str(profile), "--watch", timeout=30)
    lines = [json.loads(l) for l in watch.stdout.splitlines()]
    assert len(lines) == 1 and "SHA256:" in lines[0]["host"]["error"]
    wait = cli("wait-ready", "--profile", str(profile), "--timeout", "600", timeout=30)
    assert wait.returncode == 2 and "SHA256:" in wait.stderr
    # it says what happened: the host is refused for good, not "timed out"
    assert "refused the connection for good" in wait.stderr and "timed out" not in wait.stderr
    assert time.monotonic() - started < 25  # neither waited out its own limit
