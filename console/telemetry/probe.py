"""One remote command per refresh: service state, GPU table, run directories, new event bytes.

Opening an SSH channel per metric costs a round trip each and hits sshd's session cap; instead every
tick runs ONE `sh -c SCRIPT` whose sections are separated by a per-probe random marker, and the pieces
are handed to the pure parsers. The script is assembled from argv lists with shlex.join, so profile
values never meet the shell unquoted.
"""
from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass, field
from typing import Sequence

from console.naming import exit_status_path, server_log_path, tmux_target
from console.parsers.systemd import SYSTEMCTL_SHOW_PROPS
from console.parsers.tmux import EXIT_STATUS_PREFIX, PANE_FORMAT
from console.profile import Profile

SERVER_LOG_READ_MAX = 256 * 1024


@dataclass(frozen=True)
class EventsRead:
    run_dir: str
    offset: int
    limit: int


@dataclass(frozen=True)
class Section:
    text: str  # decoded with surrogateescape: `data` gives the exact bytes back
    rc: int | None

    @property
    def data(self) -> bytes:
        return self.text.encode("utf-8", "surrogateescape")


@dataclass
class ProbePlan:
    """What one probe asks for, so the answer can be matched up."""
    marker: str
    sections: list[str] = field(default_factory=list)


def service_argv(profile: Profile, unit: str | None = None, log_path: str | None = None) -> list[list[str]]:
    """The state of a server's unit (default the baseline's; the drafter server's with its unit and log)."""
    unit = unit or profile.server.unit
    if profile.server.manager == "systemd":
        return [["systemctl", "show", unit, "-p", ",".join(SYSTEMCTL_SHOW_PROPS)]]
    # `=NAME` makes tmux match the session name exactly rather than by prefix; then the exit status
    # the pane's wrapper recorded (tmux's own can be empty), keeping list-panes' status as the section's
    script = ('tmux list-panes -t "$1" -F "$2"; rc=$?; '
              'if [ -r "$3" ]; then printf "%s %s\\n" "$4" "$(head -c 16 -- "$3")"; fi; exit $rc')
    return [["sh", "-c", script, "sh", tmux_target(unit), PANE_FORMAT,
             exit_status_path(log_path or server_log_path(profile)), EXIT_STATUS_PREFIX]]


def _read_bytes(path: str, offset: int, limit: int, *, identity: bool = False) -> str:
    """Up to `limit` bytes of `path` from `offset`; with `identity`, first a line `INODE SIZE` so a file
    replaced (log rotation) or cut short (copytruncate) is noticed."""
    tail = shlex.join(["tail", "-c", f"+{offset + 1}", path])
    read = f"{tail} 2>/dev/null | {shlex.join(['head', '-c', str(limit)])}"
    if identity:
        stat = shlex.join(["stat", "-L", "-c", "%i %s", path])
        read = f"{{ {stat} 2>/dev/null || echo '0 0'; }}; {read}"
    return read


def listen_check(port: int) -> str:
    """Shell that prints `listening`, `closed` or `unknown` for a TCP port on the host.

    Asked in the probe so HTTP is tried only once vLLM listens: while it loads, its port is bound but
    not listening, and a forwarded connection to it is refused by the remote side, which costs a
    channel (and, on some transports, the whole connection) every tick for nothing."""
    # /proc/net/tcp{,6} rows: `N: LOCALADDR:PORT REMADDR:PORT STATE ...`, port in hex, 0A = LISTEN
    pattern = f"^ *[0-9]+: [0-9A-Fa-f]+:{port:04X} [0-9A-Fa-f]+:0000 0A "
    return (f"if [ ! -r /proc/net/tcp ]; then echo unknown; "
            f"elif grep -qE {shlex.quote(pattern)} /proc/net/tcp /proc/net/tcp6 2>/dev/null; "
            f"then echo listening; else echo closed; fi")


def parse_listen(text: str) -> bool | None:
    word = text.strip()
    return True if word == "listening" else False if word == "closed" else None


def build_probe(profile: Profile, *, events: Sequence[EventsRead] = (), stage_units: Sequence[str] = (),
                server_log: tuple[str, int] | None = None, listen_port: int | None = None,
                gpus: bool = True, marker: str | None = None, server: tuple[str, str] | None = None,
                other_server: tuple[str, str] | None = None) -> tuple[list[str], ProbePlan]:
    """Return (argv, plan). `events` asks for new bytes of each run's events.jsonl from an offset;
    `listen_port` asks whether that port listens (section `listen`). `server`: (unit, tmux log) of the
    server followed (default the baseline); `other_server`: the other one, whose state is section
    `other_service` (the console follows whichever of the two runs)."""
    marker = marker or f"@@E3PROBE-{secrets.token_hex(6)}"
    plan = ProbePlan(marker=marker)
    parts: list[str] = []

    def section(name: str, commands: list[list[str]], *, pipe: str | None = None) -> None:
        plan.sections.append(name)
        cmd = " ; ".join(shlex.join(c) for c in commands)
        if pipe:
            cmd = f"{cmd} | {pipe}"
        # rc is the status of the section's last command; stderr is folded in so errors are visible
        parts.append(f"echo {shlex.quote(marker + ' ' + name)}; {{ {cmd} ; }} 2>&1; echo {shlex.quote(marker)} rc=$?")

    section("service", service_argv(profile, *(server or ())))
    if other_server is not None:
        section("other_service", service_argv(profile, *other_server))
    if gpus:  # off when the console reads NVML itself (it runs on the GPU host)
        section("gpus", [list(profile.gpus.command)])
    runs_dir = f"{profile.paths.work_dir}/runs"
    section("runs", [["find", runs_dir, "-mindepth", "2", "-maxdepth", "2", "-name", "events.jsonl",
                      "-printf", "%s %T@ %h\\n"]])
    section("disk", [["df", "-Pk", profile.paths.work_dir]])
    if stage_units:
        if profile.server.manager == "systemd":
            section("stage_units", [["systemctl", "show", *stage_units, "-p", "Id,ActiveState,SubState,Result"]])
        else:
            section("stage_units", [["tmux", "list-panes", "-a", "-F", "#{session_name} #{pane_dead}"]])
    if listen_port is not None:
        plan.sections.append("listen")
        parts.append(f"echo {shlex.quote(marker + ' listen')}; {listen_check(listen_port)}; "
                     f"echo {shlex.quote(marker)} rc=$?")
    reads = [(f"events:{i}", f"{ev.run_dir}/events.jsonl", ev.offset, ev.limit, False)
             for i, ev in enumerate(events)]
    if server_log is not None:
        reads.append(("server_log", server_log[0], server_log[1], SERVER_LOG_READ_MAX, True))
    for name, path, offset, limit, identity in reads:
        plan.sections.append(name)
        # the extra `echo` ends a line-less read so the marker always starts a line
        parts.append(f"echo {shlex.quote(marker + ' ' + name)}; {_read_bytes(path, offset, limit, identity=identity)}; "
                     f"echo; echo {shlex.quote(marker)} rc=$?")
    return ["sh", "-c", "\n".join(parts)], plan


def split_sections(stdout: str, plan: ProbePlan) -> dict[str, Section]:
    """Cut the probe's output into its sections (pure; tolerant of missing or truncated output)."""
    out: dict[str, Section] = {}
    current: str | None = None
    buf: list[str] = []
    for line in stdout.split("\n"):
        if line.startswith(plan.marker):
            rest = line[len(plan.marker):].strip()
            if rest.startswith("rc="):
                if current is not None:
                    # byte reads got an extra `echo`: its newline is the one split() consumed here
                    text = "\n".join(buf)
                    try:
                        rc = int(rest[3:])
                    except ValueError:
                        rc = None
                    out[current] = Section(text=text, rc=rc)
                current, buf = None, []
            else:
                current, buf = rest, []
        elif current is not None:
            buf.append(line)
    if current is not None:  # the output was cut short: keep what came, rc unknown
        out[current] = Section(text="\n".join(buf), rc=None)
    return out


@dataclass(frozen=True)
class RunFile:
    run_dir: str
    run_id: str
    size: int
    mtime: float


def parse_runs_listing(text: str) -> list[RunFile]:
    runs = []
    for line in text.splitlines():
        bits = line.split(" ", 2)
        if len(bits) != 3:
            continue
        try:
            size, mtime = int(bits[0]), float(bits[1])
        except ValueError:
            continue
        run_dir = bits[2].rstrip("/")
        runs.append(RunFile(run_dir=run_dir, run_id=run_dir.rsplit("/", 1)[-1], size=size, mtime=mtime))
    return sorted(runs, key=lambda r: r.mtime)


def parse_df(text: str) -> int | None:
    """Free bytes from `df -Pk PATH` (None if unreadable)."""
    lines = [l for l in text.splitlines() if l.strip()]
    if len(lines) < 2:
        return None
    cols = lines[-1].split()
    try:
        return int(cols[3]) * 1024
    except (IndexError, ValueError):
        return None
