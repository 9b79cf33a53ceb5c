"""Shared fixtures: the real test rigs (an sshd on loopback, a booted systemd host).

Where a rig cannot be built here the tests using it are skipped with the exact missing thing, except
under CI (CI=true), where a missing rig is a failure: CI silently skipping the SSH tests would hide
exactly the bugs they exist to catch.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

# The rig package lives under tests/; make `harness.rig` importable however pytest was started.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from harness.rig.availability import rig_unavailable  # noqa: E402
from harness.rig.rootfs import RigUnavailable  # noqa: E402
from harness.rig.sshd import SshdServer  # noqa: E402


def _start_sshd(workdir: Path) -> SshdServer:
    server = SshdServer(workdir)
    try:
        server.prepare()
        server.start()
    except RigUnavailable as exc:
        server.kill_all()
        rig_unavailable(str(exc))
    return server


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory):
    """A real sshd on 127.0.0.1 for the whole session; tests that kill it must start() it again."""
    server = _start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.kill_all()


@pytest.fixture
def fresh_sshd(tmp_path_factory):
    """A private sshd for a test that kills or restarts it, so others never see the outage."""
    server = _start_sshd(tmp_path_factory.mktemp("sshd-fresh"))
    yield server
    server.kill_all()


@pytest.fixture(scope="session")
def systemd_rig(tmp_path_factory):
    """A booted systemd host (sshd, journald, dbus) in private namespaces, reachable over loopback SSH."""
    from harness.rig.systemd_host import SystemdRig

    rig = SystemdRig(tmp_path_factory.mktemp("systemd-rig"))
    try:
        rig.start()
    except RigUnavailable as exc:
        rig.stop()
        rig_unavailable(str(exc))
    yield rig
    rig.stop()


@pytest.fixture(scope="module")
async def rig_ssh(systemd_rig):
    """An SshHost logged into the booted systemd rig (one connection per test module)."""
    from console.host.ssh import SshHost

    host = SshHost(systemd_rig.host, port=systemd_rig.port, username=systemd_rig.username,
                   identity_file=systemd_rig.identity_file, known_hosts=systemd_rig.known_hosts)
    yield host
    await host.close()


@pytest.fixture(scope="session")
def tiny_drafters(tmp_path_factory):
    """The tiny verifier with an untrained and a trained EAGLE-3 drafter (harness/specdec_support.py)."""
    from harness.specdec_support import make_drafters

    return make_drafters(tmp_path_factory)


@pytest.fixture
def utc(monkeypatch):
    """Times rendered in UTC (snapshots hold clock times)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
