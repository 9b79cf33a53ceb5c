"""Idle cost of the console under a steady live load: prints CPU % of one core and RSS growth.

Load: 8 GPUs, a snapshot a second with generation and training advancing, the journal at 10 lines/s,
all from the fake controller, the app headless. Targets (issue 5): CPU <= 3 % of one core over 60 s;
RSS growth <= 5 MB over 10 minutes (`--seconds 600`).

    python3 benchmarks/bench_console_idle.py [--seconds 60] [--gpus 8] [--journal-rate 10]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the fake controller lives in harness/

from console.ui.app import ConsoleApp  # noqa: E402
from harness.fake_controller import FakeController, demo_snapshot  # noqa: E402


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def measure(seconds: float, gpus: int, journal_rate: float, warmup: float) -> dict[str, float]:
    controller = FakeController(generator=lambda i: demo_snapshot(i, n_gpus=gpus), journal_rate=journal_rate,
                                simulated=True, host_name="bench")
    app = ConsoleApp(controller)
    async with app.run_test(headless=True, size=(160, 50)):
        await asyncio.sleep(warmup)  # first layout, first snapshot, journal attached
        cpu0, wall0, rss0 = time.process_time(), time.monotonic(), rss_bytes()
        lines0 = app.query_one("#journal").shown
        await asyncio.sleep(seconds)
        cpu1, wall1, rss1 = time.process_time(), time.monotonic(), rss_bytes()
        lines = app.query_one("#journal").shown - lines0
    wall = wall1 - wall0
    return {"wall_s": wall, "cpu_s": cpu1 - cpu0, "cpu_pct": 100.0 * (cpu1 - cpu0) / wall,
            "rss_start_mb": rss0 / 2**20, "rss_end_mb": rss1 / 2**20, "rss_growth_mb": (rss1 - rss0) / 2**20,
            "journal_lines": lines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured interval (600 for the memory check)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--journal-rate", type=float, default=10.0, help="journal lines per second")
    parser.add_argument("--warmup", type=float, default=3.0)
    args = parser.parse_args()
    r = asyncio.run(measure(args.seconds, args.gpus, args.journal_rate, args.warmup))
    print(f"console idle over {r['wall_s']:.1f} s ({args.gpus} GPUs, journal {args.journal_rate:g} lines/s, "
          f"{r['journal_lines']} lines shown)")
    print(f"  CPU: {r['cpu_s']:.2f} s = {r['cpu_pct']:.2f} % of one core   (target <= 3 %)")
    print(f"  RSS: {r['rss_start_mb']:.1f} MB -> {r['rss_end_mb']:.1f} MB, growth {r['rss_growth_mb']:+.2f} MB"
          f"   (target <= 5 MB over 600 s)")


if __name__ == "__main__":
    main()
