"""Build the Host a profile describes."""
from __future__ import annotations

from typing import AsyncIterator, Sequence

from console.profile import Profile
from console.host.base import CommandResult, Host


def env_prefix(work_dir: str) -> list[str]:
    """Prefix for every command on the demo host: its private tmux server, never the operator's $TMUX."""
    return ["env", "-u", "TMUX", f"TMUX_TMPDIR={work_dir}/tmux"]


class PrefixedHost:
    """A Host whose commands all run under a fixed prefix (the demo host's `env TMUX_TMPDIR=...`)."""

    def __init__(self, inner: Host, prefix: Sequence[str]):
        self.inner = inner
        self.prefix = list(prefix)
        self.name = inner.name

    async def connect(self) -> None:
        await self.inner.connect()

    async def close(self) -> None:
        await self.inner.close()

    async def run(self, argv: Sequence[str], **kw) -> CommandResult:
        return await self.inner.run(self.prefix + list(argv), **kw)

    def stream(self, argv: Sequence[str]) -> AsyncIterator[str]:
        return self.inner.stream(self.prefix + list(argv))

    def __getattr__(self, name: str):
        return getattr(self.inner, name)  # read_from, upload, forward_port need no prefix


def host_for_profile(profile: Profile) -> Host:
    h = profile.host
    if h.transport == "local":
        from console.host.local import LocalHost
        host: Host = LocalHost(name=h.name)
        if h.simulated:
            host = PrefixedHost(host, env_prefix(profile.paths.work_dir))
        return host
    from console.host.ssh import SshHost
    return SshHost(h.name, port=h.port, username=h.user, identity_file=h.identity_file,
                   known_hosts=h.known_hosts, jump_host=h.jump_host, name=h.name, forward_agent=h.forward_agent)
