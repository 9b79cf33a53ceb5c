"""`eagle3-console`: the app (default) and the headless commands scripts rely on."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from console.commands import demo_cmd, profile_cmd, run_cmd, runs_cmd, server_cmd, trust_cmd
from console.version import package_version


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3-console", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument("--profile", help="profile TOML of the GPU host to open")
    parser.add_argument("--demo", action="store_true", help="start a local SIMULATED GPU host and open it")
    parser.add_argument("--demo-speed", type=float, default=1.0,
                        help="demo only: >1 makes the simulated load faster (default 1: a ~20 s load)")
    parser.add_argument("--demo-dir", type=Path, default=None,
                        help="demo only: the demo host's work dir (default: under the user cache dir)")
    demo_cmd.add_engine_option(parser, "--engine", "--demo-engine")
    parser.add_argument("--readonly", action="store_true", help="no action that changes the host")
    parser.add_argument("--keymap", help="TOML file remapping keys")
    sub = parser.add_subparsers(dest="command")
    profile_cmd.add_parser(sub)
    server_cmd.add_parsers(sub)
    demo_cmd.add_parser(sub)
    run_cmd.add_parser(sub)
    runs_cmd.add_parser(sub)
    trust_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None):
        return args.func(args)
    from console.commands.app_cmd import run_app
    return run_app(args)


if __name__ == "__main__":
    sys.exit(main())
