"""`eagle3-console demo-host start|stop|status`: the SIMULATED demo host, headless."""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from console import exitcodes
from console.commands.server_cmd import human, snapshot_once
from console.demo import ENGINES, INSTALL_SCRIPT, default_dir, effective_profile, running, start, stop
from console.profile import load_profile


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo-host", help="run the SIMULATED demo host headless (scripts, tests, benchmarks)")
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument("--dir", type=Path, default=None, help=f"demo work dir (default {default_dir()})")
    p.add_argument("--speed", type=float, default=1.0, help=">1 loads faster (default: a ~20 s load)")
    p.add_argument("--seed-shape", action="store_true",
                   help="shaped like the seed host: the server holds all eight simulated GPUs and training asks "
                        "for one of them ([train] gpus = 1; it still computes on the CPU)")
    p.add_argument("--gpu-release-delay", type=float, default=0.0, metavar="S",
                   help="the simulated GPUs keep a stopped server's memory S seconds after it exits, as a driver "
                        "slow to release a large server's memory (the server switch waits for it)")
    add_engine_option(p, "--engine")
    p.add_argument("--vllm-version", help="the vLLM release the stand-in imitates (default 0.33.0): its /version, "
                                          "log lines and errors, e.g. 0.24.0 to see a version refused")
    p.set_defaults(func=cmd_demo_host)


def add_engine_option(p: argparse.ArgumentParser, *flags: str) -> None:
    p.add_argument(*flags, dest="engine", choices=ENGINES, default="stand-in",
                   help="the demo's vLLM server: the stand-in (default; starts in seconds) or vLLM's own CPU build "
                        f"serving the tiny verifier (install it once with `sh {INSTALL_SCRIPT}`); the GPUs are "
                        "simulated either way")


def cmd_demo_host(a: argparse.Namespace) -> int:
    work_dir = a.dir or default_dir()
    if a.action == "start":
        existing = asyncio.run(running(work_dir))
        if existing is not None:
            print(f"a demo host is already running in {work_dir}: reusing its profile (start options ignored)",
                  file=sys.stderr)
            print(existing.source)
            return exitcodes.OK
        try:
            profile = asyncio.run(start(work_dir, speed=a.speed, seed_shape=a.seed_shape, engine=a.engine,
                                        vllm_version=a.vllm_version, gpu_release_s=max(0.0, a.gpu_release_delay)))
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return exitcodes.FAILED
        print(profile.source)
        return exitcodes.OK
    if a.action == "stop":
        stopped = asyncio.run(stop(work_dir))
        print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
        return exitcodes.OK
    path = effective_profile(work_dir)
    if not path.exists():
        print(f"no demo host in {work_dir} (start one with `eagle3-console demo-host start`)")
        return exitcodes.NO_DEMO
    print(human(asyncio.run(snapshot_once(load_profile(path)))))
    return exitcodes.OK
