"""`eagle3-console profile init|check`."""
from __future__ import annotations

import argparse
import sys

from console.profile import Profile, ProfileError, load_profile, profile_from_dict, write_profile


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
    init.add_argument("--model-path", required=True)
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
    check.set_defaults(func=cmd_check)


def build_from_args(a: argparse.Namespace) -> Profile:
    data = {
        "host": {"name": a.host, "transport": a.transport, "port": a.port, "user": a.user,
                 "identity_file": a.identity_file, "jump_host": a.jump_host, "known_hosts": a.known_hosts},
        "server": {"manager": a.manager, "unit": a.unit, "model_path": a.model_path,
                   "served_model_name": a.served_model_name, "port": a.server_port,
                   "reasoning_parser": a.reasoning_parser},
        "paths": {"work_dir": a.work_dir, "data_dir": a.data_dir, "python": a.python},
        "gpus": {"count": a.gpus},
        "generate": {"samples": a.samples, "concurrency": a.concurrency, "max_tokens": a.max_tokens,
                     "request_timeout_s": a.request_timeout, "dataset": a.dataset},
    }
    # argparse gives None for options not given: drop them so the schema's defaults apply
    data = {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in data.items()}
    return profile_from_dict(data, file="(command line)")


def cmd_init(a: argparse.Namespace) -> int:
    try:
        profile = build_from_args(a)
        write_profile(profile, a.path, overwrite=a.force)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.path}")
    return 0


def cmd_check(a: argparse.Namespace) -> int:
    try:
        p = load_profile(a.path)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sim = " (simulated demo host)" if p.host.simulated else ""
    print(f"{a.path}: ok: host {p.host.name}{sim}, {p.server.manager} {p.server.unit!r}, "
          f"model {p.server.model_id}, work dir {p.paths.work_dir}")
    return 0

