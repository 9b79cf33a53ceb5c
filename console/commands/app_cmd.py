"""`eagle3-console --profile P` / `--demo`: the interactive console."""
from __future__ import annotations

import argparse
import asyncio
import sys

from console import exitcodes
from console import demo
from console.commands.server_cmd import load_or_exit
from console.profile import ProfileError, notify_settings


def run_app(a: argparse.Namespace) -> int:
    from console.ui.app import ConsoleApp
    from console.ui.keys import KeymapError
    from console.session import Session

    work_dir = None
    if a.demo:
        work_dir = a.demo_dir or demo.default_dir()
        print(f"starting the SIMULATED demo host in {work_dir} ...", file=sys.stderr)
        try:
            profile = asyncio.run(demo.start(work_dir, speed=a.demo_speed, engine=a.engine))
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return exitcodes.FAILED
    elif a.profile:
        profile = load_or_exit(a.profile)
    else:
        print("error: give --profile FILE (see `eagle3-console profile init --help`) or --demo", file=sys.stderr)
        return exitcodes.USAGE
    try:
        notify = notify_settings(profile)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        if work_dir is not None:
            asyncio.run(demo.stop(work_dir))
        return exitcodes.USAGE
    controller = Session(profile, readonly=a.readonly)
    try:
        try:
            app = ConsoleApp(controller, readonly=a.readonly, keymap_path=a.keymap, notify=notify)
        except KeymapError as e:
            print(f"error: {e}", file=sys.stderr)
            return exitcodes.USAGE
        app.run()
        # Textual catches a crash inside the app, prints its traceback and sets the return code (1):
        # a script that started the console must see it failed
        code = app.return_code or exitcodes.OK
    finally:
        if work_dir is not None:
            # the demo host is ours: quitting the demo ends it, after the app has let go of the terminal
            # (a stage's graceful stop can take longer than the app's own shutdown may wait)
            print("stopping the SIMULATED demo host ...", file=sys.stderr)
            stopped = asyncio.run(demo.stop(work_dir))
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}", file=sys.stderr)
    return code
