"""Host-key trust: fingerprints, known_hosts lines, and reading the key a server presents.

Checking is never switched off; these helpers exist so an operator can see an unknown key's
fingerprint and add it deliberately (`eagle3-console trust-host`).
"""
from __future__ import annotations

import asyncio
import os

import asyncssh

from .base import HostError, HostUnreachable


def why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def fingerprint(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")


def known_hosts_pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def trust_host_key(known_hosts_path: str | os.PathLike[str], host: str, port: int,
                   key: asyncssh.SSHKey) -> str:
    """Append `key` for host:port to a known_hosts file (created 0600 in a 0700 dir); return the line.

    Only for a key the operator has accepted after seeing its fingerprint. A changed key's old line is
    left in place: deleting trust is the operator's call, made in the file itself."""
    path = os.path.expanduser(os.fspath(known_hosts_path))
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    key_type, key_data = key.export_public_key("openssh").decode().split()[:2]
    line = f"{known_hosts_pattern(host, port)} {key_type} {key_data}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a+b") as f:
        f.seek(0, os.SEEK_END)
        needs_newline = False
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            needs_newline = f.read(1) != b"\n"
        f.write((("\n" if needs_newline else "") + line).encode())
    return line


async def fetch_host_key(hostname: str, port: int = 22, *, timeout: float = 15.0,
                         tunnel: asyncssh.SSHClientConnection | None = None) -> asyncssh.SSHKey:
    """The host key a server presents, without trusting or authenticating (to show its fingerprint)."""
    try:
        key = await asyncio.wait_for(
            asyncssh.get_server_host_key(hostname, port, tunnel=tunnel or ()), timeout)
    except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
        raise HostUnreachable(f"cannot read the host key of {hostname}:{port}: {why(exc)}") from exc
    if key is None:
        raise HostError(f"{hostname}:{port} presented no host key")
    return key


def _known_keys(known_hosts: str, host: str, port: int) -> list[asyncssh.SSHKey]:
    try:
        return list(asyncssh.read_known_hosts(known_hosts).match(host, "", port)[0])
    except (OSError, ValueError, asyncssh.KeyImportError):
        return []
