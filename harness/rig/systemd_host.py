"""A booted systemd host on this machine: systemd as PID 1 of private pid/mount/uts/ipc namespaces,
chrooted into the cached Debian root filesystem, with its own sshd on 127.0.0.1:PORT.

The cached tree is never written: each rig boots an overlay (cache below, a per-rig directory above),
so parallel rigs and later runs all start from the same clean tree. The repository and the running
interpreter are bind-mounted at their own paths so stage programs run inside with `sys.executable`.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import keys, procs
from .rootfs import RigUnavailable, ensure_rootfs

REPO_ROOT = Path(__file__).resolve().parents[2]
BOOT_TIMEOUT_S = 90.0


def interpreter_prefixes() -> list[str]:
    """sys.prefix and sys.base_prefix (a virtualenv needs both), outermost first, without nesting."""
    found: list[str] = []
    for p in sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}, key=len):
        if not any(p == q or p.startswith(q + "/") for q in found):
            found.append(p)
    return found


def boot_script(lower: Path, upper: Path, work: Path, merged: Path, binds: list[str],
                ro_binds: list[str]) -> str:
    """The shell run as PID 1 of the new namespaces: mount the tree, then exec systemd inside it."""
    q = shlex.quote
    lines = [
        "set -e",
        f"mount -t overlay overlay -o {q(f'lowerdir={lower},upperdir={upper},workdir={work}')} {q(str(merged))}",
        f"mount -t proc proc {q(str(merged / 'proc'))}",
        f"mount --rbind /sys {q(str(merged / 'sys'))}",
        f"mount --rbind /dev {q(str(merged / 'dev'))}",
        f"mount -t tmpfs tmpfs {q(str(merged / 'run'))}",
        f"mount -t tmpfs tmpfs {q(str(merged / 'tmp'))}",
    ]
    for path in binds + ro_binds:
        target = q(str(merged) + path)
        lines += [f"mkdir -p {target}", f"mount --bind {q(path)} {target}"]
        if path in ro_binds:
            lines.append(f"mount -o remount,bind,ro {target}")
    lines.append(f"exec chroot {q(str(merged))} env container=other /lib/systemd/systemd --system")
    return "\n".join(lines) + "\n"


@dataclass
class SystemdRig:
    workdir: Path
    host: str = "127.0.0.1"
    port: int = 0
    username: str = "root"
    root: Path | None = None  # the cached lower tree
    pid: int | None = None  # the namespace's systemd, as seen from outside
    proc: subprocess.Popen | None = None

    @property
    def identity_file(self) -> Path:
        return self.workdir / "client_key"

    @property
    def known_hosts(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def boot_log(self) -> Path:
        return self.workdir / "boot.log"

    @property
    def merged(self) -> Path:
        return self.workdir / "merged"

    def start(self) -> None:
        self.root = ensure_rootfs()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or keys.free_port(self.host)
        self._prepare_upper()
        upper, work = self.workdir / "upper", self.workdir / "work"
        work.mkdir(exist_ok=True)
        self.merged.mkdir(exist_ok=True)
        script = boot_script(self.root, upper, work, self.merged, [str(REPO_ROOT)],
                             interpreter_prefixes())
        with open(self.boot_log, "wb") as log:
            self.proc = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount", "--uts", "--ipc", "--propagation", "private",
                 "bash", "-c", script],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self._namespace_init()
        self._wait_until_running()

    def _prepare_upper(self) -> None:
        """Per-rig files go into the overlay's upper layer: the cached tree stays pristine."""
        upper = self.workdir / "upper"
        keys.generate_key(self.identity_file, "eagle3-console-rig-client")
        host_key = keys.generate_key(self.workdir / "rig_host_key", "eagle3-console-rig-host")
        ssh_dir = upper / "root/.ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (ssh_dir / "authorized_keys").write_text(keys.public_key_text(self.identity_file) + "\n")
        etc_ssh = upper / "etc/ssh"
        (etc_ssh / "sshd_config.d").mkdir(parents=True, exist_ok=True)
        for suffix in ("", ".pub"):
            target = etc_ssh / f"eagle3_rig_host_key{suffix}"
            target.write_bytes(Path(f"{host_key}{suffix}").read_bytes())
            target.chmod(0o600 if not suffix else 0o644)
        (etc_ssh / "sshd_config.d/eagle3-rig.conf").write_text("\n".join([
            f"Port {self.port}",
            f"ListenAddress {self.host}",
            "HostKey /etc/ssh/eagle3_rig_host_key",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "StrictModes no",
            "",
        ]))
        (upper / "etc").mkdir(exist_ok=True)
        (upper / "etc/hostname").write_text("eagle3-rig\n")
        self.known_hosts.write_text(keys.known_hosts_line(self.host, self.port, host_key))

    def _namespace_init(self) -> int:
        assert self.proc is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            children = procs.descendants(self.proc.pid)
            if children:
                return children[0]  # unshare --fork's only child: PID 1 inside
            if self.proc.poll() is not None:
                raise RigUnavailable(f"unshare exited with {self.proc.returncode}: {self.boot_tail()}")
            time.sleep(0.02)
        raise RigUnavailable(f"the namespace did not start: {self.boot_tail()}")

    def ssh_argv(self, *remote: str) -> list[str]:
        return ["ssh", "-i", str(self.identity_file), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                "-p", str(self.port), f"{self.username}@{self.host}", shlex.join(remote)]

    def _wait_until_running(self) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        state = "no ssh yet"
        while time.monotonic() < deadline:
            assert self.proc is not None
            rc = self.proc.poll()
            if rc is not None:
                self.stop()
                raise RigUnavailable(f"systemd exited with {rc} during boot: {self.boot_tail()}")
            if keys.port_open(self.host, self.port):
                try:
                    out = subprocess.run(self.ssh_argv("systemctl", "is-system-running", "--wait"),
                                         capture_output=True, text=True,
                                         timeout=max(1.0, deadline - time.monotonic()))
                    last = (out.stdout.strip() or out.stderr.strip()).splitlines()[-1:]
                    state = last[0] if last else "?"
                    if state in ("running", "degraded"):
                        return
                except subprocess.TimeoutExpired:
                    state = "is-system-running --wait timed out"
            time.sleep(0.2)
        self.stop()
        raise RigUnavailable(f"the rig did not boot within {BOOT_TIMEOUT_S:.0f} s (last state: "
                             f"{state}); boot log: {self.boot_tail()}")

    def boot_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.boot_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no boot log)"

    def stop(self) -> None:
        """kill -9 the namespace's systemd: everything inside dies with it, the mounts vanish."""
        if self.pid is not None:
            procs.kill(self.pid)
            self.pid = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                procs.kill(self.proc.pid)
                self.proc.wait(timeout=5)
            self.proc = None


if __name__ == "__main__":  # manual check: boot, print how to log in, wait for Enter
    import tempfile

    rig = SystemdRig(Path(tempfile.mkdtemp(prefix="eagle3-rig-")))
    rig.start()
    print(shlex.join(rig.ssh_argv("bash")))
    try:
        input("rig running; Enter stops it\n")
    finally:
        rig.stop()
