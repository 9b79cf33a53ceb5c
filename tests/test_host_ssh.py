"""SshHost against a real OpenSSH sshd on loopback (harness/rig/sshd.py), plus its pure helpers."""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import aclosing
from pathlib import Path

import asyncssh
import httpx
import pytest

from console.host.base import (AuthenticationFailed, CommandTimeout, HostDisconnected, HostKeyError,
                               HostUnreachable)
from console.host.ssh import (JumpHost, SshHost, _strip_pty_newline, fetch_host_key, parse_jump_host,
                              parse_read_output, trust_host_key)
from harness.rig import keys

pytestmark = pytest.mark.timeout(60)


def make_host(server, **kw) -> SshHost:
    opts = dict(port=server.port, username=server.username, identity_file=server.identity_file,
                known_hosts=server.known_hosts, backoff=(0.05, 0.5))
    opts.update(kw)
    return SshHost(server.host, **opts)


@pytest.fixture
async def ssh_host():
    """`ssh_host(server, **options)` makes an SshHost that is closed when the test ends, however it ends."""
    made: list[SshHost] = []

    def make(server, **kw) -> SshHost:
        made.append(make_host(server, **kw))
        return made[-1]

    yield make
    for host in made:
        await host.close()


# -- pure helpers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, expected", [
    ("bastion", JumpHost("bastion", 22, None)),
    ("ops@bastion", JumpHost("bastion", 22, "ops")),
    ("ops@bastion:2222", JumpHost("bastion", 2222, "ops")),
    ("[::1]:2200", JumpHost("::1", 2200, None)),
    ("me@[fe80::1]", JumpHost("fe80::1", 22, "me")),
    ("fe80::1", JumpHost("fe80::1", 22, None)),
])
def test_parse_jump_host(spec, expected):
    assert parse_jump_host(spec) == expected


@pytest.mark.parametrize("spec", ["", "@host", "host:", "host:99999", "host:ssh", "[::1", "[::1]x"])
def test_parse_jump_host_rejects(spec):
    with pytest.raises(ValueError, match="jump host"):
        parse_jump_host(spec)


@pytest.mark.parametrize("line, expected", [
    ("plain\r\n", "plain"), ("bar 10%\rbar 20%\r\n", "bar 10%\rbar 20%"), ("no pty\n", "no pty"),
    ("last, no newline", "last, no newline"), ("\r\n", ""),
])
def test_strip_pty_newline(line, expected):
    assert _strip_pty_newline(line) == expected


def test_parse_read_output():
    chunk = parse_read_output(b"12\nhello\nwor", 5)
    assert (chunk.data, chunk.offset, chunk.next_offset, chunk.size) == (b"hello\nwor", 5, 14, 12)
    assert parse_read_output(b"0\n", 0).size == 0
    with pytest.raises(Exception, match="unexpected reply"):
        parse_read_output(b"stat: oops", 0)


# -- against the real sshd -----------------------------------------------------------------------



@pytest.mark.rig
async def test_run_output_status_quoting_and_input(sshd_server, ssh_host):
    host = ssh_host(sshd_server)
    res = await host.run(["sh", "-c", 'echo "$1"; echo err >&2; exit 4', "sh", "a b;$HOME'x"])
    assert (res.returncode, res.stdout, res.stderr) == (4, "a b;$HOME'x\n", "err\n")
    res = await host.run(["cat"], input="piped\n")
    assert res.ok and res.stdout == "piped\n"
    res = await host.run(["cat"], timeout=5)  # no input: stdin is at EOF, nothing hangs
    assert res.ok and res.stdout == ""
    with pytest.raises(CommandTimeout):
        # Short: as root, sshd refuses the kill 'signal' request, so the command runs out on its own.
        await host.run(["sleep", "2"], timeout=0.5)
    assert (await host.run(["true"])).ok  # the connection survives a timed-out command


@pytest.mark.rig
async def test_one_connection_and_channel_cap(sshd_server, ssh_host):
    host = ssh_host(sshd_server, max_channels=8)
    await host.connect()
    conn = host._conn
    # 20 at once would exceed sshd's MaxSessions (10) on one connection without the cap.
    results = await asyncio.gather(*(host.run(["sh", "-c", "sleep 0.2; echo ok"]) for _ in range(20)))
    assert all(r.stdout == "ok\n" for r in results)
    assert host._conn is conn
    assert host.channels_opened == 20


@pytest.mark.rig
async def test_stream_lines_keep_inner_carriage_returns(sshd_server, ssh_host):
    host = ssh_host(sshd_server)
    script = "import sys\nfor i in range(3): print(f'{i}0%|\\r{i+1}0%|', flush=True)\nprint('done')"
    async with aclosing(host.stream([sys.executable, "-c", script])) as lines:
        got = [line async for line in lines]
    assert got == ["00%|\r10%|", "10%|\r20%|", "20%|\r30%|", "done"]


@pytest.mark.rig
async def test_stream_stopped_by_consumer_kills_remote_process(sshd_server, tmp_path, ssh_host):
    host = ssh_host(sshd_server)
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; while true; do echo tick; sleep 0.05; done"
    async with aclosing(host.stream(["sh", "-c", script])) as lines:
        async for line in lines:
            assert line == "tick"
            break
    pid = int(pidfile.read_text())
    for _ in range(100):  # the PTY hangup reaches the process asynchronously
        if not os.path.exists(f"/proc/{pid}"):
            break
        await asyncio.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")


@pytest.mark.rig
async def test_read_from_incremental_one_channel_each(sshd_server, tmp_path, ssh_host):
    host = ssh_host(sshd_server)
    path = tmp_path / "train.log"
    missing = await host.read_from(str(path))
    assert (missing.data, missing.size) == (b"", 0)
    path.write_bytes(b"step 1\n")
    before = host.channels_opened
    c1 = await host.read_from(str(path))
    assert host.channels_opened == before + 1
    assert (c1.data, c1.next_offset, c1.size) == (b"step 1\n", 7, 7)
    with open(path, "ab") as f:
        f.write(b"step 2\n\x00\xff binary ok\n")
    c2 = await host.read_from(str(path), c1.next_offset)
    assert c2.data == b"step 2\n\x00\xff binary ok\n" and c2.size == c2.next_offset
    c3 = await host.read_from(str(path), 2, max_bytes=3)
    assert (c3.data, c3.next_offset) == (b"ep ", 5)
    path.write_bytes(b"new\n")  # truncated: the caller sees size < its offset
    c4 = await host.read_from(str(path), c2.next_offset)
    assert c4.size == 4 and c4.size < c2.next_offset and c4.data == b""


@pytest.mark.rig
async def test_upload_atomic_with_mode(sshd_server, tmp_path, ssh_host):
    host = ssh_host(sshd_server)
    target = tmp_path / "stage.sh"
    target.write_text("old")
    inode = os.stat(target).st_ino
    await host.upload(b"#!/bin/sh\necho new\n", str(target), mode=0o750)
    assert target.read_bytes() == b"#!/bin/sh\necho new\n"
    assert os.stat(target).st_mode & 0o777 == 0o750
    assert os.stat(target).st_ino != inode  # renamed into place, never rewritten in place
    assert os.listdir(tmp_path) == ["stage.sh"]


@pytest.mark.rig
async def test_forward_port_reaches_remote_loopback_server(sshd_server):
    async def http(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        body = b'{"model": "drafter"}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(http, "127.0.0.1", 0)
    remote_port = server.sockets[0].getsockname()[1]
    host = make_host(sshd_server)
    try:
        async with host.forward_port(remote_port) as local_port:
            assert local_port != remote_port
            async with httpx.AsyncClient(timeout=10) as client:
                for _ in range(2):
                    reply = await client.get(f"http://127.0.0.1:{local_port}/v1/models")
                    assert reply.json() == {"model": "drafter"}
    finally:
        await host.close()
        server.close()


@pytest.mark.rig
async def test_proxy_jump_through_a_verified_jump_host(sshd_server, ssh_host):
    # The rig's sshd serves as its own jump host: the tunnel and the target are both verified.
    host = ssh_host(sshd_server, jump_host=f"{sshd_server.username}@127.0.0.1:{sshd_server.port}")
    assert (await host.run(["echo", "via jump"])).stdout == "via jump\n"
    assert host._tunnel is not None


def _fingerprint_of(pub: str) -> str:
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", pub], capture_output=True,
                         text=True, check=True).stdout
    return out.split()[1]


@pytest.mark.rig
async def test_unknown_host_key_refused_with_fingerprint_then_trusted(sshd_server, tmp_path, ssh_host):
    known = tmp_path / "known_hosts"
    expected = _fingerprint_of(f"{sshd_server.host_key}.pub")
    for content in (None, ""):  # a missing file and an empty one both mean "unknown"
        if content is not None:
            known.write_text(content)
        host = ssh_host(sshd_server, known_hosts=known)
        with pytest.raises(HostKeyError) as info:
            await host.run(["true"])
        assert info.value.changed is False and info.value.fingerprint == expected
        assert expected in str(info.value)
    key = await fetch_host_key(sshd_server.host, sshd_server.port)
    assert key.get_fingerprint("sha256") == expected
    line = trust_host_key(known, sshd_server.host, sshd_server.port, key)
    assert line.startswith(f"[127.0.0.1]:{sshd_server.port} ssh-ed25519 ")
    host = ssh_host(sshd_server, known_hosts=known)
    assert (await host.run(["true"])).ok


@pytest.mark.rig
async def test_changed_host_key_refused_loudly(sshd_server, tmp_path, ssh_host):
    other = keys.generate_key(tmp_path / "impostor_key")
    known = tmp_path / "known_hosts"
    known.write_text(keys.known_hosts_line(sshd_server.host, sshd_server.port, other))
    host = ssh_host(sshd_server, known_hosts=known)
    t0 = time.monotonic()
    with pytest.raises(HostKeyError) as info:
        await host.run(["true"])
    assert time.monotonic() - t0 < 5  # refused at once, not retried
    assert info.value.changed is True
    assert info.value.fingerprint == _fingerprint_of(f"{sshd_server.host_key}.pub")
    assert "CHANGED" in str(info.value)


@pytest.mark.rig
async def test_bad_client_key_refused_clearly_and_not_retried(sshd_server, tmp_path, ssh_host):
    stranger = keys.generate_key(tmp_path / "stranger_key")
    host = ssh_host(sshd_server, identity_file=stranger, connect_attempts=6, backoff=(1.0, 5.0))
    t0 = time.monotonic()
    with pytest.raises(AuthenticationFailed) as info:
        await host.run(["true"])
    assert time.monotonic() - t0 < 3  # six attempts with >=1 s backoff would take far longer
    assert str(stranger) in str(info.value) and "refused" in str(info.value)


@pytest.mark.rig
async def test_unreachable_after_bounded_retries():
    port = keys.free_port()
    host = SshHost("127.0.0.1", port=port, known_hosts=os.devnull, connect_attempts=3,
                   backoff=(0.05, 0.2))
    t0 = time.monotonic()
    with pytest.raises(HostUnreachable, match="after 3 attempts"):
        await host.connect()
    assert time.monotonic() - t0 < 5


@pytest.mark.rig
async def test_reconnects_by_itself_after_sshd_restart(fresh_sshd, ssh_host):
    host = ssh_host(fresh_sshd)
    assert (await host.run(["echo", "before"])).stdout == "before\n"
    first = host._conn
    fresh_sshd.kill_all()  # listener and sessions: the host went away
    await asyncio.sleep(0.2)
    fresh_sshd.start()  # same port, same host key
    assert (await host.run(["echo", "after"])).stdout == "after\n"
    assert host._conn is not first


@pytest.mark.rig
async def test_reconnect_waits_out_a_short_outage(fresh_sshd, ssh_host):
    host = ssh_host(fresh_sshd, connect_attempts=8, backoff=(0.2, 1.0))
    await host.connect()
    fresh_sshd.kill_all()
    loop = asyncio.get_running_loop()
    loop.call_later(0.5, fresh_sshd.start)
    assert (await host.run(["echo", "back"])).stdout == "back\n"


@pytest.mark.rig
async def test_stream_ended_by_drop_raises_host_disconnected(fresh_sshd, ssh_host):
    host = ssh_host(fresh_sshd)
    with pytest.raises(HostDisconnected):
        async with aclosing(host.stream(["sh", "-c", "while true; do echo tick; sleep 0.05; done"])) \
                as lines:
            async for line in lines:
                assert line == "tick"
                fresh_sshd.drop_connections()
    assert (await host.run(["echo", "again"])).stdout == "again\n"  # listener still up


@pytest.mark.rig
async def test_run_cut_by_drop_raises_host_disconnected(fresh_sshd, ssh_host):
    host = ssh_host(fresh_sshd)
    await host.connect()
    asyncio.get_running_loop().call_later(0.3, fresh_sshd.drop_connections)
    with pytest.raises(HostDisconnected):
        await host.run(["sleep", "10"])


def test_asyncssh_is_recent_enough():
    # ssh.py relies on SSHClientConnection.is_closed() and get_server_host_key(tunnel=...).
    assert hasattr(asyncssh.SSHClientConnection, "is_closed")


async def test_refused_forward_keeps_the_connection(sshd_server):
    """vLLM binds only when loaded: a refused forwarded port must not drop the SSH connection."""
    import socket

    import httpx

    from console.host.ssh import SshHost
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    host = SshHost(sshd_server.host, port=sshd_server.port, username=sshd_server.username,
                   identity_file=str(sshd_server.identity_file), known_hosts=str(sshd_server.known_hosts))
    try:
        stream = host.stream(["sh", "-c", "echo one; sleep 3; echo two"])
        assert await stream.__anext__() == "one"
        async with host.forward_port(closed_port) as local:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{local}") as client:
                for _ in range(3):
                    try:
                        await client.get("/health", timeout=5)
                    except httpx.HTTPError:
                        pass
        assert await stream.__anext__() == "two"  # the stream survived the refusals
        assert (await host.run(["echo", "ok"])).stdout.strip() == "ok"
        await stream.aclose()
    finally:
        await host.close()


@pytest.fixture
def agent_home(tmp_path, monkeypatch, sshd_server):
    """An operator's environment: a running ssh-agent holding the host's key; the test writes the
    ~/.ssh/config."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    short = Path(tempfile.mkdtemp(prefix="e3a-", dir="/tmp"))  # a socket path stays under 108 bytes
    sock = short / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(sshd_server.identity_file)], env=env, check=True,
                       capture_output=True, timeout=10)
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        yield home, sock
    finally:
        agent.kill()
        agent.wait()
        shutil.rmtree(short, ignore_errors=True)


REMOTE_AGENT = ["sh", "-c", 'echo "${SSH_AUTH_SOCK:-none}"']


@pytest.mark.rig
@pytest.mark.parametrize("with_identity", [False, True])
async def test_the_agent_is_never_forwarded_unless_the_profile_asks(sshd_server, ssh_host, agent_home,
                                                                    with_identity):
    """~/.ssh/config's ForwardAgent is not the console's: the agent's keys never reach the GPU host's root
    unless host.forward_agent says so (then the same setup forwards it, so this test can tell)."""
    home, sock = agent_home
    # `yes` forwards the agent used to log in; a socket path forwards that agent even with an identity file
    (home / ".ssh" / "config").write_text(f"Host *\n    ForwardAgent {sock if with_identity else 'yes'}\n")
    extra = {} if with_identity else {"identity_file": None}  # without one, the agent's key logs in
    host = ssh_host(sshd_server, **extra)
    assert (await host.run(REMOTE_AGENT)).stdout.strip() == "none"
    asking = ssh_host(sshd_server, forward_agent=True, **extra)
    assert (await asking.run(REMOTE_AGENT)).stdout.strip() != "none"


def test_the_profile_key_reaches_the_host():
    from console.host.factory import host_for_profile as factory
    from console.profile import profile_from_dict
    base = {"host": {"name": "gpu-host.example"}, "server": {"model_path": "/m"}, "paths": {"work_dir": "/w"}}
    assert factory(profile_from_dict(base)).forward_agent is False
    base["host"]["forward_agent"] = True
    assert factory(profile_from_dict(base)).forward_agent is True
