"""A non-root SSH user on the booted systemd rig, without a polkit rule or sudo: every stage and server
starts with systemd-run on the system manager and every switch runs systemctl stop/start, which the rig's
systemd refuses that user (the rig has no polkit agent, no polkitd, no sudo: the refusal is systemd's
own). `profile init --from-unit` writes `sudo = true` for that user; `profile check` says the user cannot
manage units, with the fix (sudo, or the polkit rule for that user, shown), under either setting; a stage
start and a server switch are refused with the same fix before anything is stopped."""
from __future__ import annotations

import uuid

import pytest

from console.profile import load_profile
from console.session import Session
from harness.rig.sim_unit import install_unit
from harness.rig.remote import cli, sh, wait_health

pytestmark = [pytest.mark.rig, pytest.mark.timeout(240)]
USER = "e3op"


async def add_user(ssh, user: str) -> None:
    """A login user with the rig client's key (the rig's sshd runs with StrictModes no)."""
    script = ('id -u "$1" >/dev/null 2>&1 || useradd --create-home --shell /bin/sh "$1"; '
              'mkdir -p "/home/$1/.ssh" && cp /root/.ssh/authorized_keys "/home/$1/.ssh/" && '
              'chown -R "$1" "/home/$1/.ssh"; chmod o+x /root')
    await sh(ssh, script, user)


def as_user(path, user: str, work_dir: str, sudo: bool | None = None):
    text = path.read_text().replace('user = "root"', f'user = "{user}"', 1)
    text = text.replace('work_dir = "/root/', f'work_dir = "/home/{user}/', 1) if work_dir else text
    if sudo is not None:
        text = text.replace("sudo = true\n", "").replace("[server]\n", f"[server]\nsudo = {str(sudo).lower()}\n", 1)
    path.write_text(text)
    return path


async def test_profile_init_and_check_for_a_user_who_may_not_manage_units(systemd_rig, rig_ssh, tmp_path):
    await add_user(rig_ssh, USER)
    name = f"e3perm-{uuid.uuid4().hex[:8]}"
    unit = "\n".join(["[Unit]", "Description=seed-shaped unit", "", "[Service]", "Type=simple",
                      "ExecStart=/opt/venv/bin/vllm serve /shared/kimi-k2.5-int4 --tensor-parallel-size 8 "
                      "--trust-remote-code --reasoning-parser kimi_k2", ""])
    await sh(rig_ssh, 'cat > "$1" && systemctl daemon-reload', f"/etc/systemd/system/{name}.service", input=unit)
    try:
        path = tmp_path / "op.toml"
        connect = ["--host", "127.0.0.1", "--port", str(systemd_rig.port), "--user", USER,
                   "--identity-file", str(systemd_rig.identity_file), "--known-hosts", str(systemd_rig.known_hosts)]
        res = cli("profile", "init", str(path), *connect, "--from-unit", name, "--work-dir", f"/home/{USER}/e3")
        assert res.returncode == 0, res.stderr
        assert load_profile(path).server.sudo is True  # not root: systemctl and systemd-run through sudo -n

        # sudo = true, and the rig has no sudo for the user: said with both fixes
        res = cli("profile", "check", str(path))
        assert res.returncode == 1, res
        assert (f"error: permission: the profile says [server] sudo = true, but {USER} cannot run sudo without a "
                f"password on 127.0.0.1 (`sudo -n systemctl --version`: ") in res.stderr, res.stderr
        assert f"Fix: give {USER} passwordless sudo" in res.stderr
        assert f"unit {name}: matches the profile" in res.stdout  # the unit itself is read and matches

        # sudo = false: systemd itself refuses the user, said with the fix and the polkit rule for that user
        as_user(path, USER, "", sudo=False)
        res = cli("profile", "check", str(path))
        assert res.returncode == 1, res
        assert (f"error: permission: {USER} may not start or stop systemd units on 127.0.0.1 without a password"
                in res.stderr), res.stderr
        assert "(`systemctl start --no-ask-password eagle3-console-permission-probe-nonexistent.service`: " \
               in res.stderr
        assert "Fix: set [server] sudo = true in the profile" in res.stderr
        assert f'action.id == "org.freedesktop.systemd1.manage-units" && subject.user == "{USER}"' in res.stderr
        assert "return polkit.Result.YES;" in res.stderr

        # root may: the check says so and passes
        root = tmp_path / "root.toml"
        res = cli("profile", "init", str(root), *connect[:4], "--user", "root", *connect[6:], "--from-unit", name,
                  "--work-dir", "/root/e3")
        assert res.returncode == 0 and load_profile(root).server.sudo is False, res.stderr
        res = cli("profile", "check", str(root))
        assert res.returncode == 0 and "permission" not in res.stdout + res.stderr, res
    finally:
        await sh(rig_ssh, 'rm -f "$1" && systemctl daemon-reload', f"/etc/systemd/system/{name}.service")


async def test_a_stage_and_a_switch_are_refused_before_anything_is_stopped(systemd_rig, rig_ssh, tmp_path):
    await add_user(rig_ssh, USER)
    unit = await install_unit(rig_ssh, systemd_rig, tmp_path, load_seconds=0.3)
    await rig_ssh.run(["systemctl", "start", unit.name], check=True, timeout=30)
    try:
        await wait_health(rig_ssh, unit.port)
        profile = load_profile(as_user(unit.profile_path, USER, unit.work_dir))
        assert profile.host.user == USER and not profile.server.sudo
        async with Session(profile, interval=0.5) as session:
            started = await session.start_stage("extract", input_run="p1")
            switched = await session.serve_drafter()
            restarted = await session.restart_server()
        for result in (started, switched, restarted):
            assert not result.ok
            assert f"{USER} may not start or stop systemd units on 127.0.0.1 without a password" in result.message, \
                result.message
            assert "Nothing was stopped. Fix: set [server] sudo = true in the profile" in result.message
            assert f'subject.user == "{USER}"' in result.message
        # nothing was stopped, started or written: the baseline answers, no stage unit, no work dir
        assert (await sh(rig_ssh, 'systemctl is-active "$1" || true', unit.name)).strip() == "active"
        await wait_health(rig_ssh, unit.port)
        units = await sh(rig_ssh, "systemctl list-units --all --plain --no-legend 'e3-*' 'eagle3-*' || true")
        assert "extract" not in units, units
        assert (await sh(rig_ssh, 'test -e "$1" && echo yes || echo no', f"/home/{USER}/e3rig")).strip() == "no"
    finally:
        await rig_ssh.run(["systemctl", "stop", unit.name], timeout=60)
