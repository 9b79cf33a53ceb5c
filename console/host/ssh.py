"""`SshHost`: the Host interface over one reused asyncssh connection.

Why it looks the way it does:
- One connection for everything, capped at `max_channels` concurrent sessions, because sshd refuses
  more than MaxSessions (default 10) per connection and a console refresh must not open connections.
- A dropped connection is noticed (keepalive or the next failing call) and the next operation reconnects
  with jittered exponential backoff. Commands interrupted by a drop are NOT re-run (they may not be
  idempotent): they raise HostDisconnected and the caller decides.
- Host keys are always checked against a known_hosts file; an unknown or changed key stops the connect
  with HostKeyError carrying the server's SHA256 fingerprint, and only the operator adds it
  (`fetch_host_key` + `trust_host_key`).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shlex
import time
from typing import AsyncIterator, Sequence

import asyncssh

from .base import (AuthenticationFailed, CommandResult, CommandTimeout, HostDisconnected, HostError,
                   HostKeyError, HostUnreachable, ReadChunk)
from .jump import JumpHost, parse_jump_host
from .known_hosts import (fetch_host_key, fingerprint, known_hosts_pattern, known_keys, trust_host_key,
                          trusted_keys_matcher)
from .known_hosts import why as _why

__all__ = ["SshHost", "JumpHost", "parse_jump_host", "fetch_host_key", "fingerprint", "known_hosts_pattern",
           "trust_host_key"]

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
READ_TIMEOUT_S = 60
UPLOAD_TIMEOUT_S = 300

# Failures that mean "the transport is gone", as opposed to the command failing.
_DROPPED = (asyncssh.ConnectionLost, asyncssh.DisconnectError, asyncssh.ChannelOpenError,
            BrokenPipeError, ConnectionError)


class SshHost:
    """A remote host over SSH; every operation connects (or reconnects) on demand."""

    def __init__(self, hostname: str, *, port: int = 22, username: str | None = None,
                 identity_file: str | os.PathLike[str] | None = None,
                 known_hosts: str | os.PathLike[str] | None = None, jump_host: str | None = None,
                 keepalive_interval: float = 15, connect_timeout: float = 15, max_channels: int = 8,
                 name: str | None = None, connect_attempts: int = 6,
                 backoff: tuple[float, float] = (0.2, 10.0), forward_agent: bool = False) -> None:
        self.hostname = hostname
        self.forward_agent = forward_agent
        self.port = port
        self.username = username
        self.identity_file = os.path.expanduser(os.fspath(identity_file)) if identity_file else None
        # None means the user's default file; checking is never switched off.
        self.known_hosts = os.path.expanduser(os.fspath(known_hosts or DEFAULT_KNOWN_HOSTS))
        self.jump_host = parse_jump_host(jump_host) if jump_host else None
        self.keepalive_interval = keepalive_interval
        self.connect_timeout = connect_timeout
        self.connect_attempts = max(1, connect_attempts)
        self.backoff = backoff
        self.name = name or (f"{username}@{hostname}" if username else hostname)
        self.channels_opened = 0
        self._channels = asyncio.Semaphore(max_channels)
        self._conn: asyncssh.SSHClientConnection | None = None
        self._tunnel: asyncssh.SSHClientConnection | None = None
        self._connect_lock = asyncio.Lock()

    # -- connection -------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def connect(self) -> None:
        await self._connection()

    async def close(self) -> None:
        conn, tunnel = self._conn, self._tunnel
        self._conn = self._tunnel = None
        for c in (conn, tunnel):
            if c is not None:
                c.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(c.wait_closed(), 5)

    async def _connection(self) -> asyncssh.SSHClientConnection:
        if self.connected:
            assert self._conn is not None
            return self._conn
        async with self._connect_lock:
            if self.connected:
                assert self._conn is not None
                return self._conn
            await self.close()  # drop the dead pair (tunnel too) before building a new one
            self._conn = await self._connect_with_retry()
            return self._conn

    async def _connect_with_retry(self) -> asyncssh.SSHClientConnection:
        low, high = self.backoff
        last: BaseException | None = None
        for attempt in range(self.connect_attempts):
            if attempt:
                # Full jitter: many consoles restarting together do not hammer sshd in lockstep.
                await asyncio.sleep(random.uniform(low, min(high, low * 2 ** attempt)))
            try:
                return await self._connect_once()
            except (AuthenticationFailed, HostKeyError):
                raise  # retrying cannot fix a refused key or an untrusted host
            except HostUnreachable as exc:
                last = exc
        raise HostUnreachable(f"cannot reach {self._where()} after {self.connect_attempts} attempts: "
                              f"{last}") from last

    def _where(self, host: str | None = None, port: int | None = None) -> str:
        host, port = host or self.hostname, port or self.port
        return f"{self.username + '@' if self.username else ''}{host}:{port}"

    def _options(self) -> dict:
        # our matcher, not the path: asyncssh would accept a port-22 entry for any other port
        # agent forwarding always explicit: left unset, asyncssh takes ForwardAgent from ~/.ssh/config and
        # hands the operator's agent (every key in it) to whoever is root on the GPU host
        opts: dict = dict(known_hosts=trusted_keys_matcher(self.known_hosts),
                          keepalive_interval=self.keepalive_interval,
                          keepalive_count_max=3, connect_timeout=self.connect_timeout,
                          agent_forwarding=self._agent_forwarding())
        if self.identity_file:
            # Like IdentitiesOnly: an agent's keys must not stand in for the configured one.
            opts.update(client_keys=[self.identity_file], agent_path=None)
        return opts

    def _agent_forwarding(self) -> bool | str:
        """False unless the profile asks; then the agent's socket itself (with an identity file the agent
        is not used to log in, and asyncssh would forward nothing for a plain True)."""
        return (os.environ.get("SSH_AUTH_SOCK") or False) if self.forward_agent else False

    async def _connect_once(self) -> asyncssh.SSHClientConnection:
        tunnel = None
        if self.jump_host is not None:
            j = self.jump_host
            try:
                tunnel = await self._open_ssh(j.host, j.port, j.username or self.username, None)
            except HostError as exc:
                exc.jump = True  # type: ignore[attr-defined]  # it was the jump host (trust-host says so)
                raise
            self._tunnel = tunnel
        try:
            return await self._open_ssh(self.hostname, self.port, self.username, tunnel)
        except BaseException:
            if tunnel is not None:
                tunnel.close()
                self._tunnel = None
            raise

    async def _open_ssh(self, host: str, port: int, username: str | None,
                        tunnel: asyncssh.SSHClientConnection | None) -> asyncssh.SSHClientConnection:
        where = f"{username + '@' if username else ''}{host}:{port}"
        try:
            opts = self._options()
            if username:
                opts["username"] = username
            return await asyncio.wait_for(
                asyncssh.connect(host, port, tunnel=tunnel or (), **opts), self.connect_timeout + 5)
        except asyncssh.HostKeyNotVerifiable:
            raise await self._host_key_error(host, port, tunnel) from None
        except asyncssh.PermissionDenied as exc:
            key = f"key {self.identity_file}" if self.identity_file else "the default keys"
            raise AuthenticationFailed(f"{where} refused {key} for user {username or 'default'} "
                                       f"({_why(exc)}); not retrying") from None
        except asyncssh.KeyImportError as exc:
            raise AuthenticationFailed(f"cannot load {self.identity_file}: {_why(exc)}") from None
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
            raise HostUnreachable(f"cannot connect to {where}: {_why(exc)}") from exc

    async def _host_key_error(self, host: str, port: int,
                              tunnel: asyncssh.SSHClientConnection | None) -> HostKeyError:
        """The server's key was not verifiable: read it again (through the same tunnel) to show its
        fingerprint, and say whether it is unknown or CHANGED."""
        unread = ""
        try:
            key: asyncssh.SSHKey | None = await fetch_host_key(host, port, timeout=self.connect_timeout,
                                                               tunnel=tunnel)
        except HostError as exc:
            key, unread = None, str(exc)
        fp = fingerprint(key) if key is not None else None
        shown = fp or f"unreadable ({unread})"
        known = known_keys(self.known_hosts, host, port)
        target = known_hosts_pattern(host, port)
        if known and (key is None or all(k.public_data != key.public_data for k in known)):
            return _with_key(HostKeyError(
                f"WARNING: THE HOST KEY OF {target} HAS CHANGED (now {shown}). Someone "
                f"may be intercepting the connection, or the host was reinstalled. Not connecting; "
                f"check the new key with the host's owner, then replace the old one with "
                f"`eagle3-console trust-host --replace` (or edit {self.known_hosts}).",
                host=host, fingerprint=fp, changed=True), port, key)
        return _with_key(HostKeyError(
            f"{target} is not in {self.known_hosts}; its key fingerprint is {shown}. "
            f"Add it only after checking that fingerprint with the host's owner.",
            host=host, fingerprint=fp, changed=False), port, key)

    def _mark_dead(self, conn: asyncssh.SSHClientConnection) -> None:
        if self._conn is conn:
            conn.close()

    async def _open(self, opener):
        """Open a channel with `opener(conn)`; a stale connection gets one fresh retry, which is safe
        because nothing ran yet."""
        conn = await self._connection()
        try:
            result = await opener(conn)
        except _DROPPED:
            self._mark_dead(conn)
            conn = await self._connection()
            try:
                result = await opener(conn)
            except _DROPPED as exc:
                self._mark_dead(conn)
                raise HostDisconnected(f"{self.name}: cannot open a channel: {_why(exc)}") from exc
        self.channels_opened += 1
        return conn, result

    # -- operations -------------------------------------------------------------------------------

    async def run(self, argv: Sequence[str], *, timeout: float | None = 30.0,
                  input: str | None = None, check: bool = False, errors: str = "replace") -> CommandResult:
        argv_t = tuple(argv)
        if not argv_t:
            raise ValueError("run() needs a non-empty argv")
        command = shlex.join(argv_t)
        proc = None
        try:
            # One deadline for everything: waiting for a channel slot, reconnecting after a drop,
            # opening the channel and the command's own I/O. A link that swallows packets would
            # otherwise hold the caller through the whole reconnect series.
            async with asyncio.timeout(timeout):
                async with self._channels:
                    conn, proc = await self._open(lambda c: c.create_process(
                        command, encoding="utf-8", errors=errors))
                    opened = time.monotonic()
                    try:
                        # EOF even without input (asyncssh's communicate only sends it with input), so
                        # a command that reads stdin ends as it does locally with /dev/null.
                        if input:
                            proc.stdin.write(input)
                        proc.stdin.write_eof()
                        out, err = await proc.communicate()
                        await proc.wait_closed()
                    except _DROPPED as exc:
                        self._mark_dead(conn)
                        raise HostDisconnected(f"{self.name}: connection lost while running {argv_t[0]}") \
                            from exc
        except TimeoutError:
            if proc is not None:
                _abandon(proc)
            raise CommandTimeout(f"{self.name}: {argv_t[0]} did not finish within {timeout} s"
                                 + ("" if proc is not None else " (no channel could be opened: is the link up?)")) \
                from None
        except asyncio.CancelledError:
            if proc is not None:
                _abandon(proc)
            raise
        if proc.returncode is None:
            self._mark_dead(conn)
            raise HostDisconnected(f"{self.name}: connection lost while running {argv_t[0]}")
        result = CommandResult(argv_t, proc.returncode, out or "", err or "",
                               elapsed_s=time.monotonic() - opened)
        if check and not result.ok:
            detail = (result.stderr.strip().splitlines() or [""])[-1]
            raise HostError(f"{self.name}: {argv_t[0]} failed with exit {result.returncode}: {detail}")
        return result

    async def stream(self, argv: Sequence[str]) -> AsyncIterator[str]:
        argv_t = tuple(argv)
        if not argv_t:
            raise ValueError("stream() needs a non-empty argv")
        command = shlex.join(argv_t)
        async with self._channels:
            # A PTY makes sshd hang up the remote process when the channel closes; wide, so
            # progress bars that size themselves to the terminal are not squeezed.
            conn, proc = await self._open(lambda c: c.create_process(
                command, term_type="dumb", term_size=(200, 50), encoding="utf-8", errors="replace"))
            try:
                while True:
                    try:
                        line = await proc.stdout.readline()
                    except _DROPPED as exc:
                        self._mark_dead(conn)
                        raise HostDisconnected(f"{self.name}: connection lost during {argv_t[0]}") \
                            from exc
                    if not line:
                        break
                    yield _strip_pty_newline(line)
                await proc.wait_closed()
                if proc.returncode is None:  # no exit status or signal: the channel died with the link
                    self._mark_dead(conn)
                    raise HostDisconnected(f"{self.name}: connection lost during {argv_t[0]}")
            finally:
                proc.close()

    async def read_from(self, path: str, offset: int = 0, max_bytes: int = 1 << 20) -> ReadChunk:
        if offset < 0 or max_bytes < 0:
            raise ValueError("offset and max_bytes must be >= 0")
        command = shlex.join(read_command(path, offset, max_bytes))
        proc = None
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                async with self._channels:
                    conn, proc = await self._open(lambda c: c.create_process(command, encoding=None))
                    try:
                        out, err = await proc.communicate()
                        await proc.wait_closed()
                    except _DROPPED as exc:
                        self._mark_dead(conn)
                        raise HostDisconnected(f"{self.name}: connection lost reading {path}") from exc
        except TimeoutError:
            if proc is not None:
                _abandon(proc)
            raise CommandTimeout(f"{self.name}: reading {path} took over {READ_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            raise HostError(f"{self.name}: cannot read {path}: "
                            f"{(err or b'').decode(errors='replace').strip() or proc.returncode}")
        return parse_read_output(out or b"", offset)

    async def upload(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        directory, base = os.path.split(remote_path)
        tmp = os.path.join(directory, f".{base}.{os.urandom(4).hex()}.tmp")
        try:
            async with asyncio.timeout(UPLOAD_TIMEOUT_S):
                await self._upload(data, tmp, remote_path, mode)
        except TimeoutError:
            raise CommandTimeout(f"{self.name}: upload to {remote_path} took over {UPLOAD_TIMEOUT_S} s") from None

    async def _upload(self, data: bytes, tmp: str, remote_path: str, mode: int) -> None:
        async with self._channels:
            conn, sftp = await self._open(lambda c: c.start_sftp_client())
            try:
                async with sftp:
                    try:
                        async with sftp.open(tmp, "wb", asyncssh.SFTPAttrs(permissions=mode),
                                             encoding=None) as f:
                            await f.write(data)
                            with contextlib.suppress(asyncssh.SFTPOpUnsupported):
                                await f.fsync()
                        await sftp.chmod(tmp, mode)  # the umask may have trimmed the open mode
                        await sftp.posix_rename(tmp, remote_path)
                    except asyncssh.SFTPError as exc:
                        with contextlib.suppress(asyncssh.SFTPError):
                            await sftp.remove(tmp)
                        raise HostError(f"{self.name}: upload to {remote_path} failed: "
                                        f"{exc.reason}") from exc
            except _DROPPED as exc:
                self._mark_dead(conn)
                raise HostDisconnected(f"{self.name}: connection lost uploading {remote_path}") from exc

    @contextlib.asynccontextmanager
    async def forward_port(self, remote_port: int) -> AsyncIterator[int]:
        """Listen on a free 127.0.0.1 port and tunnel each accepted connection to the host's
        127.0.0.1:remote_port.

        Our own listener (rather than asyncssh's forward_local_port, whose listener dies with its
        connection) keeps the local port stable across reconnects: every new local connection goes
        over whatever SSH connection is current, reconnecting if needed. Connections open during a drop
        are cut. Forwarded channels are not sessions (MaxSessions does not count them), so they do not
        take the channel semaphore."""
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                conn = await self._connection()
                r_reader, r_writer = await conn.open_connection("127.0.0.1", remote_port, encoding=None)
                self.channels_opened += 1
            except asyncssh.ChannelOpenError:
                # the host refused the port (vLLM binds only when loaded): the SSH connection is fine,
                # so the journal stream and other channels must not be torn down for it
                writer.close()
                return
            except _DROPPED:
                self._mark_dead(conn)
                writer.close()
                return
            except (HostError, asyncssh.Error, OSError):
                writer.close()
                return
            try:
                await _pipe_both(reader, writer, r_reader, r_writer)
            finally:
                r_writer.close()
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        try:
            # fail here, not on the first request, if the host is down (and within a bounded time)
            try:
                async with asyncio.timeout(2 * self.connect_timeout + 10):
                    await self._connection()
            except TimeoutError:
                raise HostUnreachable(f"cannot reach {self._where()} for a port forward") from None
            yield server.sockets[0].getsockname()[1]
        finally:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)


def _with_key(exc: HostKeyError, port: int, key: asyncssh.SSHKey | None) -> HostKeyError:
    # Extra attributes beyond base.HostKeyError: the port, and the exact key whose fingerprint the
    # operator is shown, so accepting it trusts that key and not whatever a second fetch returns.
    exc.port = port  # type: ignore[attr-defined]
    exc.key = key  # type: ignore[attr-defined]
    exc.jump = False  # type: ignore[attr-defined]  # True when it is the jump host's key
    return exc


def _abandon(proc: asyncssh.SSHClientProcess) -> None:
    """Give up on a remote command: ask sshd to kill it, then close the channel.

    Best effort: OpenSSH honours the 'signal' request only for non-root logins (a root session runs in
    sshd's monitor, which refuses it), so a root command without a PTY may run on until it exits or
    next writes to the closed channel."""
    with contextlib.suppress(Exception):
        proc.send_signal("KILL")
    proc.close()


def _strip_pty_newline(line: str) -> str:
    # A PTY turns '\n' into '\r\n'; any other '\r' is the program's (a tqdm redraw) and stays.
    if line.endswith("\r\n"):
        return line[:-2]
    return line[:-1] if line.endswith("\n") else line


def read_command(path: str, offset: int, max_bytes: int) -> list[str]:
    """One remote command printing the file size on a line, then at most max_bytes from offset.

    The data is capped at the size it reports, so an append between the two steps can never make the
    data run past the size (which would look like truncation). A missing file prints size 0."""
    script = ('f=$1; o=$2; n=$3; '
              'if [ ! -e "$f" ]; then echo 0; exit 0; fi; '
              's=$(stat -L -c %s -- "$f") || exit 1; echo "$s"; '
              'if [ "$o" -ge "$s" ]; then exit 0; fi; '
              'r=$((s - o)); if [ "$r" -lt "$n" ]; then n=$r; fi; '
              'tail -c +$((o + 1)) -- "$f" | head -c "$n"')
    return ["sh", "-c", script, "sh", path, str(offset), str(max_bytes)]


def parse_read_output(out: bytes, offset: int) -> ReadChunk:
    header, sep, data = out.partition(b"\n")
    if not sep or not header.strip().isdigit():
        raise HostError(f"unexpected reply from the remote read: {out[:80]!r}")
    size = int(header)
    return ReadChunk(data, offset, offset + len(data), size)


async def _pipe_both(l_reader: asyncio.StreamReader, l_writer: asyncio.StreamWriter,
                     r_reader: asyncssh.SSHReader, r_writer: asyncssh.SSHWriter) -> None:
    async def pump(reader, writer) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.write_eof()

    await asyncio.gather(pump(l_reader, r_writer), pump(r_reader, l_writer))
