"""Watch the server's port on the host itself: one remote command that says `listening` the moment the
port listens, so the session asks HTTP at once instead of when the journal brings the ready line.

Why not the journal alone: vLLM writes `Starting vLLM server on`, its routes and uvicorn's startup lines
within milliseconds of listening, and journald hands new entries to a follower at most every 250 ms
(journald-server.c, POST_CHANGE_TIMER_INTERVAL_USEC), later still on a busy host. Measured in the systemd
rig (benchmarks/bench_readiness.py, restarts of one unit): the API lines reached `journalctl -f` 300-350 ms
after the port listened in 3 of 20 restarts. The asks those lines start then come too late, and the only
fast restarts were those where an ask left over from the previous run's own late lines was still going.

The watch reads /proc/net/tcp{,6} (the same LISTEN test as the probe's, console/telemetry/probe.py) every
20 ms with the host's python: no connection to the port (a refused connect through the forward costs a
channel and a line in sshd's log each time), no process per poll. It ends on its own after `max_s`, and
as soon as nobody reads what it would say: its output (the SSH channel's terminal, or a pipe) hung up. A
console that quit or lost the link during a load whose server never listened left one polling 50 times a
second for the whole `max_s` on a rig host (a loaded CI run: 244 CPU-s over 16 minutes, its SIGHUP never
seen); the wait between looks is a poll of stdout for that hang-up.
"""
from __future__ import annotations

WATCH_GAP_S = 0.02
WATCH_MAX_S = 3 * 3600.0  # longer than any load; the session starts another for the unit's next run

# argv[1]: the port, argv[2]: seconds to watch, argv[3]: seconds between looks. Prints `listening`, `timeout` or `unknown` (no /proc/net).
_SCRIPT = """\
import select, sys, time
port, end, gap = "%04X" % int(sys.argv[1]), time.monotonic() + float(sys.argv[2]), float(sys.argv[3])
def listening():
    seen = False
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                seen = True
                for row in f:
                    c = row.split()
                    if len(c) > 3 and c[3] == "0A" and c[1].rpartition(":")[2] == port:
                        return True
        except OSError:
            pass
    return None if not seen else False
out = select.poll()
out.register(sys.stdout.fileno(), 0)  # no events asked: only a hang-up or an error is reported
while time.monotonic() < end:
    state = listening()
    if state is None:
        print("unknown", flush=True)
        sys.exit(0)
    if state:
        print("listening", flush=True)
        sys.exit(0)
    if out.poll(gap * 1000):
        sys.exit(0)  # the reader is gone
print("timeout", flush=True)
"""


def port_watch_argv(python: str, port: int, max_s: float = WATCH_MAX_S) -> list[str]:
    """The remote command: one line, `listening` once `port` listens (at once if it already does)."""
    return [python, "-c", _SCRIPT, str(int(port)), f"{max_s:g}", f"{WATCH_GAP_S:g}"]


def parse_port_watch(line: str) -> bool | None:
    """A line of the watch: True = the port listens, False = the watch gave up, None = not its word."""
    word = line.strip()
    return True if word == "listening" else False if word in ("timeout", "unknown") else None
