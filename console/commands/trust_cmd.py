"""`eagle3-console trust-host`: show an unknown host key's fingerprint and add it only if accepted.

Host-key checking is never switched off; this is the one way a new key enters known_hosts.
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from console.commands.server_cmd import load_or_exit
from console.host.base import HostError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trust-host", help="show the host's SSH key fingerprint and add it to known_hosts if you accept")
    p.add_argument("--profile", required=True)
    p.add_argument("--fingerprint", help="accept without asking only if the key has this SHA256 fingerprint")
    p.set_defaults(func=cmd_trust)


def cmd_trust(a: argparse.Namespace) -> int:
    from console.host.ssh import fetch_host_key, fingerprint, trust_host_key
    profile = load_or_exit(a.profile)
    h = profile.host
    if h.transport != "ssh":
        print(f"{profile.source}: host.transport is {h.transport!r}: nothing to trust")
        return 0
    known = h.known_hosts or "~/.ssh/known_hosts"
    try:
        key = asyncio.run(fetch_host_key(h.name, h.port))
    except HostError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    fp = fingerprint(key)
    print(f"{h.name}:{h.port} presents a {key.get_algorithm()} key, fingerprint {fp}")
    if a.fingerprint:
        if a.fingerprint != fp:
            print(f"error: that is not the fingerprint you gave ({a.fingerprint}); nothing written", file=sys.stderr)
            return 1
    else:
        if not sys.stdin.isatty():
            print("error: not a terminal; compare the fingerprint out of band and pass --fingerprint", file=sys.stderr)
            return 2
        if input(f"Add it to {known}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing written")
            return 1
    line = trust_host_key(known, h.name, h.port, key)
    print(f"added to {known}: {line.strip()}")
    return 0
