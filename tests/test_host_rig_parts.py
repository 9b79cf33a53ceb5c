"""The rig's pure parts: mirror discovery, the boot script, process trees, skip-versus-fail."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.rig import procs
from harness.rig.availability import rig_unavailable
from harness.rig.rootfs import cache_key, parse_mirror
from harness.rig.systemd_host import boot_script, interpreter_prefixes

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""

ONE_LINE = """\
# deb cdrom:[Debian]/ bookworm main
deb http://security.debian.org/debian-security bookworm-security main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.example.org/debian bookworm main
"""


@pytest.mark.parametrize("text, expected", [
    (DEB822, "http://deb.debian.org/debian"),
    (ONE_LINE, "http://mirror.example.org/debian"),
    ("# nothing here\n", None),
])
def test_parse_mirror(text, expected):
    assert parse_mirror(text) == expected


def test_cache_key_is_stable():
    assert cache_key() == cache_key() and len(cache_key()) == 16


def test_boot_script_mounts_then_execs_systemd():
    script = boot_script(Path("/cache/root"), Path("/w/upper"), Path("/w/work"), Path("/w/merged"),
                         ["/work/main"], ["/opt/py dir"])
    lines = script.splitlines()
    assert lines[0] == "set -e"
    assert "lowerdir=/cache/root,upperdir=/w/upper,workdir=/w/work" in lines[1]
    assert "mount --bind /work/main /w/merged/work/main" in lines
    assert "mount --bind '/opt/py dir' '/w/merged/opt/py dir'" in lines
    assert "mount -o remount,bind,ro '/w/merged/opt/py dir'" in lines
    assert lines[-1] == "exec chroot /w/merged env container=other /lib/systemd/systemd --system"


def test_interpreter_prefixes_cover_the_running_python():
    prefixes = interpreter_prefixes()
    assert any(sys.executable.startswith(p) or Path(sys.executable).resolve().as_posix().startswith(p)
               for p in prefixes)


def test_descendants_finds_grandchildren_only_of_ours():
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        for _ in range(100):
            kids = procs.descendants(proc.pid)
            if len(kids) >= 2:
                break
            subprocess.run(["sleep", "0.02"])
        assert len(kids) == 2 and all(procs.parent_pid(k) == proc.pid for k in kids)
    finally:
        # Children first, so the shell's `wait` reaps them and it exits by itself (this machine's
        # PID 1 may not reap orphans).
        for pid in procs.descendants(proc.pid):
            procs.kill(pid)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            procs.kill(proc.pid)
            proc.wait(timeout=5)


def test_rig_unavailable_skips_locally_and_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no debootstrap"):
        rig_unavailable("no debootstrap")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="under CI: no debootstrap"):
        rig_unavailable("no debootstrap")


def test_a_stale_pyenv_rehash_lock_is_cleared_and_a_live_one_kept(tmp_path, monkeypatch):
    """What a login killed mid-rehash leaves (every later login to the test sshd then says "pyenv: cannot
    rehash" on stderr): older than pyenv's own 60 s wait, nothing holds it."""
    import os
    import time

    from harness.rig.sshd import PYENV_STALE_S, clear_stale_pyenv_lock

    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    assert clear_stale_pyenv_lock() is None  # no pyenv, or no lock: nothing to do
    lock = tmp_path / "shims" / ".pyenv-shim"
    lock.parent.mkdir()
    lock.touch()
    assert clear_stale_pyenv_lock() is None and lock.exists()  # a rehash under way holds it
    old = time.time() - PYENV_STALE_S - 5
    os.utime(lock, (old, old))
    assert clear_stale_pyenv_lock() == str(lock) and not lock.exists()
