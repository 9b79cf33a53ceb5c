"""The port watch (console/telemetry/port_watch.py) run for real on this machine: the script the session
starts on the host, against a loopback socket that is bound but not listening (as vLLM's port is while
it loads) and then listens."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

from console.telemetry.port_watch import parse_port_watch, port_watch_argv


def test_says_listening_once_the_bound_port_listens_and_not_before():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        proc = subprocess.Popen(port_watch_argv(sys.executable, port, 30), stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(0.3)
            assert proc.poll() is None  # bound, not listening: nothing said yet
            s.listen()
            assert proc.stdout is not None
            assert parse_port_watch(proc.stdout.readline()) is True
            assert proc.wait(timeout=10) == 0
        finally:
            proc.kill()
            proc.wait()


def test_a_port_already_listening_is_said_at_once_and_the_watch_ends_on_its_own():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        res = subprocess.run(port_watch_argv(sys.executable, s.getsockname()[1], 30), capture_output=True,
                             text=True, timeout=10)
        assert parse_port_watch(res.stdout) is True
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # never listens: the watch gives up after its time
        res = subprocess.run(port_watch_argv(sys.executable, s.getsockname()[1], 0.2), capture_output=True,
                             text=True, timeout=10)
        assert parse_port_watch(res.stdout) is False and res.stdout.strip() == "timeout"


def test_only_its_own_words_count():
    assert parse_port_watch("listening\r") is True
    assert parse_port_watch("unknown") is False
    assert parse_port_watch("Traceback (most recent call last):") is None
