"""The port watch (console/telemetry/port_watch.py) run for real on this machine: the script the session
starts on the host, against a loopback socket that is bound but not listening (as vLLM's port is while
it loads) and then listens."""
from __future__ import annotations

import os
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


def _ends_when_its_reader_goes(stdout: int, close_reader) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: only the hang-up can end the watch early
        proc = subprocess.Popen(port_watch_argv(sys.executable, s.getsockname()[1], 600), stdout=stdout)
        try:
            time.sleep(0.5)
            assert proc.poll() is None
            close_reader()
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_watch_ends_when_its_pipe_is_closed():
    """LocalHost's reader, or any pipe: the console gone, the watch ends at its next look."""
    reader, writer = os.pipe()
    try:
        _ends_when_its_reader_goes(writer, lambda: os.close(reader))
    finally:
        os.close(writer)


def test_the_watch_ends_when_its_terminal_hangs_up_even_with_sighup_ignored():
    """SshHost runs streams on a PTY: the channel closed, the terminal hangs up. The hang-up signal alone
    did not end a watch on a rig host, so the watch polls for the hang-up itself (SIGHUP ignored here, as a
    process can inherit it)."""
    import signal

    master, slave = os.openpty()
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # inherited by the child through exec
    try:
        _ends_when_its_reader_goes(slave, lambda: os.close(master))
    finally:
        signal.signal(signal.SIGHUP, old)
        os.close(slave)


def test_only_its_own_words_count():
    assert parse_port_watch("listening\r") is True
    assert parse_port_watch("unknown") is False
    assert parse_port_watch("Traceback (most recent call last):") is None
