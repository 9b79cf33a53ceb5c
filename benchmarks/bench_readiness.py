"""Readiness latency: from the moment the vLLM stand-in listens to the moment `status --watch` says ready.

    python benchmarks/bench_readiness.py [--trials 20] [--interval 0.5] [--load-seconds 1]

One `eagle3-console status --watch` process (as an operator would run it) watches a local demo profile
(tmux manager) for all trials. Each trial starts the stand-in, a thread notes when its port first
accepts a connection (a 2 ms connect loop: vLLM binds at once but listens only when loaded), and the
watch's JSON line with phase `ready` is timestamped as it is read. The session does not wait for its
next tick: the server's `Application startup complete.` (the journal stream under systemd, a `tail -F`
of the log under tmux) makes it ask /health and /v1/models at once. Target: median <= 0.25 s (polling
alone: about half the interval; the seed's `sleep 300` took up to 300 s).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console import demo  # noqa: E402
from console.commands.server_cmd import server_action  # noqa: E402


def first_listen(port: int, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.05):
                out.append(time.monotonic())
                return
        except OSError:
            time.sleep(0.002)


class Watch:
    """`status --watch` as a subprocess; each JSON line with the monotonic time it was read."""

    def __init__(self, profile: str, interval: float):
        self.proc = subprocess.Popen([sys.executable, "-m", "console.cli", "status", "--profile", profile,
                                      "--watch", "--interval", str(interval)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        self.lines: list[tuple[float, dict]] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append((time.monotonic(), json.loads(line)))
                self.changed.notify_all()

    def wait_phase(self, phases: tuple[str, ...], after: int, timeout: float) -> tuple[float, dict] | None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while time.monotonic() < deadline:
                for t, doc in self.lines[after:]:
                    if doc["server"]["phase"] in phases:
                        return t, doc
                self.changed.wait(0.1)
        return None

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--interval", type=float, default=0.5, help="status --watch --interval (its default)")
    ap.add_argument("--load-seconds", type=float, default=1.0)
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="e3-bench-ready-"))
    profile = demo.prepare(work, speed=demo.BASE_LOAD_SECONDS / a.load_seconds)
    watch = Watch(profile.source, a.interval)
    latencies: list[float] = []
    try:
        watch.wait_phase(("stopped",), 0, 30)
        for trial in range(a.trials):
            seen = len(watch.lines)
            stop, listened = threading.Event(), []
            poller = threading.Thread(target=first_listen, args=(profile.server.port, stop, listened))
            poller.start()
            rc, _, out = asyncio.run(server_action(profile, "start-server"))
            if rc:
                print(f"start failed: {out}", file=sys.stderr)
                return 1
            ready = watch.wait_phase(("ready", "failed"), seen, 60)
            stop.set()
            poller.join()
            if ready is None or ready[1]["server"]["phase"] != "ready" or not listened:
                print(f"trial {trial}: no ready (watch said {ready and ready[1]['server']})", file=sys.stderr)
                return 1
            latencies.append(ready[0] - listened[0])
            seen = len(watch.lines)
            asyncio.run(server_action(profile, "stop-server"))
            watch.wait_phase(("stopped",), seen, 30)
    finally:
        watch.close()
        asyncio.run(demo.stop(work))
    ms = sorted(x * 1000 for x in latencies)
    print(f"readiness latency over {len(ms)} trials (listen -> `status --watch` ready, interval {a.interval:g} s)")
    print(f"  median {statistics.median(ms):.0f} ms   max {ms[-1]:.0f} ms   min {ms[0]:.0f} ms")
    print(f"  all: {' '.join(f'{x:.0f}' for x in ms)}")
    ok = statistics.median(ms) <= 250
    print(f"  target median <= 250 ms: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
