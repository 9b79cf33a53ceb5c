"""Whether the SSH user may manage systemd units (console/control/permissions.py), judged from the answers
systemd and sudo give the probe. Pure. The rig test (tests/test_permission_rig.py) sees the real refusal."""
from __future__ import annotations

import pytest

from console.control.permissions import PROBE_UNIT, judge, probe_argv
from console.host.base import CommandResult
from console.profile import profile_from_dict


def profile(sudo: bool):
    return profile_from_dict({"host": {"name": "gpu-host.example", "user": "ubuntu"}, "paths": {"work_dir": "/w"},
                              "server": {"model_path": "/m", "unit": "vllm-kimi", "sudo": sudo}})


def answer(rc: int, stderr: str) -> CommandResult:
    return CommandResult(argv=(), returncode=rc, stdout="", stderr=stderr)


def test_the_probe_has_no_side_effect():
    assert probe_argv(profile(False)) == ["systemctl", "start", "--no-ask-password", PROBE_UNIT]
    assert probe_argv(profile(True)) == ["sudo", "-n", "systemctl", "--version"]


@pytest.mark.parametrize("stderr", [
    # polkit with no agent over SSH (the seed host's ubuntu), and systemd without polkit (the rig)
    "Failed to start eagle3-console-permission-probe-nonexistent.service: Interactive authentication required.\n"
    "See system logs and 'systemctl status eagle3-console-permission-probe-nonexistent.service' for details.\n",
    "Failed to start eagle3-console-permission-probe-nonexistent.service: Access denied\n",
])
def test_a_user_polkit_refuses_gets_the_fix(stderr):
    verdict = judge(profile(False), "ubuntu", answer(4, stderr))
    assert not verdict.ok
    assert verdict.message.startswith("ubuntu may not start or stop systemd units on gpu-host.example without a "
                                      "password")
    assert "Fix: set [server] sudo = true in the profile (with passwordless sudo for ubuntu)" in verdict.message
    assert 'subject.user == "ubuntu"' in verdict.message and "\n" in verdict.message  # the rule, shown


def test_a_unit_not_found_means_the_user_may_manage_units():
    verdict = judge(profile(False), "ubuntu", answer(5, "Failed to start x.service: Unit x.service not found.\n"))
    assert verdict.ok


@pytest.mark.parametrize("stderr", ["sudo: a password is required\n", "sh: 1: sudo: not found\n",
                                    "ubuntu is not in the sudoers file.\n"])
def test_sudo_without_a_password_or_at_all_gets_both_fixes(stderr):
    verdict = judge(profile(True), "ubuntu", answer(1, stderr))
    assert not verdict.ok and "cannot run sudo without a password on gpu-host.example" in verdict.message
    assert "Fix: give ubuntu passwordless sudo" in verdict.message and "set sudo = false" in verdict.message
    assert judge(profile(True), "ubuntu", answer(0, "systemd 252 (252.33-1~deb12u1)\n")).ok


def test_the_seed_profile_says_sudo():
    from pathlib import Path

    from console.profile import load_profile
    seed = load_profile(Path(__file__).resolve().parents[1] / "profiles" / "kimi-k25-int4.toml")
    assert seed.host.user == "ubuntu" and seed.server.sudo is True
