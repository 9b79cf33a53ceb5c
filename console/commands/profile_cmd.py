"""`eagle3-console profile init|check`."""
from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
from pathlib import Path

from console import exitcodes
from console.control.operator_unit import (OperatorUnitError, profile_drafter_values, profile_server_values,
                                           read_server_program, unit_drift, unit_settings)
from console.control.integrity import Integrity, host_integrity
from console.control.permissions import check_permission
from console.host.base import HostError
from console.host.factory import host_for_profile
from console.parsers.text import clean, clean_block
from console.parsers.vllm_cmdline import CmdlineError
from console.profile import Profile, ProfileError, load_profile, profile_from_dict, write_profile

UNIT_READ_TIMEOUT_S = 60.0
# names that never resolve (example profiles use them): no connection is tried
PLACEHOLDER_DOMAINS = (".example", ".invalid", ".test")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="create or validate a profile (one GPU host, one pipeline)")
    psub = p.add_subparsers(dest="profile_cmd", required=True)

    init = psub.add_parser("init", help="write a new profile with the given settings")
    init.add_argument("path", help="where to write it, e.g. profiles/my-host.toml")
    init.add_argument("--host", required=True, help="the GPU host's name (never an address you do not own)")
    init.add_argument("--user")
    init.add_argument("--port", type=int, default=22)
    init.add_argument("--identity-file")
    init.add_argument("--jump-host")
    init.add_argument("--known-hosts")
    init.add_argument("--transport", choices=("ssh", "local"), default="ssh")
    init.add_argument("--manager", choices=("systemd", "tmux"), default="systemd")
    init.add_argument("--unit", default="vllm", help="systemd unit or tmux session of the vLLM server")
    init.add_argument("--from-unit", metavar="UNIT",
                      help="read the server's settings (model, served id, port, tensor parallel size, reasoning "
                           "parser) from this systemd unit on the host, over SSH; implies --manager systemd")
    init.add_argument("--model-path", help="required unless --from-unit")
    init.add_argument("--served-model-name")
    init.add_argument("--server-port", type=int, default=8000)
    init.add_argument("--reasoning-parser")
    init.add_argument("--work-dir", required=True)
    init.add_argument("--data-dir", default="/data")
    init.add_argument("--python", default="python3")
    init.add_argument("--gpus", type=int, help="number of GPUs on the host")
    init.add_argument("--samples", type=int, default=10000)
    init.add_argument("--concurrency", type=int, default=200)
    init.add_argument("--max-tokens", type=int, default=8192)
    init.add_argument("--request-timeout", type=float, default=1800.0)
    init.add_argument("--dataset")
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.set_defaults(func=cmd_init)

    check = psub.add_parser("check", help="validate a profile; exit 0 when valid")
    check.add_argument("path")
    check.add_argument("--offline", action="store_true",
                       help="only validate the file; do not compare it with its unit on the host")
    check.set_defaults(func=cmd_check)


def build_from_args(a: argparse.Namespace, extra_server: dict | None = None,
                    extra_drafter: dict | None = None) -> Profile:
    data = {
        "host": {"name": a.host, "transport": a.transport, "port": a.port, "user": a.user,
                 "identity_file": a.identity_file, "jump_host": a.jump_host, "known_hosts": a.known_hosts},
        "server": {"manager": a.manager, "unit": a.unit, "model_path": a.model_path,
                   "served_model_name": a.served_model_name, "port": a.server_port,
                   "reasoning_parser": a.reasoning_parser, **(extra_server or {})},
        "paths": {"work_dir": a.work_dir, "data_dir": a.data_dir, "python": a.python},
        "gpus": {"count": a.gpus},
        "drafter": {**(extra_drafter or {})},
        "generate": {"samples": a.samples, "concurrency": a.concurrency, "max_tokens": a.max_tokens,
                     "request_timeout_s": a.request_timeout, "dataset": a.dataset},
    }
    # argparse gives None for options not given: drop them so the schema's defaults apply
    data = {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in data.items()}
    return profile_from_dict(data, file="(command line)")


async def _unit_program(profile: Profile, permission: bool = False):
    host = host_for_profile(profile)
    try:
        await host.connect()
        program = await read_server_program(host, profile)
        user = (await host.run(["id", "-un"], timeout=30)).stdout.strip()
        verdict = await check_permission(host, profile) if permission else None
        return program, user, verdict
    finally:
        await host.close()


def read_unit_settings(profile: Profile, permission: bool = False):
    """The program and settings of the profile's unit, the SSH user's name and (`permission`) whether it may
    manage systemd units (console/control/permissions.py), read over the profile's connection."""
    program, user, verdict = asyncio.run(asyncio.wait_for(_unit_program(profile, permission), UNIT_READ_TIMEOUT_S))
    return program, unit_settings(program), user, verdict


def sudo_for(a: argparse.Namespace, remote_user: str | None) -> dict[str, object]:
    """[server] sudo = true for a user other than root with the systemd manager: systemd-run and
    systemctl start/stop need polkit's manage-units, which a non-interactive SSH command cannot answer
    for a non-root user (console/control/permissions.py). The user: the one the host said it is, else
    --user, else this machine's (what SSH logs in as when none is given)."""
    if a.manager != "systemd":
        return {}
    user = remote_user or a.user or getpass.getuser()
    return {"sudo": True} if user != "root" else {}


def from_unit(a: argparse.Namespace) -> Profile:
    a.manager = "systemd"
    a.unit = a.from_unit
    a.model_path = a.model_path or "/unknown"  # a placeholder to connect with; the unit's replaces it
    probe = build_from_args(a)
    program, settings, user, _ = read_unit_settings(probe)
    values = profile_server_values(settings)
    a.model_path, a.server_port = settings.model, settings.port
    a.served_model_name = values.get("served_model_name")
    a.reasoning_parser = settings.reasoning_parser
    profile = build_from_args(a, extra_server={"vllm_args": values["vllm_args"], **sudo_for(a, user)},
                              extra_drafter=profile_drafter_values(settings))
    # the unit's Id, its model and names are the host's text: escapes and controls never reach the terminal
    print(clean(f"read unit {a.from_unit} ({program.source}): model {settings.model}, served as "
                f"{settings.served_id}, port {settings.port}, tensor parallel size {settings.tensor_parallel_size}"
                + (f", reasoning parser {settings.reasoning_parser}" if settings.reasoning_parser else "")
                + (", --trust-remote-code (drafter.trust_remote_code = true)" if settings.trust_remote_code else "")))
    if program.note:
        print(clean_block(f"note: {program.note}"))
    return profile


def cmd_init(a: argparse.Namespace) -> int:
    if Path(a.path).exists() and not a.force:  # before any connection: never replace an operator's file
        print(f"error: {a.path} already exists; pass --force to replace it", file=sys.stderr)
        return exitcodes.USAGE
    try:
        if a.from_unit:
            profile = from_unit(a)
        elif not a.model_path:
            print("error: --model-path is required (or --from-unit UNIT to read it from the host)", file=sys.stderr)
            return exitcodes.USAGE
        else:
            profile = build_from_args(a, extra_server=sudo_for(a, None))
        write_profile(profile, a.path, overwrite=a.force)
    except ProfileError as e:  # it quotes what it refused: with --from-unit, the host's text
        print(clean_block(f"error: {e}"), file=sys.stderr)
        return exitcodes.USAGE
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return exitcodes.USAGE
    except (HostError, OSError, OperatorUnitError, CmdlineError, asyncio.TimeoutError) as e:
        print(clean_block(f"error: unit {a.from_unit}: {e or 'timed out'}"), file=sys.stderr)
        return exitcodes.USAGE
    print(f"wrote {a.path}")
    return exitcodes.OK


def cmd_check(a: argparse.Namespace) -> int:
    try:
        p = load_profile(a.path)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return exitcodes.USAGE
    sim = " (simulated demo host)" if p.host.simulated else ""
    print(f"{a.path}: ok: host {p.host.name}{sim}, {p.server.manager} {p.server.unit!r}, "
          f"model {p.server.model_id}, work dir {p.paths.work_dir}")
    if a.offline:
        return exitcodes.OK
    placeholder = p.host.transport == "ssh" and p.host.name.lower().rstrip(".").endswith(PLACEHOLDER_DOMAINS)
    if p.server.manager != "systemd" or p.host.simulated:  # tmux: the profile's command is the server
        return exitcodes.OK if placeholder else print_integrity(p)
    if placeholder:
        print(f"unit {p.server.unit}: not compared, {p.host.name} is a placeholder name (RFC 2606/6761): "
              f"set [host].name to the GPU host")
        return exitcodes.OK
    try:
        program, settings, _, verdict = read_unit_settings(p, permission=True)
    except (HostError, OSError, asyncio.TimeoutError) as e:
        print(clean_block(f"unit {p.server.unit}: not compared, the host did not answer: {e or 'timed out'}"))
        return exitcodes.OK
    except (OperatorUnitError, CmdlineError) as e:
        print(clean_block(f"error: unit {p.server.unit}: {e}"), file=sys.stderr)
        return exitcodes.FAILED
    drift = unit_drift(p, settings)
    if program.note:
        print(clean_block(f"note: {program.note}"))
    denied = verdict is not None and not verdict.ok
    if verdict is not None:
        print(clean_block(f"{'error: ' if denied else ''}permission: {verdict.message}"),
              file=sys.stderr if denied else sys.stdout)
    integrity = print_integrity(p)
    if not drift:
        print(clean(f"unit {p.server.unit}: matches the profile (served as {settings.served_id})"))
        return exitcodes.FAILED if denied else integrity
    print(f"unit {p.server.unit}: drift between the profile and its unit:")
    for line in drift:
        print(clean_block(f"  {line}"))
    return exitcodes.FAILED


async def _integrity(profile: Profile) -> Integrity:
    host = host_for_profile(profile)
    try:
        await host.connect()
        return await host_integrity(host, profile)
    finally:
        await host.close()


def print_integrity(profile: Profile) -> int:
    """The host's integrity (console/control/integrity.py): each warning on stdout, a leftover server on the
    port as an error (exit 1); a host that does not answer is said, not failed."""
    try:
        got = asyncio.run(asyncio.wait_for(_integrity(profile), UNIT_READ_TIMEOUT_S))
    except (HostError, OSError, asyncio.TimeoutError) as e:
        got = Integrity(note=str(e) or "timed out")
    if got.note:
        print(clean_block(f"host integrity: not checked: {got.note}"))
        return exitcodes.OK
    for line in got.warnings:
        print(clean_block(f"warning: host integrity: {line}"))
    for line in got.refusals:
        print(clean_block(f"error: host integrity: {line}"), file=sys.stderr)
    if not got.warnings and not got.refusals:
        print("host integrity: one vLLM install, the driver fits torch's CUDA build, no leftover server on the port")
    return exitcodes.FAILED if got.refusals else exitcodes.OK

