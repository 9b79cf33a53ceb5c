"""ProxyJump specs: `[user@]host[:port]`, IPv6 as `[addr]:port`."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class JumpHost:
    host: str
    port: int = 22
    username: str | None = None


def parse_jump_host(spec: str) -> JumpHost:
    """Parse `[user@]host[:port]` (IPv6 as `[addr]:port`), the ProxyJump form."""
    text = spec.strip()
    if not text:
        raise ValueError("jump host is empty")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise ValueError(f"jump host {spec!r}: spaces or control characters inside")
    user: str | None = None
    if "@" in text:
        user, text = text.rsplit("@", 1)
        if not user:
            raise ValueError(f"jump host {spec!r}: empty user name before '@'")
    port = 22
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError(f"jump host {spec!r}: missing ']' after IPv6 address")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"jump host {spec!r}: expected ':port' after ']'")
            port = _parse_port(rest[1:], spec)
    elif text.count(":") == 1:
        host, port_text = text.split(":")
        port = _parse_port(port_text, spec)
    else:
        host = text  # a bare IPv6 address has several ':' and no port
    if not host:
        raise ValueError(f"jump host {spec!r}: no host name")
    return JumpHost(host, port, user)


def _parse_port(text: str, spec: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 0 < int(text) < 65536:
        raise ValueError(f"jump host {spec!r}: port {text!r} is not a number in 1..65535")
    return int(text)
