"""A stage program that another program runs and waits for (the chain's stages, benchpair's benches), with
the parent's stop forwarded to it.

The parent's stop handler (backend/kit/lifecycle.py, on_stop) calls `forward`. A stop that lands while
the child is being started (after the parent said what runs next, before the process exists) is kept and
sent as soon as the process is there: without that the parent waits for the child to end by itself."""
from __future__ import annotations

import signal
import subprocess
from typing import Any


class Child:
    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.stop_signal: str | None = None  # the stop asked for (a signal's name), for a child started after it

    def forward(self, name: str) -> None:
        self.stop_signal = name
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(getattr(signal, name))

    def run(self, argv: list[str], **popen: Any) -> int:
        """Start `argv` and wait for it; its exit status (negative: the signal that ended it). OSError when
        it cannot start."""
        self.proc = subprocess.Popen(argv, **popen)
        try:
            if self.stop_signal is not None:
                self.forward(self.stop_signal)
            return self.proc.wait()
        finally:
            self.proc = None
