"""A real OpenSSH sshd on 127.0.0.1 with its own keys and config, restartable on the same port."""
from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import keys, procs
from .rootfs import RigUnavailable

PYENV_STALE_S = 60.0  # pyenv's own default wait for its rehash lock (PYENV_REHASH_TIMEOUT)


def clear_stale_pyenv_lock() -> str | None:
    """Every login to the test sshd runs root's shell rc; where that runs `pyenv init -`, each login
    rehashes under a lock file that a session killed mid-login (the drop and kill tests) leaves behind, and
    every later login then prints "pyenv: cannot rehash: couldn't acquire lock" into the command's stderr.
    A lock older than pyenv's own timeout is one no rehash holds: removed, and said (the path, or None)."""
    lock = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "shims" / ".pyenv-shim"
    try:
        if time.time() - lock.stat().st_mtime < PYENV_STALE_S:
            return None
        lock.unlink()
    except OSError:
        return None
    print(f"rig sshd: removed pyenv's stale rehash lock {lock} (a login killed mid-rehash left it)")
    return str(lock)

SSHD = "/usr/sbin/sshd"


def check_prerequisites() -> None:
    if not os.path.exists(SSHD):
        raise RigUnavailable(f"{SSHD} is missing (install openssh-server: scripts/install-system-deps.sh)")
    if shutil.which("ssh-keygen") is None:
        raise RigUnavailable("ssh-keygen is missing (install openssh-client)")
    if os.geteuid() != 0:
        # A non-root sshd cannot switch users or use its privilege-separation directory.
        raise RigUnavailable("the sshd rig needs root (sshd privilege separation)")


@dataclass
class SshdServer:
    workdir: Path
    host: str = "127.0.0.1"
    port: int = 0
    username: str = field(default_factory=getpass.getuser)
    proc: subprocess.Popen | None = None

    @property
    def identity_file(self) -> Path:
        return self.workdir / "client_key"

    @property
    def host_key(self) -> Path:
        return self.workdir / "host_key"

    @property
    def known_hosts(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def log_file(self) -> Path:
        return self.workdir / "sshd.log"

    def prepare(self) -> None:
        check_prerequisites()
        self.workdir.mkdir(parents=True, exist_ok=True)
        keys.generate_key(self.identity_file, "eagle3-console-test-client")
        keys.generate_key(self.host_key, "eagle3-console-test-host")
        if not self.port:
            self.port = keys.free_port(self.host)
        (self.workdir / "authorized_keys").write_text(keys.public_key_text(self.identity_file) + "\n")
        self.known_hosts.write_text(keys.known_hosts_line(self.host, self.port, self.host_key))
        (self.workdir / "sshd_config").write_text("\n".join([
            f"Port {self.port}",
            f"ListenAddress {self.host}",
            f"HostKey {self.host_key}",
            f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
            f"PidFile {self.workdir / 'sshd.pid'}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            "AllowTcpForwarding yes",
            "MaxSessions 10",
            "Subsystem sftp internal-sftp",
            # Every login runs root's shell rc; on machines with pyenv that rehashes under a lock file,
            # which a killed session leaves behind, and each later login then waits 60 s for it.
            "SetEnv PYENV_REHASH_TIMEOUT=0",
            "LogLevel VERBOSE",
            "",
        ]))
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory

    def start(self, timeout: float = 10.0) -> None:
        """Start (or restart) sshd on the same port with the same host key; wait until it accepts."""
        if self.proc is not None and self.proc.poll() is None:
            return
        clear_stale_pyenv_lock()
        check = subprocess.run([SSHD, "-t", "-f", str(self.workdir / "sshd_config")],
                               capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RigUnavailable(f"sshd rejected its test config: {check.stderr.strip()}")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-f", str(self.workdir / "sshd_config"), "-E", str(self.log_file)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RigUnavailable(f"sshd exited with {self.proc.returncode}: {self.log_tail()}")
            if keys.port_open(self.host, self.port):
                return
            time.sleep(0.05)
        self.stop()
        raise RigUnavailable(f"sshd did not listen on {self.host}:{self.port} within {timeout} s: "
                             f"{self.log_tail()}")

    def stop(self) -> None:
        """Kill the listener only; sessions already open keep running (as with a real sshd restart)."""
        if self.proc is None:
            return
        procs.kill(self.proc.pid)
        self.proc.wait(timeout=10)
        self.proc = None

    def drop_connections(self) -> None:
        """Kill every per-connection sshd child of our listener, so clients see the connection drop."""
        if self.proc is None:
            return
        for pid in procs.descendants(self.proc.pid):
            procs.kill(pid)

    def kill_all(self) -> None:
        """Listener and every session: what a crashed or rebooted host looks like to the client."""
        self.drop_connections()
        self.stop()

    def log_tail(self, lines: int = 10) -> str:
        try:
            return " | ".join(self.log_file.read_text().splitlines()[-lines:])
        except OSError:
            return "(no sshd log)"
