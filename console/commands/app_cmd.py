"""`eagle3-console --profile P` / `--demo`: the interactive console."""
from __future__ import annotations

import argparse
import asyncio
import sys

from console import demo
from console.commands.server_cmd import load_or_exit


def run_app(a: argparse.Namespace) -> int:
    from console.app import ConsoleApp
    from console.keys import KeymapError
    from console.live import LiveController

    on_close = None
    if a.demo:
        work_dir = demo.default_dir()
        print(f"starting the SIMULATED demo host in {work_dir} ...", file=sys.stderr)
        try:
            profile = asyncio.run(demo.start(work_dir, speed=a.demo_speed))
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1

        async def on_close() -> None:  # the demo host is ours: quitting the demo ends it
            await demo.stop(work_dir)
    elif a.profile:
        profile = load_or_exit(a.profile)
    else:
        print("error: give --profile FILE (see `eagle3-console profile init --help`) or --demo", file=sys.stderr)
        return 2
    controller = LiveController(profile, readonly=a.readonly, on_close=on_close)
    try:
        app = ConsoleApp(controller, readonly=a.readonly, keymap_path=a.keymap)
    except KeymapError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    app.run()
    return 0
