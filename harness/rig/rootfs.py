"""A cached Debian bookworm root filesystem for the systemd rig, built once per machine with debootstrap.

The cache key is the package list (plus suite and variant), so changing what the rig needs builds a new
tree instead of silently reusing a stale one. The tree is built in a temporary sibling directory and
renamed into place only when debootstrap succeeds, so a killed build is never mistaken for a good one.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

SUITE = "bookworm"
VARIANT = "minbase"
PACKAGES = ("systemd", "systemd-sysv", "openssh-server", "dbus", "python3", "tmux", "procps")
CACHE_DIR = Path("/var/cache/eagle3-console/rig")
APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
BUILD_TIMEOUT_S = 900


class RigUnavailable(Exception):
    """The rig cannot be built here; the message names the exact missing thing."""


def cache_key() -> str:
    spec = f"{SUITE}|{VARIANT}|{','.join(sorted(PACKAGES))}"
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def parse_mirror(deb822_or_list: str) -> str | None:
    """The first Debian mirror URI in an apt sources file (deb822 `URIs:` or one-line `deb URL ...`).

    Security mirrors are skipped: debootstrap needs the main archive."""
    candidates: list[str] = []
    for line in deb822_or_list.splitlines():
        line = line.strip()
        m = re.match(r"^URIs:\s*(.+)$", line)
        if m:
            candidates.extend(m.group(1).split())
            continue
        m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", line)
        if m:
            candidates.append(m.group(1))
    for uri in candidates:
        if "security" not in uri:
            return uri
    return None


def find_mirror() -> str:
    for path in APT_SOURCES:
        if path.is_file():
            mirror = parse_mirror(path.read_text())
            if mirror:
                return mirror
    raise RigUnavailable(f"no Debian mirror found in {' or '.join(map(str, APT_SOURCES))}")


def check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise RigUnavailable("the systemd rig needs root (namespaces, chroot, mounts)")
    for tool in ("debootstrap", "unshare", "chroot", "mount", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise RigUnavailable(f"{tool} is not installed (run scripts/install-system-deps.sh)")


def ensure_rootfs() -> Path:
    """Return the cached root filesystem, building it first if needed (about a minute, needs the mirror).

    One build at a time: the test command starts one in the background while it installs the console
    (scripts/test.sh), and the rig's fixture waits for it here instead of building a second tree."""
    check_prerequisites()
    root = CACHE_DIR / cache_key()
    if (root / "lib/systemd/systemd").exists():
        return root
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f"{cache_key()}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "lib/systemd/systemd").exists():
            return root
        return _build(root)


def _build(root: Path) -> Path:
    mirror = find_mirror()
    tmp = Path(tempfile.mkdtemp(prefix=f"{cache_key()}.building-", dir=CACHE_DIR))
    argv = ["debootstrap", f"--variant={VARIANT}", f"--include={','.join(PACKAGES)}",
            SUITE, str(tmp), mirror]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RigUnavailable(f"debootstrap did not finish within {BUILD_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        shutil.rmtree(tmp, ignore_errors=True)
        raise RigUnavailable(f"debootstrap failed (exit {proc.returncode}):\n{tail}")
    try:
        tmp.rename(root)
    except OSError:
        # a build that took no lock (an older checkout) finished first; theirs is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
        if not (root / "lib/systemd/systemd").exists():
            raise
    return root


if __name__ == "__main__":
    print(ensure_rootfs())
