"""Host-key trust as OpenSSH keeps it: `trust-host` on real known_hosts files, through a jump host, a
changed key only with --replace, per-port entries, and a missing file that is not an "unknown key"."""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import subprocess
import sys
from pathlib import Path

import asyncssh
import pytest
import tomli_w

from console.host.base import HostKeyError, HostUnreachable
from console.host.known_hosts import KnownHostsError, known_keys, trust_host_key
from console.host.ssh import SshHost
from harness.rig import keys
from harness.sim_support import PYTHON

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


def write_profile(tmp_path: Path, *, name: str, port: int, user: str, identity: Path, known: Path,
                  jump_host: str | None = None) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    host = {"name": name, "port": port, "user": user, "identity_file": str(identity), "known_hosts": str(known)}
    if jump_host:
        host["jump_host"] = jump_host
    data = {
        "host": host,
        "server": {"manager": "tmux", "unit": "e3t-trust", "model_path": "/m", "served_model_name": "kimi-sim",
                   "port": 1},
        "paths": {"work_dir": str(work), "python": sys.executable},
        "gpus": {"command": [*PYTHON, "-m", "sim.nvidia_smi", "--state", str(work / "none.json"),
                             "--query-gpu=index,name,memory.used,memory.total,utilization.gpu,temperature.gpu,"
                             "power.draw", "--format=csv,noheader,nounits"]},
    }
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def fingerprint_of(pub: Path | str) -> str:
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], capture_output=True,
                         text=True, check=True).stdout
    return out.split()[1]


def sshd_profile(tmp_path: Path, sshd, known: Path) -> Path:
    return write_profile(tmp_path, name=sshd.host, port=sshd.port, user=sshd.username,
                         identity=sshd.identity_file, known=known)


def pub_line(pattern: str, key: asyncssh.SSHKey) -> str:
    return f"{pattern} {key.export_public_key('openssh').decode().split()[0]} " \
           f"{key.export_public_key('openssh').decode().split()[1]}\n"


def hashed(host: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, host.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


# -- known_hosts edits (no server needed) ----------------------------------------------------------------

def test_changed_key_refused_unless_replace_which_removes_only_that_host(tmp_path):
    old, new, other = (asyncssh.generate_private_key("ssh-ed25519") for _ in range(3))
    known = tmp_path / "known_hosts"
    original = ("# my hosts\n"
                + pub_line("gpu.example", old)
                + pub_line(f"{hashed('[gpu.example]:2222')}", old)
                + pub_line("gpu.example,203.0.113.9", old)
                + pub_line("other.example", other)
                + "@cert-authority *.example " + pub_line("", other).strip() + "\n"
                + "not a key line at all")
    known.write_text(original)
    known.chmod(0o600)
    with pytest.raises(KnownHostsError, match="CHANGED.*--replace"):
        trust_host_key(known, "gpu.example", 22, new)
    with pytest.raises(KnownHostsError):
        trust_host_key(known, "gpu.example", 2222, new)
    assert known.read_text() == original  # nothing written

    trust_host_key(known, "gpu.example", 22, new, replace=True)
    assert (tmp_path / "known_hosts.old").read_text() == original  # as ssh-keygen -R keeps it
    trust_host_key(known, "gpu.example", 2222, new, replace=True)
    text = known.read_text()
    assert [k.public_data for k in known_keys(known, "gpu.example", 22)] == [new.public_data]
    assert [k.public_data for k in known_keys(known, "gpu.example", 2222)] == [new.public_data]
    assert [k.public_data for k in known_keys(known, "203.0.113.9", 22)] == [old.public_data]  # other name kept
    assert [k.public_data for k in known_keys(known, "other.example", 22)] == [other.public_data]
    assert "# my hosts" in text and "@cert-authority" in text and "not a key line at all" in text
    assert known.stat().st_mode & 0o777 == 0o600
    before = known.read_text()
    trust_host_key(known, "gpu.example", 22, new)  # already trusted: not added twice
    assert known.read_text() == before


def test_replace_refuses_a_wildcard_entry(tmp_path):
    old, new = (asyncssh.generate_private_key("ssh-ed25519") for _ in range(2))
    known = tmp_path / "known_hosts"
    known.write_text(pub_line("*.example", old))
    with pytest.raises(KnownHostsError, match="line 1.*covers other hosts"):
        trust_host_key(known, "gpu.example", 22, new, replace=True)
    assert known.read_text() == pub_line("*.example", old)


def test_a_port_22_entry_is_not_an_entry_for_another_port(tmp_path):
    key = asyncssh.generate_private_key("ssh-ed25519")
    known = tmp_path / "known_hosts"
    known.write_text(pub_line("gpu.example", key))
    assert known_keys(known, "gpu.example", 22) and not known_keys(known, "gpu.example", 2222)
    assert known_keys(tmp_path / "missing", "gpu.example", 22) == []


# -- against a real sshd -------------------------------------------------------------------------------

@pytest.mark.rig
def test_trust_host_on_a_non_empty_known_hosts(tmp_path, sshd_server):
    """Almost every operator's known_hosts has lines already: trust-host crashed on them (EBADF)."""
    known = tmp_path / "known_hosts"
    other = asyncssh.generate_private_key("ssh-ed25519")
    existing = pub_line("other.example", other) + "# last line without a newline"
    known.write_text(existing)
    profile = sshd_profile(tmp_path, sshd_server, known)
    fp = fingerprint_of(f"{sshd_server.host_key}.pub")
    res = cli("trust-host", "--profile", str(profile), "--fingerprint", fp)
    assert res.returncode == 0, res.stdout + res.stderr
    text = known.read_text()
    assert text.startswith(existing + "\n")
    assert f"[{sshd_server.host}]:{sshd_server.port} ssh-ed25519 " in text
    again = cli("trust-host", "--profile", str(profile))
    assert again.returncode == 0 and "already trusted" in again.stdout
    assert known.read_text() == text
    # the keys are trusted: status reads the target through the jump host. Two SSH handshakes can outlast the
    # snapshot's 5 s answer window on a loaded machine (a CI-like run: "not answering", exit 3), so a few tries
    for _ in range(4):
        st = cli("status", "--profile", str(profile), "--json")
        if st.returncode != 3:
            break
    assert st.returncode == 0, st.stdout + st.stderr


@pytest.mark.rig
def test_trust_host_refuses_a_changed_key_until_replace(tmp_path, sshd_server):
    impostor = keys.generate_key(tmp_path / "impostor_key")
    known = tmp_path / "known_hosts"
    original = keys.known_hosts_line(sshd_server.host, sshd_server.port, impostor)
    known.write_text(original)
    profile = sshd_profile(tmp_path, sshd_server, known)
    fp = fingerprint_of(f"{sshd_server.host_key}.pub")
    refused = cli("trust-host", "--profile", str(profile), "--fingerprint", fp)
    assert refused.returncode == 1 and "CHANGED" in refused.stderr and "--replace" in refused.stderr
    assert known.read_text() == original
    replaced = cli("trust-host", "--profile", str(profile), "--fingerprint", fp, "--replace")
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert keys.public_key_text(impostor) not in known.read_text()
    assert keys.public_key_text(sshd_server.host_key) in known.read_text()
    assert cli("status", "--profile", str(profile), "--json").returncode == 0


@pytest.mark.rig
async def test_a_key_trusted_for_port_22_is_refused_on_another_port(tmp_path, sshd_server):
    """OpenSSH looks up `[host]:port` only; asyncssh would fall back to the port-less entry."""
    known = tmp_path / "known_hosts"
    known.write_text(keys.known_hosts_line(sshd_server.host, 22, sshd_server.host_key))
    host = SshHost(sshd_server.host, port=sshd_server.port, username=sshd_server.username,
                   identity_file=sshd_server.identity_file, known_hosts=known, connect_attempts=1)
    try:
        with pytest.raises(HostKeyError) as info:
            await host.run(["true"])
    finally:
        await host.close()
    assert info.value.changed is False and info.value.fingerprint == fingerprint_of(f"{sshd_server.host_key}.pub")
    assert f"[{sshd_server.host}]:{sshd_server.port} is not in" in str(info.value)


@pytest.mark.rig
async def test_no_known_hosts_file_and_no_host_is_unreachable_not_unknown_key(tmp_path):
    host = SshHost("127.0.0.1", port=keys.free_port(), known_hosts=tmp_path / "no-such-file",
                   connect_attempts=1, connect_timeout=3)
    with pytest.raises(HostUnreachable) as info:
        await host.connect()
    assert "None" not in str(info.value)
    profile = write_profile(tmp_path, name="127.0.0.1", port=keys.free_port(), user="root",
                            identity=tmp_path / "no-key", known=tmp_path / "no-such-file")
    res = cli("trust-host", "--profile", str(profile))
    assert res.returncode == 3 and "cannot" in res.stderr and "None" not in res.stderr + res.stdout


@pytest.mark.rig
def test_trust_host_through_a_jump_host_offers_its_key_first(tmp_path, sshd_server, systemd_rig):
    """The target's name resolves only on the bastion (the booted rig's own /etc/hosts), so its key can
    only be read through the bastion; and the bastion's own key is the first unknown one."""
    name = "e3-behind-bastion"

    def on_rig(*argv: str) -> None:
        subprocess.run(systemd_rig.ssh_argv(*argv), check=True, capture_output=True, timeout=30)

    on_rig("sh", "-c", f"grep -q {name} /etc/hosts || echo '127.0.0.1 {name}' >> /etc/hosts")
    # one identity for both hops, as an operator's profile has
    on_rig("sh", "-c", f"grep -qF '{keys.public_key_text(sshd_server.identity_file)}' /root/.ssh/authorized_keys "
                       f"|| echo '{keys.public_key_text(sshd_server.identity_file)}' >> /root/.ssh/authorized_keys")
    known = tmp_path / "known_hosts"
    known.write_text("")
    jump = f"root@{systemd_rig.host}:{systemd_rig.port}"
    profile = write_profile(tmp_path, name=name, port=sshd_server.port, user=sshd_server.username,
                            identity=sshd_server.identity_file, known=known, jump_host=jump)
    rig_fp = fingerprint_of(systemd_rig.workdir / "rig_host_key.pub")
    target_fp = fingerprint_of(f"{sshd_server.host_key}.pub")

    only_target = cli("trust-host", "--profile", str(profile), "--fingerprint", target_fp)
    assert only_target.returncode == 1 and rig_fp in only_target.stdout and "jump host" in only_target.stdout
    assert known.read_text() == ""  # the bastion's key was not the one given: nothing written

    res = cli("trust-host", "--profile", str(profile), "--fingerprint", rig_fp, "--fingerprint", target_fp)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.index(rig_fp) < res.stdout.index(target_fp)
    text = known.read_text()
    assert f"[{systemd_rig.host}]:{systemd_rig.port} " in text and f"[{name}]:{sshd_server.port} " in text
    # the keys are trusted: status reads the target through the jump host. Two SSH handshakes can outlast the
    # snapshot's 5 s answer window on a loaded machine (a CI-like run: "not answering", exit 3), so a few tries
    for _ in range(4):
        st = cli("status", "--profile", str(profile), "--json")
        if st.returncode != 3:
            break
    assert st.returncode == 0, st.stdout + st.stderr

    # a jump host that refuses the login cannot vouch for the target's key: said so, not "trusted"
    stranger = keys.generate_key(tmp_path / "stranger_key")
    (tmp_path / "other").mkdir()
    refused = write_profile(tmp_path / "other", name=name, port=sshd_server.port, user=sshd_server.username,
                            identity=stranger, known=tmp_path / "other" / "known_hosts", jump_host=jump)
    (tmp_path / "other" / "known_hosts").write_text(keys.known_hosts_line(systemd_rig.host, systemd_rig.port,
                                                                          systemd_rig.workdir / "rig_host_key"))
    res = cli("trust-host", "--profile", str(refused))
    assert res.returncode == 3 and "jump host refused" in res.stderr, res.stdout + res.stderr
