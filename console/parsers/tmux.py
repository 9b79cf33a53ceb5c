"""tmux session state (for hosts without systemd) in the same ServiceInfo shape systemd gives.

The session's panes are started with remain-on-exit, so a finished command leaves a dead pane whose
exit status says whether it failed; a missing session means it was never started or was killed.
"""
from __future__ import annotations

from dataclasses import dataclass

from console.snapshot import ServiceInfo

PANE_FORMAT = "#{pane_pid} #{pane_dead} #{pane_dead_status}"
# The pane's wrapper (console/control/units.py) records the program's exit status in a file; the probe
# prints it after the panes as `e3-exit-status N`, for when tmux's pane_dead_status is empty.
EXIT_STATUS_PREFIX = "e3-exit-status"


def has_session_argv(session: str) -> list[str]:
    # "=NAME" matches the name exactly; a bare name would also match a longer session by prefix
    return ["tmux", "has-session", "-t", f"={session}"]


def list_panes_argv(session: str) -> list[str]:
    return ["tmux", "list-panes", "-s", "-t", f"={session}:", "-F", PANE_FORMAT]


@dataclass(frozen=True)
class PaneState:
    pid: int | None
    dead: bool
    exit_status: int | None  # only for dead panes; None when killed by a signal or unknown


@dataclass(frozen=True)
class TmuxStatus:
    service: ServiceInfo
    exit_status: int | None = None
    note: str | None = None


def parse_pane_line(line: str) -> PaneState | None:
    if not isinstance(line, str):
        return None
    parts = line.split()
    if len(parts) < 2 or parts[1] not in ("0", "1"):
        return None
    try:
        pid = int(parts[0])
    except ValueError:
        return None
    status = None
    if len(parts) >= 3:
        try:
            status = int(parts[2])
        except ValueError:
            status = None
    dead = parts[1] == "1"
    return PaneState(pid=pid if pid > 0 else None, dead=dead, exit_status=status if dead else None)


def parse_recorded_status(text: str) -> int | None:
    """The wrapper's recorded exit status among the probe's lines (None when absent or garbled)."""
    if not isinstance(text, str):
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == EXIT_STATUS_PREFIX and parts[1].isascii() and parts[1].isdigit():
            return int(parts[1])
    return None


def parse_list_panes(text: str) -> list[PaneState]:
    if not isinstance(text, str):
        return []
    return [p for p in (parse_pane_line(line) for line in text.splitlines()) if p is not None]


def _missing(stderr: str) -> bool:
    s = (stderr or "").lower()
    # tmux 3.x says "can't find window" for `list-panes -t =NAME` when other sessions exist
    return any(m in s for m in ("can't find session", "can't find window", "no server running",
                                "error connecting to", "session not found", "no such file or directory"))


def tmux_status(session: str, has_session_rc: int | None, has_session_stderr: str = "",
                panes_text: str | None = None) -> TmuxStatus:
    """Combine `tmux has-session` (exit status, stderr) and `tmux list-panes` output."""
    def info(active: str, sub: str, *, pid: int | None = None, result: str | None = None) -> ServiceInfo:
        return ServiceInfo(manager="tmux", unit=session, active_state=active, sub_state=sub,
                           main_pid=pid, result=result)

    if has_session_rc == 127:
        return TmuxStatus(info("unknown", "unknown"), note="tmux is not installed on the host")
    if has_session_rc is None:
        return TmuxStatus(info("unknown", "unknown"), note="tmux has-session did not finish")
    if has_session_rc != 0:
        if _missing(has_session_stderr) or not (has_session_stderr or "").strip():
            return TmuxStatus(info("inactive", "dead"), note=f"no tmux session {session}")
        first = (has_session_stderr or "").strip().splitlines()[0]
        return TmuxStatus(info("unknown", "unknown"), note=f"tmux has-session failed: {first}")
    panes = parse_list_panes(panes_text or "")
    if not panes:
        # has-session said yes but no pane could be read (raced with exit, or odd output)
        return TmuxStatus(info("active", "unknown"), note="tmux session exists but its panes are unreadable")
    alive = [p for p in panes if not p.dead]
    if alive:
        return TmuxStatus(info("active", "running", pid=alive[0].pid))
    recorded = parse_recorded_status(panes_text or "")
    statuses = [recorded if p.exit_status is None and recorded is not None else p.exit_status for p in panes]
    worst = next((s for s in statuses if s != 0), 0)  # any non-zero (or unknown) pane wins
    if worst == 0:
        return TmuxStatus(info("inactive", "exited", result="success"), exit_status=0)
    if worst is None:
        return TmuxStatus(info("failed", "failed", result="signal"),
                          note="the command ended without an exit status (killed by a signal?)")
    return TmuxStatus(info("failed", "failed", result="exit-code"), exit_status=worst,
                      note=f"the command exited with status {worst}")


def parse_tmux_state(session: str, has_session_rc: int | None, has_session_stderr: str = "",
                     panes_text: str | None = None) -> ServiceInfo:
    return tmux_status(session, has_session_rc, has_session_stderr, panes_text).service
