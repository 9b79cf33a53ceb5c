"""The operator's unit is the source of the derived servers, on the booted systemd rig: a unit with
Environment= lines (one holding a space), EnvironmentFile=s (one optional and missing), User=,
WorkingDirectory= and a `${VAR}` in its ExecStart; the drafter server started by the session runs that
command line, expanded the same way, as that user, in that directory, with that environment
(/proc/PID/environ), and the shown commands do not print the unit's secret."""
from __future__ import annotations

import sys
import uuid

import pytest

from console.control.drafter_server import drafter_unit
from console.control.operator_unit import read_server_program
from console.profile import load_profile
from console.session import Session
from harness.rig import keys
from harness.rig.remote import cli, put_verify_run, sh, wait_health
from harness.rig.sim_unit import MODEL_PATH, REPO, SERVED, write_profile

pytestmark = [pytest.mark.rig, pytest.mark.timeout(240)]
SERVICE_USER = "e3svc"
SECRET = "hf_not_a_real_token_123"


async def proc_of(ssh, unit: str) -> str:
    pid = (await sh(ssh, 'systemctl show "$1" -p MainPID --value', unit)).strip()
    assert pid not in ("", "0"), f"{unit} has no main process"
    return f"/proc/{pid}"


async def install_service_unit(ssh, name: str, port: int, service_dir: str) -> list[str]:
    """The unit, its environment file, its user and its directory; returns ExecStart's argv as written."""
    argv = [sys.executable, "-m", "sim.vllm_server", "--model", MODEL_PATH, "--served-model-name", SERVED,
            "--host", "127.0.0.1", "--port", "${E3_PORT}", "--load-seconds", "0.3", "--shards", "2",
            "--gpus", "2", "--gpu-state", f"{service_dir}/gpus.json"]
    unit = "\n".join([
        "[Unit]", f"Description=vLLM stand-in {name}", "",
        "[Service]", "Type=simple", f"User={SERVICE_USER}", f"WorkingDirectory={service_dir}",
        f"Environment=PYTHONPATH={REPO} PYTHONUNBUFFERED=1 E3_PORT={port}",
        'Environment=NCCL_P2P_DISABLE=1 "NCCL_IB_HCA=mlx5_0 mlx5_1"',
        f"EnvironmentFile=/etc/default/{name}", f"EnvironmentFile=-/etc/default/{name}-missing",
        "ExecStart=" + " ".join(argv), "Restart=no", "TimeoutStopSec=20", "",
    ])
    # the service user must reach the interpreter bind-mounted under the rig's /root
    script = ('id -u "$4" >/dev/null 2>&1 || useradd --system --no-create-home "$4"; chmod o+x /root; '
              'mkdir -p "$3" && chown "$4" "$3"; printf "FROM_FILE=yes\\nHF_TOKEN=%s\\n" "$5" > "/etc/default/$2"; '
              'cat > "$1" && systemctl daemon-reload')
    await sh(ssh, script, f"/etc/systemd/system/{name}.service", name, service_dir, SERVICE_USER, SECRET,
             input=unit)
    return argv


async def test_drafter_server_runs_the_units_command_with_its_environment_and_user(systemd_rig, rig_ssh,
                                                                                     tmp_path):
    name = f"e3unit-{uuid.uuid4().hex[:8]}"
    port = keys.free_port()
    service_dir = f"/srv/{name}"
    argv = await install_service_unit(rig_ssh, name, port, service_dir)
    profile = load_profile(write_profile(tmp_path / f"{name}.toml", systemd_rig, name, port, f"/root/e3rig/{name}"))
    checkpoint = f"{profile.paths.work_dir}/ck/checkpoint_best"
    await put_verify_run(rig_ssh, tmp_path, profile.paths.work_dir, checkpoint)
    drafter = drafter_unit(profile)
    await rig_ssh.run(["systemctl", "start", name], check=True, timeout=30)
    try:
        await wait_health(rig_ssh, port)
        program = await read_server_program(rig_ssh, profile)
        assert program.argv == tuple(argv) and program.note is None  # exact, `${E3_PORT}` as systemd stored it
        assert program.user == SERVICE_USER and program.working_dir == service_dir
        assert program.env_files == ((f"/etc/default/{name}", False), (f"/etc/default/{name}-missing", True))
        async with Session(profile, interval=0.5) as session:
            await session.settle()
            result = await session.serve_drafter()
            assert result.ok, result
            assert SECRET not in "\n".join(result.commands) and SECRET not in result.message
            await wait_health(rig_ssh, port)  # the drafter server listens where the unit's ${E3_PORT} says
            proc = await proc_of(rig_ssh, drafter)
            environ = dict(kv.split("=", 1) for kv in (await sh(rig_ssh, 'cat "$1"', f"{proc}/environ")).split("\0")
                           if "=" in kv)
            assert environ["NCCL_P2P_DISABLE"] == "1" and environ["NCCL_IB_HCA"] == "mlx5_0 mlx5_1"
            assert environ["FROM_FILE"] == "yes" and environ["HF_TOKEN"] == SECRET
            assert environ["PYTHONPATH"] == str(REPO) and environ["E3_PORT"] == str(port)
            uid = (await sh(rig_ssh, 'id -u "$1"', SERVICE_USER)).strip()
            status = await sh(rig_ssh, 'cat "$1"', f"{proc}/status")
            assert any(line.split()[1:2] == [uid] for line in status.splitlines() if line.startswith("Uid:"))
            assert (await sh(rig_ssh, 'readlink "$1"', f"{proc}/cwd")).strip() == service_dir
            cmdline = (await sh(rig_ssh, 'cat "$1"', f"{proc}/cmdline")).rstrip("\0").split("\0")
            expanded = [a.replace("${E3_PORT}", str(port)) for a in argv]
            assert cmdline[:len(argv)] == expanded and cmdline[len(argv)] == "--speculative-config"
            back = await session.serve_baseline()
            assert back.ok, back
    finally:
        await rig_ssh.run(["systemctl", "stop", drafter, name], timeout=60)


async def test_a_unit_running_as_a_third_user_is_refused_before_the_swap(systemd_rig, rig_ssh, tmp_path):
    """User=e3svc, SSH as root: the extraction server would run as e3svc and could not write the staging
    dir nor open the server lock the SSH user's commands create; extract is refused naming the unit, both
    users and the fix, and the baseline keeps running."""
    name = f"e3unit-{uuid.uuid4().hex[:8]}"
    port = keys.free_port()
    await install_service_unit(rig_ssh, name, port, f"/srv/{name}")
    profile = load_profile(write_profile(tmp_path / f"{name}.toml", systemd_rig, name, port, f"/root/e3rig/{name}"))
    verifier = f"/root/e3rig/{name}-verifier"
    await sh(rig_ssh, 'mkdir -p "$1" && cat > "$1/config.json"', verifier,
             input='{"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 16, "vocab_size": 100}')
    profile.drafter.verifier, profile.drafter.aux_layer_ids = verifier, [2, 4, 5]
    await rig_ssh.run(["systemctl", "start", name], check=True, timeout=30)
    try:
        await wait_health(rig_ssh, port)
        async with Session(profile, interval=0.5) as session:
            result = await session.start_stage("extract", input_run="prep1")
        assert not result.ok
        assert (f"the unit {name} runs as User={SERVICE_USER}, the SSH user is root: the extraction server runs "
                f"as {SERVICE_USER} and could not write its staging dir" in result.message), result.message
        assert (f'Fix: connect as {SERVICE_USER} ([host].user = "{SERVICE_USER}" in the profile), or run the unit '
                f"as root (User= in the unit, e.g. a `systemctl edit {name}` drop-in); nothing was stopped"
                in result.message), result.message
        assert (await sh(rig_ssh, 'systemctl is-active "$1" || true', name)).strip() == "active"
        assert (await sh(rig_ssh, 'systemctl is-active "$1" || true', f"{name}-extract")).strip() != "active"
        await wait_health(rig_ssh, port)
    finally:
        await rig_ssh.run(["systemctl", "stop", name], timeout=60)


async def test_profile_init_from_unit_and_check_reports_drift(systemd_rig, rig_ssh, tmp_path):
    """The seed unit's shape (no --served-model-name), installed but never started: `profile init
    --from-unit` writes a profile that `profile check` finds matching; a served id edited in is drift."""
    name = f"e3seed-{uuid.uuid4().hex[:8]}"
    unit = "\n".join(["[Unit]", "Description=seed-shaped unit", "", "[Service]", "Type=simple",
                      "Environment=NCCL_P2P_DISABLE=1",
                      "ExecStart=/opt/venv/bin/vllm serve /shared/kimi-k2.5-int4 --tensor-parallel-size 8 "
                      "--trust-remote-code --tool-call-parser kimi_k2 --reasoning-parser kimi_k2 --port 8011", ""])
    await sh(rig_ssh, 'cat > "$1" && systemctl daemon-reload', f"/etc/systemd/system/{name}.service", input=unit)
    path = tmp_path / "from-unit.toml"
    connect = ["--host", "127.0.0.1", "--port", str(systemd_rig.port), "--user", systemd_rig.username,
               "--identity-file", str(systemd_rig.identity_file), "--known-hosts", str(systemd_rig.known_hosts)]
    res = cli("profile", "init", str(path), *connect, "--from-unit", name, "--work-dir", f"/root/e3rig/{name}")
    assert res.returncode == 0, res.stderr
    assert "served as /shared/kimi-k2.5-int4" in res.stdout and "tensor parallel size 8" in res.stdout
    p = load_profile(path)
    assert (p.server.unit, p.server.model_path, p.server.served_model_name, p.server.port) == (
        name, "/shared/kimi-k2.5-int4", None, 8011)
    assert p.server.reasoning_parser == "kimi_k2" and p.server.model_id == "/shared/kimi-k2.5-int4"
    assert p.drafter.trust_remote_code is True and "trust_remote_code = true" in path.read_text()
    again = cli("profile", "init", str(path), *connect, "--from-unit", name, "--work-dir", "/x")
    assert again.returncode == 2 and "already exists" in again.stderr

    res = cli("profile", "check", str(path))
    assert res.returncode == 0 and f"unit {name}: matches the profile" in res.stdout, res
    path.write_text(path.read_text().replace("[server]\n", '[server]\nserved_model_name = "kimi-k2.5-int4"\n', 1))
    res = cli("profile", "check", str(path))
    assert res.returncode == 1, res
    assert "served model id: the profile says 'kimi-k2.5-int4', the unit serves '/shared/kimi-k2.5-int4'" in res.stdout
    assert cli("profile", "check", str(path), "--offline").returncode == 0
    path.write_text(path.read_text().replace("trust_remote_code = true", "trust_remote_code = false", 1))
    res = cli("profile", "check", str(path))
    assert "drafter.trust_remote_code: the profile says false, the unit passes --trust-remote-code" in res.stdout

    missing = cli("profile", "init", str(tmp_path / "none.toml"), *connect, "--from-unit", "e3-no-such-unit",
                  "--work-dir", "/x")
    assert missing.returncode == 2 and "LoadState=not-found" in missing.stderr
    await sh(rig_ssh, 'rm -f "$1" && systemctl daemon-reload', f"/etc/systemd/system/{name}.service")
