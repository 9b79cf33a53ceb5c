"""`eagle3-console trust-host`: show an unknown host key's fingerprint and add it only if accepted.

Host-key checking is never switched off; this is the one way a new key enters known_hosts. It connects
the way the console does (through the jump host, if the profile names one), so the key it offers is the
one the console will be shown: the jump host's own key first when that is the unknown one, then the
target's, read through the jump host. A CHANGED key is refused unless `--replace` (which removes the
old entry). Entries are per port, as OpenSSH keeps them.
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from console import exitcodes
from console.commands.server_cmd import load_or_exit
from console.host.base import AuthenticationFailed, HostError, HostKeyError

# at most the jump host and the target; one more round would mean the file is not being read back
MAX_ROUNDS = 3


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trust-host", help="show the host's SSH key fingerprint and add it to known_hosts if you accept")
    p.add_argument("--profile", required=True)
    p.add_argument("--fingerprint", action="append", default=[],
                   help="accept without asking only a key with this SHA256 fingerprint (repeat it for the "
                        "jump host's key)")
    p.add_argument("--replace", action="store_true",
                   help="the host's key CHANGED and its owner confirmed the new one: remove the old entry "
                        "(kept in known_hosts.old) and add the new key")
    p.set_defaults(func=cmd_trust)


def cmd_trust(a: argparse.Namespace) -> int:
    profile = load_or_exit(a.profile)
    h = profile.host
    if h.transport != "ssh":
        print(f"{profile.source}: host.transport is {h.transport!r}: nothing to trust")
        return exitcodes.OK
    return asyncio.run(trust(profile, a.fingerprint, a.replace))


async def trust(profile, fingerprints: list[str], replace: bool) -> int:
    from console.host.ssh import SshHost
    from console.host.known_hosts import KnownHostsError, trust_host_key

    h = profile.host
    known = h.known_hosts or "~/.ssh/known_hosts"
    added = 0
    for _ in range(MAX_ROUNDS):
        host = SshHost(h.name, port=h.port, username=h.user, identity_file=h.identity_file,
                       known_hosts=h.known_hosts, jump_host=h.jump_host, name=h.name, connect_attempts=1)
        try:
            await host.connect()
        except HostKeyError as e:
            key = getattr(e, "key", None)
            port = getattr(e, "port", h.port)
            if key is None:
                print(f"error: {e}", file=sys.stderr)
                return exitcodes.UNREACHABLE
            answer = _accept(e, key, port, known, fingerprints, replace)
            if answer:
                return answer
            try:
                line = trust_host_key(known, e.host, port, key, replace=replace)
            except (KnownHostsError, OSError) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return exitcodes.FAILED
            print(f"{'replaced in' if e.changed else 'added to'} {known}: {line.strip()}")
            added += 1
            if not getattr(e, "jump", False):
                return exitcodes.OK  # the target's key is in: its login is the console's business, not ours
            continue
        except AuthenticationFailed as e:
            if getattr(e, "jump", False):
                print(f"error: the jump host refused the login, so the target's key cannot be read through "
                      f"it: {e}", file=sys.stderr)
                return exitcodes.UNREACHABLE
            # the target's key was verified before its login was refused: the keys are trusted
            print(f"host keys are trusted; note that the login failed: {e}", file=sys.stderr)
            return exitcodes.OK
        except HostError as e:
            print(f"error: {e}", file=sys.stderr)
            return exitcodes.UNREACHABLE
        finally:
            await host.close()
        if not added:
            via = f" (and the jump host {h.jump_host})" if h.jump_host else ""
            print(f"{h.name}:{h.port}{via}: host keys already trusted in {known}")
        return exitcodes.OK
    print(f"error: {known} still does not trust the keys after {MAX_ROUNDS} rounds", file=sys.stderr)
    return exitcodes.FAILED


def _accept(e: HostKeyError, key, port: int, known: str, fingerprints: list[str], replace: bool) -> int:
    """0 when the operator accepts this key, else the exit status (and nothing is written)."""
    fp = e.fingerprint
    role = " (the jump host)" if getattr(e, "jump", False) else ""
    print(f"{e.host}:{port}{role} presents a {key.get_algorithm()} key, fingerprint {fp}")
    if e.changed:
        print(f"WARNING: this is NOT the key {known} holds for {e.host}:{port}: the host key has CHANGED "
              "(the host was reinstalled, or someone is intercepting the connection).", file=sys.stderr)
        if not replace:
            print("error: nothing written; once the host's owner confirms the new key, run trust-host "
                  "again with --replace", file=sys.stderr)
            return exitcodes.FAILED
    if fingerprints:
        if fp not in fingerprints:
            print(f"error: that is not a fingerprint you gave ({', '.join(fingerprints)}); nothing written",
                  file=sys.stderr)
            return exitcodes.FAILED
        return exitcodes.OK
    if not sys.stdin.isatty():
        print("error: not a terminal; compare the fingerprint out of band and pass --fingerprint", file=sys.stderr)
        return exitcodes.USAGE
    verb = "Replace the old key in" if e.changed else "Add it to"
    if input(f"{verb} {known}? [y/N] ").strip().lower() not in ("y", "yes"):
        print("nothing written")
        return exitcodes.FAILED
    return exitcodes.OK
