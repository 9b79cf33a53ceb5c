"""Build the Host a profile describes."""
from __future__ import annotations

from backend.profile import Profile
from console.host.base import Host


def host_for_profile(profile: Profile) -> Host:
    h = profile.host
    if h.transport == "local":
        from console.host.local import LocalHost
        return LocalHost(name=h.name)
    from console.host.ssh import SshHost
    return SshHost(h.name, port=h.port, username=h.user, identity_file=h.identity_file,
                   known_hosts=h.known_hosts, jump_host=h.jump_host, name=h.name)
