"""A link that can be cut so packets vanish (no RST, no ICMP): the console in a network namespace of its
own, talking to the rig over a veth pair whose host end is set down and up again.

The host end listens on a link-local address and relays to the rig's sshd on loopback. With the veth
down, segments from the namespace are dropped at the link and TCP retransmits, exactly as on a
blackholed WAN link; set up again, the same connection recovers.
"""
from __future__ import annotations

import asyncio
import random
import subprocess
import uuid

from .rootfs import RigUnavailable


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


class Blackhole:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        tag = uuid.uuid4().hex[:6]
        self.netns = f"e3bh-{tag}"
        self.outer, self.inner = f"e3h{tag}", f"e3n{tag}"
        octet = random.randint(1, 250)  # link-local 169.254.X.0/30: neither private nor public
        self.host_addr, self.ns_addr = f"169.254.{octet}.1", f"169.254.{octet}.2"
        self.port = 0
        self._server: asyncio.base_events.Server | None = None

    def __enter__(self) -> "Blackhole":
        steps = [("netns", "add", self.netns),
                 ("link", "add", self.outer, "type", "veth", "peer", "name", self.inner),
                 ("link", "set", self.inner, "netns", self.netns),
                 ("addr", "add", f"{self.host_addr}/30", "dev", self.outer),
                 ("link", "set", self.outer, "up"),
                 ("-n", self.netns, "addr", "add", f"{self.ns_addr}/30", "dev", self.inner),
                 ("-n", self.netns, "link", "set", self.inner, "up"),
                 ("-n", self.netns, "link", "set", "lo", "up")]
        for step in steps:
            res = _ip(*step)
            if res.returncode != 0:
                self.__exit__()
                raise RigUnavailable(f"cannot build the blackhole link (`ip {' '.join(step)}`: "
                                     f"{res.stderr.strip()}); needs root and iproute2")
        return self

    async def relay(self) -> int:
        """Listen on the host end of the link and relay each connection to the rig's sshd."""
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)

            async def pump(src, dst):
                try:
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                except (ConnectionError, OSError):
                    pass
                finally:
                    dst.close()

            await asyncio.gather(pump(reader, up_w), pump(up_r, writer))

        self._server = await asyncio.start_server(handle, self.host_addr, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def cut(self) -> None:
        assert _ip("link", "set", self.outer, "down").returncode == 0

    def mend(self) -> None:
        assert _ip("link", "set", self.outer, "up").returncode == 0

    def inside(self, argv: list[str]) -> list[str]:
        """argv run inside the namespace (where the console runs)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.close()
        _ip("link", "del", self.outer)
        _ip("netns", "del", self.netns)
