"""Host-key trust: fingerprints, known_hosts lookups with OpenSSH's rules, and adding a key.

Checking is never switched off; these helpers exist so an operator can see an unknown key's
fingerprint and add it deliberately (`eagle3-console trust-host`).

Lookups follow OpenSSH, not asyncssh's defaults: a key recorded for `host` (port 22) does not vouch for
`[host]:2222` (asyncssh falls back to the port-less entry; OpenSSH refuses), a missing file is simply
empty, and a line that does not parse is skipped instead of discarding the whole file.
"""
from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Callable

import asyncssh

from .base import HostError, HostUnreachable

DEFAULT_PORT = 22


class KnownHostsError(HostError):
    """known_hosts cannot be updated as asked; nothing was written."""


def why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def fingerprint(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")


def known_hosts_pattern(host: str, port: int) -> str:
    return host if port == DEFAULT_PORT else f"[{host}]:{port}"


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _parse_line(line: str) -> asyncssh.SSHKnownHosts | None:
    """One known_hosts line as its own table (None for a blank, comment or unparsable line)."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    try:
        table = asyncssh.import_known_hosts(text)
    except (ValueError, asyncssh.KeyImportError):
        return None
    return table


def load_known_hosts(path: str | os.PathLike[str]) -> asyncssh.SSHKnownHosts:
    """The file's usable entries; a missing file is empty (read at every call: trust-host may add)."""
    text = _read_text(os.path.expanduser(os.fspath(path)))
    good = [line for line in text.splitlines() if _parse_line(line) is not None]
    return asyncssh.import_known_hosts("\n".join(good))


def _match_exact(table: asyncssh.SSHKnownHosts, host: str, addr: str,
                 port: int | None) -> tuple[list, list, list]:
    """Trusted keys, CA keys and revoked keys for host:port, without asyncssh's port-less fallback."""
    if port is None or port == DEFAULT_PORT:
        found = [table.match(host, addr, None)]
    else:
        # `[host]:port` looked up as a plain name (port None) never falls back to the bare host
        found = [table.match(f"[{name}]:{port}", "", None) for name in dict.fromkeys((host, addr)) if name]
    keys: tuple[list, list, list] = ([], [], [])
    for result in found:
        for mine, theirs in zip(keys, result[:3]):
            mine.extend(k for k in theirs if k not in mine)
    return keys


def trusted_keys_matcher(path: str | os.PathLike[str]) -> Callable[[str, str, int | None], tuple]:
    """A `known_hosts=` callable for asyncssh.connect that reads `path` with OpenSSH's port rule."""
    def match(host: str, addr: str, port: int | None) -> tuple[list, list, list]:
        return _match_exact(load_known_hosts(path), host, addr, port)
    return match


def known_keys(path: str | os.PathLike[str], host: str, port: int) -> list[asyncssh.SSHKey]:
    return _match_exact(load_known_hosts(path), host, "", port)[0]


def trust_host_key(known_hosts_path: str | os.PathLike[str], host: str, port: int,
                   key: asyncssh.SSHKey, *, replace: bool = False) -> str:
    """Add `key` for host:port to a known_hosts file (created 0600 in a 0700 dir); return its line.

    Only for a key the operator has accepted after seeing its fingerprint. When the file already holds
    a different key for host:port the key has CHANGED: refused (KnownHostsError) unless `replace`, which
    removes the old entries for host:port (the previous file is kept as `<file>.old`, as ssh-keygen -R
    does) and adds the new one. A key already trusted is not added twice."""
    path = os.path.expanduser(os.fspath(known_hosts_path))
    key_type, key_data = key.export_public_key("openssh").decode().split()[:2]
    line = f"{known_hosts_pattern(host, port)} {key_type} {key_data}\n"
    old = known_keys(path, host, port)
    if any(k.public_data == key.public_data for k in old):
        return line
    if old and not replace:
        raise KnownHostsError(
            f"{path} already holds a different key for {known_hosts_pattern(host, port)} "
            f"({', '.join(fingerprint(k) for k in old)}): the host key has CHANGED. Nothing written; "
            f"if the host's owner confirms the new key, run trust-host again with --replace.")
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    if old:
        _rewrite_without(path, host, port, line)
    else:
        _append(path, line)
    return line


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        needs_newline = False
        if size > 0:
            f.seek(size - 1)
            needs_newline = f.read(1) != b"\n"
        f.write((("\n" if needs_newline else "") + line).encode())
        f.flush()
        os.fsync(f.fileno())


def _rewrite_without(path: str, host: str, port: int, new_line: str) -> None:
    """Replace the plain-key entries for host:port by `new_line`, atomically; keep `<path>.old`."""
    with open(path, "rb") as f:
        original = f.read()
    target = known_hosts_pattern(host, port)
    kept: list[str] = []
    for number, raw in enumerate(original.decode("utf-8", errors="surrogateescape").splitlines(True), 1):
        table = _parse_line(raw)
        fields = raw.split()
        if table is None or fields[0].startswith("@") or not _match_exact(table, host, "", port)[0]:
            kept.append(raw)
            continue
        patterns = fields[0].split(",")
        hashed = fields[0].startswith("|")
        if (not hashed and any(c in fields[0] for c in "*?!")) or (len(patterns) > 1 and target not in patterns):
            raise KnownHostsError(f"{path} line {number}: the old key for {target} comes from the pattern "
                                  f"{fields[0]!r}, which covers other hosts too; edit that line yourself")
        if len(patterns) > 1:  # `host,other key`: the other names keep their key
            kept.append(raw.replace(fields[0], ",".join(p for p in patterns if p != target), 1))
    if kept and not kept[-1].endswith("\n"):
        kept[-1] += "\n"
    data = "".join(kept).encode("utf-8", errors="surrogateescape") + new_line.encode()
    mode = os.stat(path).st_mode & 0o777
    _write_atomic(f"{path}.old", original, mode)
    _write_atomic(path, data, mode)


def _write_atomic(path: str, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path) or ".")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


async def fetch_host_key(hostname: str, port: int = 22, *, timeout: float = 15.0,
                         tunnel: asyncssh.SSHClientConnection | None = None) -> asyncssh.SSHKey:
    """The host key a server presents, without trusting or authenticating (to show its fingerprint).

    With `tunnel` (a connection to the jump host) the key is read through it, as the real connection
    goes: the target may not even be reachable directly."""
    try:
        key = await asyncio.wait_for(
            asyncssh.get_server_host_key(hostname, port, tunnel=tunnel or ()), timeout)
    except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
        raise HostUnreachable(f"cannot read the host key of {hostname}:{port}: {why(exc)}") from exc
    if key is None:
        raise HostError(f"{hostname}:{port} presented no host key")
    return key
